"""What runs on a pool's workers: the sharded stages' shard and merge functions (tasks/parallel.py).

A worker imports a task's function by name, so it imports the function's module: these live here, apart from
their stages, because a stage module imports Prefect (`tasks.stage`) and this one does not. A Dask worker's
first task imported ~2.9 s of modules from the stage modules, 1.9 s of it Prefect; from here ~1.0 s
(docs/scaling.md, "Worker start-up"). Nothing here may import Prefect or `tasks.params` (every model: torch,
gensim); tests/test_layers.py checks it in a fresh process. Nor the runners (`tasks.parallel`), which load this
module on the Dask workers they start: shard results go through `tasks.parts`, which both import.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import scipy.sparse as sp
from lexiflow.models import cooccurrence, ingest, tokenizers, vocab
from lexiflow.models.heap import release_freed_memory
from lexiflow.storage import ArtifactRef, ArtifactStore
from lexiflow.storage.formats import (
    DOCUMENTS,
    MATRIX_ROW_GROUP,
    SHARDED_ROW_GROUP,
    TOKENS,
    matrix_schema,
    read_rows,
)
from lexiflow.storage.parquet_concat import Segment
from lexiflow.tasks.parts import deliver, deliver_partitions, deliver_row_groups, row_partitions, sum_matrices
from lexiflow.tasks.pieces import CorpusPieces, RunPieces, vocabulary_ids


def corpus_shard(shard: list[ingest.FileRange | ingest.Streams], options: ingest.IngestOptions, chunk_bytes: int,
                 part: str | None, pieces: CorpusPieces | None = None
                 ) -> tuple[Any, dict[int, int], dict[int, tuple[int, int, str]], Any, Any]:
    """Read and clean one shard of the sources (documents delivered in memory or as a part; a shard
    that streams in several batches, a large compressed file, delivers each batch as a part of its own;
    its distinct words as a part too). As parts, each table's first copies are encoded here as
    `documents.parquet` row groups, which the merge appends as they are when it keeps them all, and the part
    holds the rest of the table without its text (read back from the row groups in the rare other case)."""
    batch = itertools.count()
    encoded: list[Any] = []

    def delivered(docs: pl.DataFrame, name: str = "") -> Any:
        first = ingest.first_in_table(docs["doc_id"]) if options.dedupe else None
        rows = docs if first is None or first.all() else docs.filter(pl.Series(first, dtype=pl.Boolean))
        encoded.append(deliver_row_groups(rows, part, DOCUMENTS, SHARDED_ROW_GROUP, f"{name}rows"))
        return deliver(docs.drop("text"), part, name)  # the texts travel once, encoded: the merge needs the rest

    # In this process the batches stay tables, so the documents come in the same tables as on any runner.
    spill = (lambda docs: docs) if part is None else (lambda docs: delivered(docs, f"{next(batch):05d}"))
    result = ingest.ingest_shard(shard, options, chunk_bytes=chunk_bytes, spill=spill, pieces=pieces)
    if part is None:  # in this process: the merge encodes what it keeps
        documents, row_groups = result.documents, None
    elif isinstance(result.documents, tuple):
        documents, row_groups = result.documents, tuple(encoded)
    else:
        documents = delivered(result.documents)
        row_groups = encoded[0]
    return documents, result.texts, result.errors, deliver(result.words, part, "words"), row_groups


def count_words_shard(corpus: ArtifactRef, start: int, stop: int, part: str | None) -> tuple[Any, int]:
    """Word counts of the train documents among rows [start, stop), and their number of words."""
    documents = read_rows(corpus, "documents.parquet", start, stop).filter(pl.col("split") == "train")
    words = vocab.sentence_tokens(documents)["words"]
    return deliver(vocab.token_counts(words), part), int(words.list.len().sum())


def add_word_counts(results: list[tuple[pl.DataFrame, int]]) -> tuple[pl.DataFrame, int]:
    """Shards' (word counts, number of words) added up (in any order: the vocabulary sorts them)."""
    return vocab.merge_counts([counts for counts, _ in results]), sum(n for _, n in results)


def runs_to_count(corpus: ArtifactRef, start: int, stop: int, pieces: RunPieces
                  ) -> Iterator[tuple[int, pl.DataFrame, str, Any]]:
    """`pieces.runs` of documents [start, stop): (first row in the shard, the run's documents, key, its piece
    or None), the runs without a piece with their documents' text. Only the keys' columns are read for every
    run, the text once, from the first run without a piece to the last (a 1 % append to 300 MB decoded the
    whole corpus's text twice, for the word counts and the encoding, to use 2 runs' worth of it)."""
    runs = list(pieces.runs(read_rows(corpus, "documents.parquet", start, stop, ["doc_id", "split"])))
    missing = [(a, a + rows.height) for a, rows, _, found in runs if found is None]
    if missing:
        first = missing[0][0]
        text = read_rows(corpus, "documents.parquet", start + first, start + missing[-1][1], ["text"])["text"]
    for a, rows, key, found in runs:
        yield a, rows if found is not None else rows.with_columns(text.slice(a - first, rows.height)), key, found


