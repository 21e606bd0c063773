"""Word–word co-occurrence and term–document matrices, built vectorized from an id stream.

A corpus arrives as a flat id array plus sentence offsets (the `tokenized_corpus` layout). Windows
never cross a sentence boundary. For every distance d = 1..window, the pair (w_i, w_{i+d}) is
counted with weight 1 (`uniform`) or 1/d (`harmonic`, as in GloVe); the matrix is symmetric
(X = F + Fᵀ, F the forward pairs).

How it is fast (no Python loop per token): each chunk of the stream turns into one uint64 key per
forward pair, `(row·V + col)·8 + d`, sorted once (numpy's SIMD sort); runs of equal keys give
the count per (pair, distance), then per pair the weighted sum; the sorted keys are already CSR
order, so the chunk's matrix is built without a conversion.

Chunks (and shards of a corpus counted on other workers) add exactly: each yields integer
counts per (pair, distance) (`distance_counts`), which sum in any order to the same integers;
the weights 1/d are applied once at the end (`weigh`). Adding weighted float matrices instead
would round differently depending on how the corpus was cut.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import polars as pl
import scipy.sparse as sp
from lexiflow.models.errors import ParameterError
from lexiflow.models.progress import Progress

Weighting = Literal["uniform", "harmonic"]
_DIST_BITS = 6  # low key bits hold the distance d (window <= 63)
# Tokens per chunk of `distance_counts` (its scratch buffers: ~0.3 GB a thread, `_Scratch`) and per block of
# `term_document_columns`. Smaller chunks cost more merging than they save in memory traffic.
_CHUNK_TOKENS = 1 << 22
_SUBSAMPLE_BLOCK = 1 << 18  # tokens per block of `subsample`: its temporaries (2 MB each) fit a core's cache


def cooccurrence_matrix(
    ids: np.ndarray,
    offsets: np.ndarray,
    vocab_size: int,
    window: int = 5,
    weighting: Weighting = "harmonic",
    chunk_tokens: int = _CHUNK_TOKENS,
    progress: Callable[[float | None], None] | None = None,
) -> sp.csr_matrix:
    """Symmetric (vocab_size × vocab_size) float64 co-occurrence counts.

    ids: flat token ids (any unsigned/int dtype), offsets: sentence start positions with a final
    `len(ids)` (so sentence s is ids[offsets[s]:offsets[s+1]]).
    """
    if weighting not in ("uniform", "harmonic"):
        raise ParameterError(f"weighting={weighting!r}: choose 'uniform' or 'harmonic'")
    return weigh(distance_counts(ids, offsets, vocab_size, window, chunk_tokens, progress), vocab_size, weighting)


def distance_counts(
    ids: np.ndarray,
    offsets: np.ndarray,
    vocab_size: int,
    window: int = 5,
    chunk_tokens: int = _CHUNK_TOKENS,
    progress: Callable[[float | None], None] | None = None,
) -> sp.csr_matrix:
    """Forward pair counts per distance: an int64 (vocab_size × vocab_size·2^6) matrix whose entry
    (w, c·2^6 + d) counts w followed by c at distance d. Exact integers: the counts of any split of
    a corpus into sentence ranges add up to the counts of the whole (`weigh` then finishes)."""
    if not 1 <= window < 2**_DIST_BITS:
        raise ParameterError(f"window={window}: must be between 1 and {2**_DIST_BITS - 1}")
    ids = np.asarray(ids)
    offsets = np.asarray(offsets, dtype=np.int64)
    _check_stream(ids, offsets, vocab_size)
    # Chunk results add as a binary counter (a merge of two equal-sized sums at a time): each count is copied
    # about log2(chunks) times, not once per later chunk as when every chunk adds onto one growing total.
    sums: list[tuple[int, sp.csr_matrix]] = []  # (level, sum of 2^level chunks), levels decreasing
    with Progress("cooccurrence", total=len(ids), unit="tokens", callback=progress) as bar:
        for start in range(0, len(ids), chunk_tokens):
            n_starts = min(chunk_tokens, len(ids) - start)
            stop = min(start + chunk_tokens + window, len(ids))  # overlap: pairs starting in chunk
            chunk, level = _forward_chunk(ids[start:stop], _left(offsets, start, stop), n_starts, vocab_size, window), 0
            while sums and sums[-1][0] == level:
                chunk, level = sums.pop()[1] + chunk, level + 1
            sums.append((level, chunk))
            bar.update(n_starts)
    chunks = [chunk for _, chunk in reversed(sums)]  # smallest first
    forward = sum(chunks[1:], chunks[0]) if chunks else empty_distance_counts(vocab_size)
    forward.sort_indices()
    return forward


def _spans(offsets: np.ndarray, start: int, stop: int) -> tuple[int, np.ndarray]:
    """The sentences that overlap tokens [start, stop) of a stream: the first one's index, and how many of
    those tokens each holds."""
    first, last = np.searchsorted(offsets, start, "right") - 1, np.searchsorted(offsets, stop, "left")
    return int(first), np.diff(np.clip(offsets[first: last + 1], start, stop))


def _left(offsets: np.ndarray, start: int, stop: int) -> np.ndarray:
    """Tokens left in its sentence after each position of [start, stop): the pair (i, i+d) stays inside
    iff left[i] >= d."""
    first, spans = _spans(offsets, start, stop)
    return np.repeat(offsets[first + 1: first + 1 + len(spans)], spans) - np.arange(start, stop) - 1


def _check_stream(ids: np.ndarray, offsets: np.ndarray, vocab_size: int) -> None:
    """Reject streams that would otherwise count invented pairs (a negative id wraps around to
    another word) or fail deep in numpy (offsets that do not cover the ids)."""
    if len(ids):
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or high >= vocab_size:
            raise ParameterError(f"token id {low if low < 0 else high} is outside the vocabulary of size "
                                 f"{vocab_size} (ids run from 0 to {vocab_size - 1})")
    if len(offsets) == 0 or offsets[0] != 0 or offsets[-1] != len(ids) or (np.diff(offsets) < 0).any():
        got = f"{offsets[0]}..{offsets[-1]}" if len(offsets) else "none"
        raise ParameterError(f"sentence offsets (got {got}) must start at 0, never decrease and end at "
                             f"len(ids) = {len(ids)}")


def empty_distance_counts(vocab_size: int) -> sp.csr_matrix:
    return sp.csr_matrix((vocab_size, vocab_size << _DIST_BITS), dtype=np.int64)


def weigh(counts: sp.csr_matrix, vocab_size: int, weighting: Weighting = "harmonic") -> sp.csr_matrix:
    """Per-distance forward counts (`distance_counts`, possibly summed over shards) -> the symmetric
    weighted matrix X = F + Fᵀ (F = `weigh_forward(counts)`)."""
    return symmetric(weigh_forward(counts, vocab_size, weighting))


def weigh_forward(counts: sp.csr_matrix, vocab_size: int, weighting: Weighting = "harmonic") -> sp.csr_matrix:
    """F[w, c] = Σ_d count(w, c, d) · (1 or 1/d), summed over d ascending. Row by row: the rows of a
    key-space partition of the counts give exactly those rows of F."""
    if weighting not in ("uniform", "harmonic"):
        raise ParameterError(f"weighting={weighting!r}: choose 'uniform' or 'harmonic'")
    counts = counts.tocsr()
    counts.sum_duplicates()  # canonical: sorted (col, d) within each row, so d runs ascending per pair
    if counts.nnz == 0:
        return sp.csr_matrix((vocab_size, vocab_size), dtype=np.float64)
    col_d = counts.indices.astype(np.int64)
    values = counts.data.astype(np.float64)
    if weighting == "harmonic":
        values /= (col_d & (2**_DIST_BITS - 1)).astype(np.float64)
    rows = np.repeat(np.arange(vocab_size, dtype=np.int64), np.diff(counts.indptr))
    pairs = rows * vocab_size + (col_d >> _DIST_BITS)
    pair_starts = np.flatnonzero(np.concatenate(([True], pairs[1:] != pairs[:-1])))
    values = np.add.reduceat(values, pair_starts)
    rows, cols = rows[pair_starts], (col_d >> _DIST_BITS)[pair_starts].astype(np.int32)
    indptr = np.searchsorted(rows, np.arange(vocab_size + 1))  # rows are sorted: already CSR order
    return sp.csr_matrix((values, cols, indptr), shape=(vocab_size, vocab_size))


def symmetric(forward: sp.csr_matrix) -> sp.csr_matrix:
    """X = F + Fᵀ: each pair counted from both of its words."""
    return (forward + forward.T).tocsr()


def _forward_chunk(ids, left, n_starts, vocab_size, window) -> sp.csr_matrix:
    """Per-distance counts of the forward pairs whose first token is among the chunk's first
    `n_starts` positions."""
    # key = (row·V + col)·2^bits + d, from two pre-shifted halves added as contiguous slices, then the
    # pairs that stay inside their sentence kept (one compress per distance, into one key array). The
    # temporaries are this thread's scratch buffers, reused chunk after chunk and shard after shard.
    scratch = _scratch()
    n = len(ids)
    col_part = scratch.take("col", n, np.uint64)
    col_part[:] = ids  # ids are in [0, vocab_size): checked
    np.left_shift(col_part, np.uint64(_DIST_BITS), out=col_part)
    row_part = np.multiply(col_part, np.uint64(vocab_size), out=scratch.take("row", n, np.uint64))
    keys = scratch.take("keys", window * n_starts, np.uint64)
    pair, mask = scratch.take("pair", n_starts, np.uint64), scratch.take("mask", n_starts, bool)
    at = 0
    for d in range(1, window + 1):
        m = max(0, min(n_starts, n - d))
        np.greater_equal(left[:m], d, out=mask[:m])
        np.add(row_part[:m], col_part[d: d + m], out=pair[:m])
        np.bitwise_or(pair[:m], np.uint64(d), out=pair[:m])
        kept = pair[:m][mask[:m]]  # (np.compress with out= is 3x slower: it goes by indices)
        keys[at: at + len(kept)] = kept
        at += len(kept)
    keys = keys[:at]
    if len(keys) == 0:
        return empty_distance_counts(vocab_size)
    keys.sort()
    # Runs of equal (pair, d) keys -> count per (pair, d); the sorted keys are already CSR order.
    starts, counts = _runs(keys)
    run_keys = keys[starts]
    width = np.uint64(vocab_size << _DIST_BITS)
    indptr = np.searchsorted(run_keys, np.arange(vocab_size + 1, dtype=np.uint64) * width)  # row = key // width
    cols = np.remainder(run_keys, width, out=run_keys).view(np.int64)  # col = key mod width (< 2^63)
    return sp.csr_matrix((counts, cols, indptr), shape=(vocab_size, vocab_size << _DIST_BITS))


def _runs(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each run of equal values starts in sorted, non-empty `keys`, and its length."""
    new_run = _scratch().take("runs", len(keys), bool)
    new_run[0] = True
    np.not_equal(keys[1:], keys[:-1], out=new_run[1:])
    starts = np.flatnonzero(new_run)
    return starts, np.diff(starts, append=len(keys))


