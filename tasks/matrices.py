"""Count-based stages: `cooccurrence` (word–word and term–document counts) and `ppmi`."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

import numpy as np
from lexiflow.models import cooccurrence, lsi, ppmi, vocab
from lexiflow.models.errors import InputError
from lexiflow.storage import ArtifactRef, ArtifactWriter
from lexiflow.storage.formats import (
    VOCAB,
    corpus_sources,
    read_matrix,
    read_rows,
    read_table,
    write_matrix,
    write_matrix_columns,
)
from lexiflow.tasks.parallel import reduce_partitioned, shard_ranges
from lexiflow.tasks.params import COOCCURRENCE_SHARD_SENTENCES, CooccurrenceParams, ParallelParams, PPMIParams
from lexiflow.tasks.parts import join_rows
from lexiflow.tasks.runners import on_every_worker
from lexiflow.tasks.shards import cooccurrence_shard, counting_done, weigh_partition
from lexiflow.tasks.stage import stage


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
        counting_done()  # GB through the next stages: their peaks 1.1 -> 1.7 GB at the next corpus)
        on_every_worker(parallel, counting_done)
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