def count_words_pieces(corpus: ArtifactRef, start: int, stop: int, pieces: RunPieces,
                       part: str | None) -> tuple[Any, int, tuple[str, ...], int]:
    """`count_words_shard` run by run of documents (`tasks.pieces.content_cuts`), each run's counts taken from
    the store's pieces when a corpus version before had the same run, else counted and left there; and the
    keys of the runs (the pieces the tokenizer is made of), and how many were counted here. The counts add up
    to the shard's, exactly."""
    results, keys, made = [], [], 0
    for _, rows, key, found in runs_to_count(corpus, start, stop, pieces):
        made += found is None
        if found is None:
            words = vocab.sentence_tokens(rows.filter(pl.col("split") == "train"))["words"]
            counts, n_words = vocab.token_counts(words), int(words.list.len().sum() or 0)
            pieces.put(key, {"counts": counts}, {"words": n_words})
        else:
            counts, n_words = found[0]["counts"], found[1]["words"]
        results.append((counts, n_words))
        keys.append(key)
    counts, n_words = add_word_counts(results) if results else (vocab.token_counts(pl.Series("words", [], pl.List(
        pl.String))), 0)
    return deliver(counts, part), n_words, tuple(keys), made


def add_keyed_word_counts(results: list[tuple[pl.DataFrame, int, tuple[str, ...], int]]
                          ) -> tuple[pl.DataFrame, int, tuple[str, ...], int]:
    """`add_word_counts` of `count_words_pieces` results, their piece keys joined, the runs counted added."""
    counts, n_words = add_word_counts([(counts, n) for counts, n, *_ in results])
    return counts, n_words, tuple(key for *_, keys, _ in results for key in keys), sum(made for *_, made in results)


def encode_shard(corpus: ArtifactRef, tokenizer: ArtifactRef, start: int, stop: int,
                 part: str | None) -> tuple[Segment, int, dict[str, int], dict[str, int]]:
    """The sentences of documents [start, stop), encoded (doc_index counts from the corpus start) into
    `tokens.parquet`'s row groups here, and their counts: sentences, unknown tokens and tokens per split (the
    merge only appends the row groups and adds the counts)."""
    rows = vocab.sentences(read_rows(corpus, "documents.parquet", start, stop), first_doc=start)
    with ArtifactStore(tokenizer.store).local_dir(tokenizer.kind, tokenizer.version) as folder:
        ids = tokenizers.load(folder).encode_batch(rows["text"]).alias("ids")
    table = rows.select("doc_index", "sentence", "split").with_columns(ids)
    return deliver_row_groups(table, part, TOKENS, SHARDED_ROW_GROUP), table.height, *split_counts(table)


def split_counts(table: pl.DataFrame) -> tuple[dict[str, int], dict[str, int]]:
    """Unknown (`<unk>`) tokens and tokens, per split, of encoded sentences."""
    rows = table.group_by("split").agg(pl.col("ids").explode().eq(vocab.UNK_ID).sum().alias("unknown"),
                                       pl.col("ids").list.len().sum().alias("tokens")).rows()
    return {split: int(unknown or 0) for split, unknown, _ in rows}, {split: int(n) for split, _, n in rows}


def encode_pieces(corpus: ArtifactRef, tokenizer: ArtifactRef, start: int, stop: int, pieces: RunPieces,
                  part: str | None) -> tuple[Segment, int, dict[str, int], dict[str, int], tuple[str, ...], int]:
    """`encode_shard` for a word vocabulary, run by run of documents (`tasks.pieces.content_cuts`): each run's
    sentences pre-tokenized into run-local ids over the run's distinct words, taken from the store's pieces when
    a corpus version before had the run, else made and left there; then the run's words looked up in this
    vocabulary and its ids remapped (a new vocabulary costs a lookup of each run's distinct words, not a
    tokenization). The same table as `encode_shard`'s, row for row; and the keys of the runs, and how many were
    encoded here."""
    with ArtifactStore(tokenizer.store).local_dir(tokenizer.kind, tokenizer.version) as folder:
        words = tokenizers.load(folder)
    tables, keys, made = [], [], 0
    for a, rows, key, found in runs_to_count(corpus, start, stop, pieces):
        made += found is None
        if found is None:
            run = vocab.sentence_tokens(rows)
            distinct = run["words"].explode().drop_nulls().unique(maintain_order=True)
            local = run["words"].list.eval(pl.element().cast(pl.Enum(distinct), strict=True).to_physical()
                                           .cast(pl.UInt32))
            sentences = run.select("doc_index", "sentence", "split").with_columns(local.alias("local"))
            pieces.put(key, {"sentences": sentences, "words": distinct.alias("word").to_frame()}, {})
        else:
            sentences, distinct = found[0]["sentences"], found[0]["words"]["word"]
        tables.append(sentences.select(pl.col("doc_index") + (start + a), "sentence", "split",
                                       remap(sentences["local"], vocabulary_ids(words, distinct)).alias("ids")))
        keys.append(key)
    table = pl.concat(tables).rechunk() if tables else pl.from_arrow(TOKENS.empty_table())
    return (deliver_row_groups(table, part, TOKENS, SHARDED_ROW_GROUP), table.height, *split_counts(table),
            tuple(keys), made)


