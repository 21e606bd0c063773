"""Count-based stages: `cooccurrence` (word–word and term–document counts) and `ppmi`."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl
import scipy.sparse as sp
from lexiflow.models import cooccurrence, lsi, ppmi, vocab
from lexiflow.models.errors import InputError
from lexiflow.models.heap import release_freed_memory
from lexiflow.storage import ArtifactRef, ArtifactWriter
from lexiflow.storage.formats import (
    MATRIX_ROW_GROUP,
    VOCAB,
    corpus_sources,
    matrix_schema,
    read_matrix,
    read_rows,
    read_table,
    write_matrix,
    write_matrix_columns,
)
from lexiflow.tasks.parallel import (
    deliver,
    deliver_partitions,
    deliver_row_groups,
    join_rows,
    on_every_worker,
    reduce_partitioned,
    row_partitions,
    shard_ranges,
    sum_matrices,
)
from lexiflow.tasks.stage import stage

if TYPE_CHECKING:  # params imports every model (torch, gensim): not on a worker's import path (parallel.py)
    from lexiflow.tasks.params import CooccurrenceParams, ParallelParams, PPMIParams


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


def _counting_done() -> None:
    """The counting buffers freed, and the memory they and the shards freed given back to the system."""
    cooccurrence.release_scratch()
    release_freed_memory()


@stage("cooccurrence")
def count_cooccurrence(out: ArtifactWriter, tokens: ArtifactRef, tokenizer: ArtifactRef,
                       params: CooccurrenceParams, parallel: ParallelParams | None = None) -> None:
    """Counts over the train split only, as the vocabulary: embeddings built on these counts may
    initialise a language model (`neural.pretrained`), whose held-out perplexity must not have seen
    the held-out text. Special tokens, <unk> included, are dropped before windowing, then frequent
    words are subsampled (`params.subsample`; the term–document matrix counts every train token).
    Shards of sentences are counted apart; their exact per-distance counts add and are weighted per key
    partition on the workers; here the partitions join and the matrix is symmetrized. The shards'
    term–document rows stream into `termdoc.parquet` in document order (no merge: a document is in one
    shard, or two when a shard boundary cuts it, whose counts add)."""
    from lexiflow.tasks.params import COOCCURRENCE_SHARD_SENTENCES, ParallelParams  # here: see the TYPE_CHECKING import

    parallel = parallel or ParallelParams()
    vocabulary = read_table(tokenizer, "vocab.parquet")
    ranges = shard_ranges(tokens, "tokens.parquet", parallel, COOCCURRENCE_SHARD_SENTENCES)
    n_rows = ranges[-1][1]
    # documents are consecutive runs of sentences: their number is the last one's index + 1, known before
    # the shards, so their term–document rows stream into the file while later shards still run
    n_docs = int(read_rows(tokens, "tokens.parquet", n_rows - 1, n_rows)["doc_index"][0]) + 1 if n_rows else 0
    word_counts = vocabulary["count"].to_numpy().astype(np.float64)
    word_counts[: len(vocab.SPECIALS)] = 0  # specials never reach a window
    keep_prob = cooccurrence.keep_probabilities(word_counts, params.subsample)
    calls = [{"tokens": tokens, "start": a, "stop": b, "keep_prob": keep_prob, "window": params.window,
              "seed": params.seed, "documents": n_docs} for a, b in ranges]
    merge = partial(weigh_partition, vocab_size=vocabulary.height, weighting=params.weighting)

    def write_termdoc(rests: Iterator[tuple]) -> list[tuple[int, int, int]]:
        """The shards' term–document rows into the file as they come; their token counts back."""
        counted = []  # per shard: tokens, kept, corpus tokens

        def termdoc_rows() -> Iterator[Any]:
            for pieces, *numbers in rests:
                counted.append(tuple(numbers))
                yield from pieces

        write_matrix_columns(out, "termdoc.parquet", termdoc_rows(), (vocabulary.height, n_docs))
        return counted

    try:
        forward, counted, threads = reduce_partitioned(cooccurrence_shard, calls, merge, parallel, "cooccurrence",
                                                       out, write_termdoc)
    finally:  # the counting buffers, kept from shard to shard, go when the stage ends (else a worker holds ~0.5
        _counting_done()  # GB through the next stages: their peaks 1.1 -> 1.7 GB at the next corpus)
        on_every_worker(parallel, _counting_done)
    n_tokens, n_kept, n_corpus = (sum(column) for column in zip(*counted, strict=True))
    matrix = cooccurrence.symmetric(join_rows(forward))
    if not matrix.nnz:  # an empty result is no artifact: every later stage would fail on it, less clearly
        raise InputError(f"no two words co-occur in the train split of {corpus_sources(tokens)} ({n_tokens} "
                         f"tokens of vocabulary words, {n_kept} after subsampling): nothing for embeddings "
                         "to learn from; give more text with words, or lower vocabulary.min_count or "
                         "cooccurrence.subsample")
    write_matrix(out, "matrix.parquet", matrix, threads)  # the shards are done: their cores encode it
    out.write_parquet("vocab.parquet", vocabulary, VOCAB)
    out.metrics.update({"nonzeros": int(matrix.nnz), "tokens": n_tokens, "tokens_after_subsampling": n_kept,
                        "corpus_tokens": n_corpus,
                        "total_weight": float(matrix.sum()), "vocabulary_size": vocabulary.height,
                        "documents": n_docs})


@stage("ppmi")
def compute_ppmi(out: ArtifactWriter, cooccurrence: ArtifactRef, params: PPMIParams) -> None:
    counts = (read_matrix(cooccurrence) if params.counts == "window"
              else lsi.term_term(read_matrix(cooccurrence, "termdoc.parquet")))
    matrix = ppmi.ppmi_matrix(counts, params.alpha, params.shift, params.log_base)
    write_matrix(out, "matrix.parquet", matrix)
    out.write_parquet("vocab.parquet", read_table(cooccurrence, "vocab.parquet"), VOCAB)
    out.metrics.update({"nonzeros": int(matrix.nnz), "mean_value": float(matrix.data.mean()) if matrix.nnz else 0.0})