class _Scratch:
    """Buffers by name, each grown to the largest size asked of it and then reused: the counting kernel's
    stream-sized temporaries (~0.3 GB at 4M tokens) would otherwise be fresh pages every chunk, which the
    kernel zero-fills (on the 1 GB benchmark's machine a shard's count took 0.4 to 1.1 s on the same 6.5M
    tokens, by how much of its memory was new)."""

    def __init__(self) -> None:
        self.buffers: dict[str, np.ndarray] = {}

    def take(self, name: str, size: int, dtype: Any) -> np.ndarray:
        buffer = self.buffers.get(name)
        if buffer is None or buffer.dtype != dtype or len(buffer) < size:
            self.buffers[name] = buffer = np.empty(size, dtype=dtype)
        return buffer[:size]


_scratches: dict[int, _Scratch] = {}  # by thread: the threads runner counts shards in parallel


def _scratch() -> _Scratch:
    return _scratches.setdefault(threading.get_ident(), _Scratch())


def release_scratch() -> None:
    """Free every thread's counting buffers (a process that counts no more: the stage's end)."""
    _scratches.clear()


def term_document_columns(ids: np.ndarray, doc_offsets: np.ndarray, vocab_size: int,
                          first_doc: int = 0) -> pl.DataFrame:
    """The (vocab_size × documents) term–document counts, document first_doc + j being
    ids[doc_offsets[j]:doc_offsets[j+1]], as (row: term, col: document, value: count) rows in column-major
    order (by document, then term; `formats.by_columns`), counted directly in that order: blocks of whole
    documents of about `_CHUNK_TOKENS` tokens, each one sort of (document, term) keys, so temporaries stay
    block-sized and no row-major matrix is built only to be turned around."""
    doc_offsets = np.asarray(doc_offsets, dtype=np.int64)
    n = len(doc_offsets) - 1
    # block edges: the document holding every _CHUNK_TOKENS-th token starts a block
    starts = np.searchsorted(doc_offsets, np.arange(0, doc_offsets[-1], _CHUNK_TOKENS), "right") - 1
    edges = np.unique(np.concatenate(([0], starts, [n])))
    rows, cols, values = [], [], []
    for a, b in zip(edges[:-1], edges[1:], strict=True):
        local = np.repeat(np.arange(b - a, dtype=np.int64), np.diff(doc_offsets[a: b + 1]))
        if not len(local):
            continue
        key = local * vocab_size + ids[doc_offsets[a]: doc_offsets[b]]
        key.sort()
        runs, counts = _runs(key)
        values.append(counts.astype(np.float64))
        key = key[runs]
        rows.append((key % vocab_size).astype(np.uint32))
        cols.append((key // vocab_size + (first_doc + a)).astype(np.uint32))
    empty = [np.empty(0, dtype=np.uint32)]
    return pl.DataFrame({"row": np.concatenate(rows or empty), "col": np.concatenate(cols or empty),
                         "value": np.concatenate(values or [np.empty(0)])})


def id_stream(id_lists: pl.Series, min_id: int = 0,
              sentences: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Flatten id lists (one per sentence) into (ids, offsets), dropping ids below `min_id`
    (the special tokens) and closing the gaps they leave, as word2vec and GloVe do. A null list, or a
    sentence whose `sentences` flag (one bool per list) is False, keeps its place with no tokens.
    Read from the lists' Arrow buffers: one mask and one copy of the kept ids (exploding the lists, or
    nulling the held-out ones, would copy every id first)."""
    lists = id_lists.to_arrow()
    offsets = np.asarray(lists.offsets, dtype=np.int64)  # a slice's own offsets, into the whole child array
    values = lists.values.slice(offsets[0], offsets[-1] - offsets[0])
    offsets = offsets - offsets[0]
    flat = values.fill_null(0).to_numpy() if values.null_count else values.to_numpy()
    keep = flat >= min_id
    if values.null_count:
        keep &= values.is_valid().to_numpy(zero_copy_only=False)
    if lists.null_count or sentences is not None:
        whole = np.asarray(sentences, dtype=bool) if sentences is not None else np.ones(len(lists), dtype=bool)
        if lists.null_count:
            whole &= lists.is_valid().to_numpy(zero_copy_only=False)
        keep &= np.repeat(whole, np.diff(offsets))
    return _kept_stream(flat, offsets, keep)


def _kept_stream(ids: np.ndarray, offsets: np.ndarray, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (ids, offsets) stream of the tokens where `keep` holds; sentences left empty keep their
    (empty) place. Kept tokens before a sentence start: its offset less the dropped tokens before it."""
    offsets = np.asarray(offsets, dtype=np.int64)
    return ids[keep], offsets - np.searchsorted(np.flatnonzero(~keep), offsets)


def keep_probabilities(counts: np.ndarray, threshold: float) -> np.ndarray:
    """word2vec's frequent-word subsampling: a word of relative frequency f > threshold t is kept
    with probability (√(f/t) + 1)·t/f (gensim's formula), every other word always."""
    counts = np.asarray(counts, dtype=np.float64)
    if threshold <= 0 or counts.sum() <= 0:
        return np.ones(len(counts))
    f = counts / counts.sum()
    with np.errstate(divide="ignore"):
        return np.minimum(1.0, (np.sqrt(f / threshold) + 1) * threshold / f)  # f = 0 -> inf -> 1


def subsample(ids: np.ndarray, offsets: np.ndarray, keep_prob: np.ndarray, seed: int,
              first_sentence: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Drop tokens of an (ids, offsets) stream before windowing, token k of sentence s kept when
    u(seed, s, k) < keep_prob[id]. Windows then close over the dropped words and reach further
    ("dirty" subsampling, Levy et al. 2015). u hashes the sentence's number in the whole corpus
    (`first_sentence` + its index here) and k, so shards drop exactly the tokens the whole would.
    Drawn in blocks of `_SUBSAMPLE_BLOCK` tokens: a block's temporaries are reused cache-sized memory,
    not fresh pages for each of a dozen stream-sized arrays (the kernel zero-fills those: most of this
    function's time on a 12M-token shard)."""
    offsets = np.asarray(offsets, dtype=np.int64)
    seed_hash = _splitmix64(np.array([seed], dtype=np.uint64))
    keep = np.ones(len(ids), dtype=bool)
    for start in range(0, len(ids), _SUBSAMPLE_BLOCK):
        stop = min(start + _SUBSAMPLE_BLOCK, len(ids))
        p = keep_prob[ids[start:stop]]
        draw = np.flatnonzero(p < 1.0)  # only words kept with probability < 1 need their draw
        if not len(draw):
            continue
        # each drawn token's sentence in the shard, and position in it
        first, spans = _spans(offsets, start, stop)
        local = np.repeat(np.arange(first, first + len(spans), dtype=np.int64), spans)[draw]
        position = (start + draw - offsets[local]).astype(np.uint64)
        key = ((local.astype(np.uint64) + np.uint64(first_sentence)) << np.uint64(24)) \
            + (position & np.uint64(2**24 - 1))
        mixed = _splitmix64(key ^ seed_hash)
        keep[start + draw] = (mixed >> np.uint64(11)).astype(np.float64) * 2.0**-53 < p[draw]  # 53-bit uniforms
    return _kept_stream(ids, offsets, keep)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """Steele et al.'s SplitMix64 finaliser: a counter-based hash, uint64 -> well-mixed uint64
    (in place on a copy: one buffer, not one per step)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    for shift, mult in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
        x ^= x >> np.uint64(shift)
        x *= np.uint64(mult)
    x ^= x >> np.uint64(31)
    return x