def remap(local: pl.Series, ids: np.ndarray) -> pl.Series:
    """Lists of run-local ids as lists of `ids[local]` (UInt32), the lists' lengths kept."""
    lists = local.to_arrow()
    lists = lists.combine_chunks() if isinstance(lists, pa.ChunkedArray) else lists
    flat = lists.flatten().to_numpy(zero_copy_only=False)
    offsets = np.asarray(lists.offsets)
    mapped = pa.array(ids.astype(np.uint32)[flat.astype(np.int64)], pa.uint32())
    array = type(lists).from_arrays(pa.array(offsets - offsets[0], lists.offsets.type), mapped)
    return pl.from_arrow(array).cast(pl.List(pl.UInt32))


def cooccurrence_shard(tokens: ArtifactRef, start: int, stop: int, keep_prob: np.ndarray, window: int, seed: int,
                       documents: int, partitions: int, part: str | None) -> tuple[Any, Any, int, int, int]:
    """Per-distance pair counts (after subsampling) in `partitions` key-space partitions, term–document
    counts (every token) in document-major rows (`termdoc_pieces`: the corpus has `documents`), of the train
    sentences among [start, stop) (windows never cross a sentence, and a token's subsampling draw depends on
    its sentence number, so sentence ranges add up exactly); then the numbers of tokens (in the vocabulary,
    kept after subsampling, and every train token, <unk> included)."""
    table = read_rows(tokens, "tokens.parquet", start, stop)
    vocab_size = len(keep_prob)
    # held-out sentences keep their row (and number) but no tokens: nothing of them reaches the vectors
    train = (table["split"] == "train").to_numpy()
    ids, offsets = cooccurrence.id_stream(table["ids"], min_id=len(vocab.SPECIALS), sentences=train)
    kept, kept_offsets = cooccurrence.subsample(ids, offsets, keep_prob, seed, first_sentence=start)
    counts = cooccurrence.distance_counts(kept, kept_offsets, vocab_size, window)
    # Documents are runs of sentences: their id ranges come from the sentence offsets (no regrouping).
    doc_index = table["doc_index"].to_numpy()
    doc_starts = np.flatnonzero(np.concatenate(([True], doc_index[1:] != doc_index[:-1]))) if len(doc_index) else []
    first = int(doc_index[0]) if len(doc_index) else 0  # the shard's documents are first.. of 0..documents-1
    termdoc = cooccurrence.term_document_columns(ids, np.append(offsets[doc_starts], offsets[-1]), vocab_size, first)
    corpus_tokens = int(table["ids"].list.len().filter(train).sum() or 0)
    return (deliver_partitions(row_partitions(counts, partitions), part, "pairs"),
            termdoc_pieces(termdoc, part, (vocab_size, documents)), len(ids), len(kept), corpus_tokens)


def termdoc_pieces(columns: pl.DataFrame, part: str | None, shape: tuple[int, int]) -> tuple:
    """A shard's term–document rows (column-major) for `write_matrix_columns`: the rows of its first and last
    documents, which the shards before and after it may share, as tables; those of the documents between,
    which no other shard has, encoded here as `termdoc.parquet` row groups (a `Segment`)."""
    if not columns.height:
        return ()
    col = columns["col"]
    first = int((col == col[0]).sum())  # rows are sorted by column: a prefix and a suffix
    last = int((col == col[-1]).sum()) if col[-1] != col[0] else 0
    middle = columns.slice(first, columns.height - first - last)
    return tuple([deliver(columns.head(first), part, "docs-first")]
                 + ([deliver_row_groups(middle, part, matrix_schema(shape), MATRIX_ROW_GROUP, "docs")]
                    if middle.height else [])
                 + ([deliver(columns.tail(last), part, "docs-last")] if last else []))


def weigh_partition(blocks: list[sp.spmatrix], vocab_size: int, weighting: cooccurrence.Weighting) -> sp.csr_matrix:
    """One key partition's per-distance counts from every shard, added (exact integers), then weighted:
    those rows of F (`cooccurrence.weigh_forward`), a partition's merge on a worker."""
    return cooccurrence.weigh_forward(sum_matrices(blocks), vocab_size, weighting)


def counting_done() -> None:
    """The counting buffers freed, and the memory they and the shards freed given back to the system."""
    cooccurrence.release_scratch()
    release_freed_memory()
