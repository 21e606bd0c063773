"""Tokenization stages: learn a `tokenizer` (word-level vocabulary, BPE or WordPiece) on the train
split and encode the corpus into a `tokenized_corpus` (one row of ids per sentence)."""

from __future__ import annotations

import polars as pl
from lexiflow.models import text, vocab
from lexiflow.models.checks import held_out_coverage
from lexiflow.models.config import from_section
from lexiflow.models.errors import InputError
from lexiflow.models.ingest import sources as ingest
from lexiflow.models.tokenizers import BPE, WordPiece
from lexiflow.storage import ArtifactRef, ArtifactStore, ArtifactWriter
from lexiflow.storage.formats import (
    SHARDED_ROW_GROUP,
    TOKENS,
    VOCAB,
    corpus_sources,
    read_manifest,
    read_table,
)
from lexiflow.storage.pieces import record_uses
from lexiflow.tasks.parallel import (
    reduce_shards,
    shard_ranges,
    stream_shards,
)
from lexiflow.tasks.params import ParallelParams, TokenizerParams, VocabularyParams
from lexiflow.tasks.pieces import ENCODED, WORD_COUNTS, RunPieces, log_reuse, run_aligned
from lexiflow.tasks.shards import (
    add_keyed_word_counts,
    add_word_counts,
    count_words_pieces,
    count_words_shard,
    encode_pieces,
    encode_shard,
)
from lexiflow.tasks.stage import stage

SUBWORD = {"bpe": BPE, "wordpiece": WordPiece}


def train_sentences(corpus: ArtifactRef) -> pl.DataFrame:
    return vocab.sentences(read_table(corpus, "documents.parquet").filter(pl.col("split") == "train"))


def require_train_split(corpus: ArtifactRef) -> None:
    """Fail before learning a tokenizer from nothing (every later stage would fail less clearly)."""
    metrics = read_manifest(corpus)["metrics"]
    per_split = {split: metrics.get(f"documents_{split}", 0) for split in ingest.SPLITS}
    if not per_split["train"]:
        raise ingest.no_train_split(f"corpus {corpus.version}", per_split)


@stage("tokenizer")
def learn_vocabulary(out: ArtifactWriter, corpus: ArtifactRef, params: VocabularyParams,
                     parallel: ParallelParams | None = None) -> None:
    """Word-level: count words on the train split only, so held-out text can have unknown words.
    Shards of documents are counted apart and their counts added."""
    require_train_split(corpus)
    parallel = parallel or ParallelParams()
    ranges = shard_ranges(corpus, "documents.parquet", parallel)
    calls = [{"corpus": corpus, "start": a, "stop": b} for a, b in ranges]
    store, version = getattr(out, "store_url", None), getattr(out, "version", None)
    if parallel.pieces and store is not None:  # counted run by run of documents, the runs seen before reused
        pieces = RunPieces(store, out.code_version, WORD_COUNTS)
        calls = [{"corpus": corpus, "start": a, "stop": b, "pieces": pieces} for a, b in run_aligned(corpus, ranges)]
        counts, n_words, keys, made = reduce_shards(count_words_pieces, calls,
                                                    add_keyed_word_counts, parallel, "tokenizer", out)
        log_reuse("tokenizer", len(keys) - made, len(keys), "runs of documents' word counts")
        if version is not None:
            record_uses(ArtifactStore(store), "tokenizer", version, {WORD_COUNTS: keys})
    else:
        counts, n_words = reduce_shards(count_words_shard, calls, add_word_counts, parallel, "tokenizer", out)
    vocabulary = vocab.Vocabulary.from_counts(counts, params.min_count, params.max_size)
    if len(vocabulary) <= len(vocab.SPECIALS):  # an empty vocabulary is no artifact: nothing could use it
        raise InputError(f"no word occurs {params.min_count} times or more (vocabulary.min_count) in the train "
                         f"split of {corpus_sources(corpus)} ({n_words} words): give more text, "
                         "or lower vocabulary.min_count")
    out.write_parquet("vocab.parquet", vocabulary.frame, VOCAB)
    out.write_json("config.json", {"kind": "word", "special_tokens": list(vocab.SPECIALS),
                                   "pattern": text.WORD_PATTERN, "params": params.model_dump()})
    out.metrics.update({"kind": "word", "vocabulary_size": len(vocabulary),
                        "train_tokens": n_words, "covered_tokens": int(vocabulary.counts.sum())})


