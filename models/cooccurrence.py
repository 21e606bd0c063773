"""Word–word co-occurrence and term–document matrices, built vectorized from an id stream.

A corpus arrives as a flat id array plus sentence offsets (the `tokenized_corpus` layout). Windows
never cross a sentence boundary. For every distance d = 1..window, the pair (w_i, w_{i+d}) is
counted with weight 1 (`uniform`) or 1/d (`harmonic`, as in GloVe); the matrix is symmetric
(X = F + Fᵀ, F the forward pairs).

How it is fast (no Python loop per token): each chunk of the stream turns into one uint64 key per
forward pair, `(row·V + col)·8 + d`, sorted once (numpy's SIMD sort); runs of equal keys give
the count per (pair, distance), then per pair the weighted sum; the sorted keys are already CSR
order, so the chunk's matrix is built without a conversion. Chunk matrices add (counts are
associative), which is also what lets shards be counted apart and merged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import numpy as np
import polars as pl
import scipy.sparse as sp

from models.errors import ParameterError
from models.progress import Progress

Weighting = Literal["uniform", "harmonic"]
_DIST_BITS = 6  # low key bits hold the distance d (window <= 63)


def cooccurrence_matrix(
    ids: np.ndarray,
    offsets: np.ndarray,
    vocab_size: int,
    window: int = 5,
    weighting: Weighting = "harmonic",
    chunk_tokens: int = 4_000_000,
    progress: Callable[[float | None], None] | None = None,
) -> sp.csr_matrix:
    """Symmetric (vocab_size × vocab_size) float64 co-occurrence counts.

    ids: flat token ids (any unsigned/int dtype), offsets: sentence start positions with a final
    `len(ids)` (so sentence s is ids[offsets[s]:offsets[s+1]]).
    """
    if not 1 <= window < 2**_DIST_BITS:
        raise ParameterError(f"window={window}: must be between 1 and {2**_DIST_BITS - 1}")
    if weighting not in ("uniform", "harmonic"):
        raise ParameterError(f"weighting={weighting!r}: choose 'uniform' or 'harmonic'")
    ids = np.asarray(ids)
    offsets = np.asarray(offsets, dtype=np.int64)
    if len(ids) and int(ids.max()) >= vocab_size:
        raise ParameterError(f"token id {int(ids.max())} is outside the vocabulary of size {vocab_size}")
    # Tokens left in the sentence after each position: the pair (i, i+d) stays inside iff left[i] >= d.
    lengths = np.diff(offsets)
    left = np.repeat(offsets[1:], lengths) - np.arange(len(ids)) - 1

    forward = sp.csr_matrix((vocab_size, vocab_size), dtype=np.float64)
    with Progress("cooccurrence", total=len(ids), unit="tokens", callback=progress) as bar:
        for start in range(0, len(ids), chunk_tokens):
            stop = min(start + chunk_tokens + window, len(ids))  # overlap: pairs starting in chunk
            forward = forward + _forward_chunk(
                ids[start:stop], left[start:stop], min(chunk_tokens, len(ids) - start),
                vocab_size, window, weighting,
            )
            bar.update(min(chunk_tokens, len(ids) - start))
    return (forward + forward.T).tocsr()


def _forward_chunk(ids, left, n_starts, vocab_size, window, weighting) -> sp.csr_matrix:
    """Forward pairs whose first token is among the chunk's first `n_starts` positions."""
    # key = (row·V + col)·2^bits + d, assembled from two pre-shifted halves: one gather each.
    col_part = ids.astype(np.uint64) << np.uint64(_DIST_BITS)
    row_part = col_part * np.uint64(vocab_size)
    parts = []
    for d in range(1, window + 1):
        first = np.flatnonzero(left[: max(0, min(n_starts, len(ids) - d))] >= d)
        key = row_part[first]
        key += col_part[first + d]
        key |= np.uint64(d)
        parts.append(key)
    keys = np.concatenate(parts) if parts else np.empty(0, np.uint64)
    if len(keys) == 0:
        return sp.csr_matrix((vocab_size, vocab_size), dtype=np.float64)
    keys.sort()
    # Runs of equal (pair, d) keys -> count per (pair, d) -> weighted sum per pair.
    starts = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
    counts = np.diff(np.append(starts, len(keys))).astype(np.float64)
    run_keys = keys[starts]
    if weighting == "harmonic":
        counts /= (run_keys & np.uint64(2**_DIST_BITS - 1)).astype(np.float64)
    pairs = run_keys >> np.uint64(_DIST_BITS)
    pair_starts = np.flatnonzero(np.concatenate(([True], pairs[1:] != pairs[:-1])))
    values = np.add.reduceat(counts, pair_starts)
    pairs = pairs[pair_starts]
    rows = (pairs // np.uint64(vocab_size)).astype(np.int64)
    cols = (pairs % np.uint64(vocab_size)).astype(np.int32)
    indptr = np.searchsorted(rows, np.arange(vocab_size + 1))  # keys are sorted: already CSR order
    return sp.csr_matrix((values, cols, indptr), shape=(vocab_size, vocab_size))


def term_document_matrix(ids: np.ndarray, doc_offsets: np.ndarray, vocab_size: int) -> sp.csr_matrix:
    """(vocab_size × documents) raw term counts; document j is ids[doc_offsets[j]:doc_offsets[j+1]]."""
    doc_offsets = np.asarray(doc_offsets, dtype=np.int64)
    docs = np.repeat(np.arange(len(doc_offsets) - 1), np.diff(doc_offsets))
    data = np.ones(len(ids), dtype=np.float64)
    shape = (vocab_size, len(doc_offsets) - 1)
    return sp.csr_matrix((data, (np.asarray(ids, dtype=np.int64), docs)), shape=shape)


def id_stream(id_lists: pl.Series, min_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Flatten id lists (one per sentence) into (ids, offsets), dropping ids below `min_id`
    (the special tokens) and closing the gaps they leave, as word2vec and GloVe do."""
    lengths = id_lists.list.len().fill_null(0).to_numpy()
    flat = id_lists.explode().drop_nulls().to_numpy()
    keep = flat >= min_id
    sentence_of = np.repeat(np.arange(len(lengths)), lengths)
    kept_lengths = np.bincount(sentence_of[keep], minlength=len(lengths))
    return flat[keep], np.concatenate(([0], np.cumsum(kept_lengths)))
