"""Count-based stages: `cooccurrence` (word–word and term–document counts) and `ppmi`."""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl
from lexiflow.models import cooccurrence, lsi, ppmi, vocab
from lexiflow.models.errors import InputError
from lexiflow.storage import ArtifactRef, ArtifactWriter
from lexiflow.storage.formats import VOCAB, corpus_sources, count_rows, read_matrix, read_rows, read_table, write_matrix
from lexiflow.tasks.parallel import (
    SHARD_TASK,
    deliver,
    reduce_shards,
    row_ranges,
    sum_matrices,
)
from lexiflow.tasks.params import CooccurrenceParams, ParallelParams, PPMIParams
from lexiflow.tasks.stage import stage
from prefect import task


@task(name="cooccurrence-shard", **SHARD_TASK)
def cooccurrence_shard(tokens: ArtifactRef, start: int, stop: int, keep_prob: np.ndarray, window: int, seed: int,
                       part: str | None) -> tuple[Any, Any, int, int, int]:
    """Per-distance pair counts (after subsampling) and term–document counts (every token) of the train
    sentences among [start, stop) (windows never cross a sentence, and a token's subsampling draw depends
    on its sentence number, so sentence ranges add up exactly), and their numbers of tokens (in the
    vocabulary, kept after subsampling, and every train token, <unk> included)."""
    table = read_rows(tokens, "tokens.parquet", start, stop)
    vocab_size = len(keep_prob)
    # held-out sentences keep their row (and number) but no tokens: nothing of them reaches the vectors
    train_ids = table.select(pl.when(pl.col("split") == "train").then(pl.col("ids"))).to_series()
    ids, offsets = cooccurrence.id_stream(train_ids, min_id=len(vocab.SPECIALS))
    kept, kept_offsets = cooccurrence.subsample(ids, offsets, keep_prob, seed, first_sentence=start)
    counts = cooccurrence.distance_counts(kept, kept_offsets, vocab_size, window)
    # Documents are runs of sentences: their id ranges come from the sentence offsets (no regrouping).
    doc_index = table["doc_index"].to_numpy()
    doc_starts = np.flatnonzero(np.concatenate(([True], doc_index[1:] != doc_index[:-1]))) if len(doc_index) else []
    first = int(doc_index[0]) if len(doc_index) else 0  # the shard's documents are first.. of 0..documents-1
    termdoc = cooccurrence.term_document_matrix(ids, np.append(offsets[doc_starts], offsets[-1]), vocab_size, first)
    corpus_tokens = int(train_ids.list.len().sum() or 0)
    return deliver(counts, part, "pairs"), deliver(termdoc, part, "docs"), len(ids), len(kept), corpus_tokens


def add_cooccurrence_counts(results: list[tuple]) -> tuple:
    """Shards' exact counts added up, in any order: per-distance pair counts, term–document counts
    (as wide as the widest: a shard's matrix ends at its last document), numbers of tokens."""
    pairs, docs, *numbers = zip(*results, strict=True)
    return sum_matrices(list(pairs)), sum_matrices(list(docs)), *(sum(n) for n in numbers)


@stage("cooccurrence")
def count_cooccurrence(out: ArtifactWriter, tokens: ArtifactRef, tokenizer: ArtifactRef,
                       params: CooccurrenceParams, parallel: ParallelParams | None = None) -> None:
    """Counts over the train split only, as the vocabulary: embeddings built on these counts may
    initialise a language model (`neural.pretrained`), whose held-out perplexity must not have seen
    the held-out text. Special tokens, <unk> included, are dropped before windowing, then frequent
    words are subsampled (`params.subsample`; the term–document matrix counts every train token).
    Shards of sentences are counted apart; their exact per-distance counts add, then are weighted."""
    parallel = parallel or ParallelParams()
    vocabulary = read_table(tokenizer, "vocab.parquet")
    ranges = row_ranges(count_rows(tokens, "tokens.parquet"), parallel.shard_rows)
    word_counts = vocabulary["count"].to_numpy().astype(np.float64)
    word_counts[: len(vocab.SPECIALS)] = 0  # specials never reach a window
    keep_prob = cooccurrence.keep_probabilities(word_counts, params.subsample)
    calls = [{"tokens": tokens, "start": a, "stop": b, "keep_prob": keep_prob, "window": params.window,
              "seed": params.seed} for a, b in ranges]
    pairs, termdoc, n_tokens, n_kept, n_corpus = reduce_shards(cooccurrence_shard, calls, add_cooccurrence_counts,
                                                               parallel, "cooccurrence", out)
    matrix = cooccurrence.weigh(pairs, vocabulary.height, params.weighting)
    if not matrix.nnz:  # an empty result is no artifact: every later stage would fail on it, less clearly
        raise InputError(f"no two words co-occur in the train split of {corpus_sources(tokens)} ({n_tokens} "
                         f"tokens of vocabulary words, {n_kept} after subsampling): nothing for embeddings "
                         "to learn from; give more text with words, or lower vocabulary.min_count or "
                         "cooccurrence.subsample")
    write_matrix(out, "matrix.parquet", matrix)
    write_matrix(out, "termdoc.parquet", termdoc.tocsr())
    out.write_parquet("vocab.parquet", vocabulary, VOCAB)
    out.metrics.update({"nonzeros": int(matrix.nnz), "tokens": n_tokens, "tokens_after_subsampling": n_kept,
                        "corpus_tokens": n_corpus,
                        "total_weight": float(matrix.sum()), "vocabulary_size": vocabulary.height,
                        "documents": termdoc.shape[1]})


@stage("ppmi")
def compute_ppmi(out: ArtifactWriter, cooccurrence: ArtifactRef, params: PPMIParams) -> None:
    counts = (read_matrix(cooccurrence) if params.counts == "window"
              else lsi.term_term(read_matrix(cooccurrence, "termdoc.parquet")))
    matrix = ppmi.ppmi_matrix(counts, params.alpha, params.shift, params.log_base)
    write_matrix(out, "matrix.parquet", matrix)
    out.write_parquet("vocab.parquet", read_table(cooccurrence, "vocab.parquet"), VOCAB)
    out.metrics.update({"nonzeros": int(matrix.nnz), "mean_value": float(matrix.data.mean()) if matrix.nnz else 0.0})
