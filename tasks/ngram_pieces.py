"""The n-gram LM's pieces: each run of documents' n-gram counts over its run-local ids (`NGRAMS`), made from the
run's word-level encoding (tasks/pieces.py, `ENCODED`) and summed into a corpus' counts under any vocabulary
(`count_ngrams`; docs/design.md, "Incremental rebuilds")."""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl
from lexiflow.models import tokenizers, vocab
from lexiflow.models.lm.ngram import NgramLM, sentence_arrays
from lexiflow.storage import ArtifactRef, ArtifactStore
from lexiflow.storage.pieces import piece_key, read_uses, record_uses
from lexiflow.tasks.pieces import ENCODED, RunPieces, log_reuse, vocabulary_ids

NGRAMS = "ngrams"  # n-gram counts of a run's train sentences over its run-local ids, remapped to any vocabulary
# Runs' counts summed at once: one group-by per MERGE_RUNS runs (one per run spent 7 s of a 300 MB rebuild),
# memory for that many runs' counts beside the sum
MERGE_RUNS = 16
# Bits a packed n-gram key may use (`count_ngrams`): an n-gram whose ids need more is grouped on its columns
PACKED_BITS = 63


def _run_ngrams(lm: NgramLM, sentences: pl.DataFrame) -> pl.DataFrame:
    """The counted n-grams of a run's train sentences (`ENCODED`'s table), over its local ids shifted above the
    special ids (the boundaries `<s>`, `</s>` keep theirs): columns w1..wn (UInt32) and count."""
    columns = [f"w{i}" for i in range(1, lm.order + 1)]
    local = sentences.filter(pl.col("split") == "train")["local"]
    if not len(local):
        return pl.DataFrame(schema={**dict.fromkeys(columns, pl.UInt32), "count": pl.Int64})
    rows = lm.ngram_rows([ids + len(vocab.SPECIALS) for ids in sentence_arrays(local)])
    return (pl.DataFrame(rows, schema=columns, orient="row").group_by(columns).len("count").sort(columns)
            .select(pl.col(columns).cast(pl.UInt32), pl.col("count").cast(pl.Int64)))


def count_ngrams(out: Any, tokens: ArtifactRef, tokenizer: ArtifactRef,
                 lm: NgramLM) -> tuple[np.ndarray, np.ndarray] | None:
    """The counted n-grams of the train sentences of `tokens` (`NgramLM.fit_counts`'s rows and counts), run by run
    of documents, when `tokens` was encoded from runs (`ENCODED`: a word tokenizer, pieces on; else None: fit the
    sentences). A run's n-grams are counted over its local ids and kept as a piece (with the run's words), keyed by
    the run, the order and the stage's code version: a later corpus holding the run takes them, under any
    vocabulary, and maps them to its ids (a word outside it becomes <unk>, whose n-grams they join: a sum still).
    Summed MERGE_RUNS runs at a time: no more than that many runs' counts beside the sum."""
    store, version = getattr(out, "store_url", None), getattr(out, "version", None)
    runs = (read_uses(ArtifactStore(store), "tokenized_corpus", tokens.version) or {}).get(ENCODED) if store else None
    if not runs:
        return None
    # the encoded runs are read by the keys the record names: no salt of theirs is needed here
    encoded, counted = RunPieces(store, "", ENCODED), RunPieces(store, out.code_version, NGRAMS)
    keys = [piece_key(out.code_version, [run, lm.order]) for run in runs]
    if version is not None:
        record_uses(ArtifactStore(store), "lm", version, {NGRAMS: keys})
    with ArtifactStore(tokenizer.store).local_dir(tokenizer.kind, tokenizer.version) as folder:
        words = tokenizers.load(folder)
    columns = [f"w{i}" for i in range(1, lm.order + 1)]
    # An n-gram's ids packed into one integer where they fit 63 bits: one column to group on, not `order` of them
    bits = max(1, (max(lm.vocab_size or 0, len(words)) - 1).bit_length())
    group = ["key"] if bits * lm.order <= PACKED_BITS else columns
    total, batch, recounted = None, [], 0
    for i, (run, key) in enumerate(zip(runs, keys, strict=True)):
        found = counted.get(key)
        recounted += found is None
        if found is None:
            made = encoded.get(run)
            if made is None:  # the run's encoding is gone from the store (copied without .pieces): count it all
                return None
            found = {"counts": _run_ngrams(lm, made[0]["sentences"]), "words": made[0]["words"]}, {}
            counted.put(key, *found)
        table, distinct = found[0]["counts"], found[0]["words"]["word"]
        ids = np.concatenate([np.arange(len(vocab.SPECIALS)), vocabulary_ids(words, distinct)]).astype(np.uint64)
        mapped = [ids[table[c].to_numpy()] for c in columns]
        if group == columns:
            batch.append(pl.DataFrame({c: m.astype(np.uint32) for c, m in zip(columns, mapped, strict=True)}
                                      | {"count": table["count"]}))
        else:
            packed = mapped[0]
            for m in mapped[1:]:
                packed = (packed << np.uint64(bits)) | m
            batch.append(pl.DataFrame({"key": packed, "count": table["count"]}))
        if len(batch) == MERGE_RUNS or i == len(runs) - 1:
            total = pl.concat(batch if total is None else [total, *batch]).group_by(group).agg(pl.col("count").sum())
            batch = []
    log_reuse("lm", len(runs) - recounted, len(runs), "runs of documents' n-gram counts")
    if group == columns:
        return np.stack([total[c].to_numpy() for c in columns], axis=1), total["count"].to_numpy()
    key, mask = total["key"].to_numpy(), np.uint64((1 << bits) - 1)
    rows = np.stack([(key >> np.uint64(bits * (lm.order - 1 - k))) & mask for k in range(lm.order)], axis=1)
    return rows.astype(np.int64), total["count"].to_numpy()
