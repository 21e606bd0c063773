"""Count-based stages: `cooccurrence` (word–word and term–document counts) and `ppmi`."""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp
from prefect import task

from models import cooccurrence, ppmi, vocab
from storage import ArtifactRef, ArtifactWriter
from storage.formats import VOCAB, count_rows, read_matrix, read_rows, read_table, write_matrix
from tasks.parallel import (
    SHARD_TASK,
    deliver,
    map_shards,
    row_ranges,
    sum_matrices,
)
from tasks.params import CooccurrenceParams, ParallelParams, PPMIParams
from tasks.stage import stage


@task(name="cooccurrence-shard", **SHARD_TASK)
def cooccurrence_shard(tokens: ArtifactRef, start: int, stop: int, vocab_size: int, window: int,
                       part: str | None) -> tuple[Any, Any, int]:
    """Per-distance pair counts and term–document counts of sentences [start, stop) (windows
    never cross a sentence, so sentence ranges add up exactly), and their number of tokens."""
    table = read_rows(tokens, "tokens.parquet", start, stop)
    ids, offsets = cooccurrence.id_stream(table["ids"], min_id=len(vocab.SPECIALS))
    counts = cooccurrence.distance_counts(ids, offsets, vocab_size, window)
    # Documents are runs of sentences: their id ranges come from the sentence offsets (no regrouping).
    doc_index = table["doc_index"].to_numpy()
    doc_starts = np.flatnonzero(np.concatenate(([True], doc_index[1:] != doc_index[:-1]))) if len(doc_index) else []
    local = cooccurrence.term_document_matrix(ids, np.append(offsets[doc_starts], offsets[-1]), vocab_size).tocoo()
    first, n_docs = (int(doc_index[0]), int(doc_index[-1]) + 1) if len(doc_index) else (0, 0)  # 0..documents-1
    termdoc = sp.csr_matrix((local.data, (local.row, local.col + first)), shape=(vocab_size, n_docs))
    return deliver(counts, part, "pairs"), deliver(termdoc, part, "docs"), len(ids)


@stage("cooccurrence", code=[cooccurrence, vocab])
def count_cooccurrence(out: ArtifactWriter, tokens: ArtifactRef, tokenizer: ArtifactRef,
                       params: CooccurrenceParams, parallel: ParallelParams | None = None) -> None:
    """Counts over all splits (intrinsic evaluation uses external word lists, not held-out text);
    special tokens, <unk> included, are dropped before windowing. Also the term–document matrix.
    Shards of sentences are counted apart; their exact per-distance counts add, then are weighted."""
    parallel = parallel or ParallelParams()
    vocabulary = read_table(tokenizer, "vocab.parquet")
    ranges = row_ranges(count_rows(tokens, "tokens.parquet"), parallel.shard_rows)
    calls = [{"tokens": tokens, "start": a, "stop": b, "vocab_size": vocabulary.height, "window": params.window}
             for a, b in ranges]
    results = map_shards(cooccurrence_shard, calls, parallel, "cooccurrence", out)
    counts = sum_matrices([pairs for pairs, _, _ in results])
    matrix = cooccurrence.weigh(counts, vocabulary.height, params.weighting)
    write_matrix(out, "matrix.parquet", matrix)
    docs = [termdoc for _, termdoc, _ in results]
    n_docs = max(d.shape[1] for d in docs)
    termdoc = sum_matrices(docs, shape=(vocabulary.height, n_docs))
    write_matrix(out, "termdoc.parquet", termdoc)
    out.write_parquet("vocab.parquet", vocabulary, VOCAB)
    out.metrics.update({"nonzeros": int(matrix.nnz), "tokens": sum(n for _, _, n in results),
                        "total_weight": float(matrix.sum()), "vocabulary_size": vocabulary.height,
                        "documents": n_docs})


@stage("ppmi", code=[ppmi])
def compute_ppmi(out: ArtifactWriter, cooccurrence: ArtifactRef, params: PPMIParams) -> None:
    matrix = ppmi.ppmi_matrix(read_matrix(cooccurrence), params.alpha, params.shift)
    write_matrix(out, "matrix.parquet", matrix)
    out.write_parquet("vocab.parquet", read_table(cooccurrence, "vocab.parquet"), VOCAB)
    out.metrics.update({"nonzeros": int(matrix.nnz), "mean_value": float(matrix.data.mean()) if matrix.nnz else 0.0})