@stage("tokenizer")
def learn_subword(out: ArtifactWriter, corpus: ArtifactRef, params: TokenizerParams) -> None:
    """BPE or WordPiece trained on the train split's sentences; saved with a HF tokenizer.json."""
    require_train_split(corpus)
    # The corpus's lowercasing travels with the tokenizer: raw text given to `encode` (or to the exported
    # tokenizer.json) is then lowercased as the corpus was.
    lowercase = bool(read_manifest(corpus)["parameters"].get("params", {}).get("lowercase"))
    tokenizer = from_section(SUBWORD[params.kind], params, lowercase=lowercase).fit(train_sentences(corpus)["text"])
    tokenizer.save(out.folder)
    out.metrics.update({"kind": params.kind, "vocabulary_size": len(tokenizer.vocab), "merges": len(tokenizer.merges_)})


@stage("tokenized_corpus")
def encode_corpus(out: ArtifactWriter, corpus: ArtifactRef, tokenizer: ArtifactRef,
                  parallel: ParallelParams | None = None) -> None:
    """One row of ids per sentence; shards of documents are encoded apart, each into its own row groups of
    `tokens.parquet` (on the workers, when they run on a pool), which are appended in order."""
    parallel = parallel or ParallelParams()
    # Cut at runs of documents with pieces or without: the shards decide the row groups, so the same bytes
    ranges = run_aligned(corpus, shard_ranges(corpus, "documents.parquet", parallel))
    calls = [{"corpus": corpus, "tokenizer": tokenizer, "start": a, "stop": b} for a, b in ranges]
    store, version, encode, keys = getattr(out, "store_url", None), getattr(out, "version", None), encode_shard, []
    if parallel.pieces and store is not None and read_manifest(tokenizer)["metrics"].get("kind") == "word":
        # run by run of documents, the runs seen before remapped to this vocabulary (tasks/pieces.py)
        pieces = RunPieces(store, out.code_version, ENCODED)
        encode, calls = encode_pieces, [{**call, "pieces": pieces} for call in calls]
    sentences, unknown, per_split, made = 0, {}, {}, 0
    # Shard by shard, in order, as they finish: their row groups appended while later shards run.
    with out.parquet_parts("tokens.parquet", TOKENS, SHARDED_ROW_GROUP) as write:
        for row_groups, shard_sentences, shard_unknown, shard_tokens, *shard_keys in stream_shards(
                encode, calls, parallel, "tokenized_corpus", out, lazy=True):
            write(row_groups)
            if shard_keys:  # encoded by runs: their keys, and how many runs were encoded here
                keys.extend(shard_keys[0])
                made += shard_keys[1]
            sentences += shard_sentences
            for split, n in shard_tokens.items():
                per_split[split] = per_split.get(split, 0) + n
                unknown[split] = unknown.get(split, 0) + shard_unknown.get(split, 0)
    if encode is encode_pieces:
        log_reuse("tokenized_corpus", len(keys) - made, len(keys), "runs of documents' encodings")
        if version is not None:
            record_uses(ArtifactStore(store), "tokenized_corpus", version, {ENCODED: keys})
    n_tokens = sum(per_split.values())
    out.metrics.update({"sentences": sentences, "tokens": n_tokens,
                        "unk_rate": sum(unknown.values()) / max(n_tokens, 1),
                        "held_out_coverage": held_out_coverage(per_split, unknown),
                        **{f"tokens_{split}": n for split, n in sorted(per_split.items())}})
