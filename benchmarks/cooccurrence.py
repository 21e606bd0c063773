"""Co-occurrence counting throughput: ours vs a straightforward NumPy sort-and-count reference,
one core, window 5, harmonic weights, on a ≥ 10 M-token stream of real sentences."""

from __future__ import annotations

import time

import numpy as np
from lexiflow.models.cooccurrence import cooccurrence_matrix
from threadpoolctl import threadpool_limits

from benchmarks.corpora import repeated_stream
from benchmarks.harness import Row


def reference(ids: np.ndarray, offsets: np.ndarray, vocab_size: int, window: int) -> tuple[np.ndarray, np.ndarray]:
    """The textbook vectorized version: all pairs as int64 keys, np.unique, bincount of weights."""
    sentence = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    keys, weights = [], []
    for d in range(1, window + 1):
        same = sentence[:-d] == sentence[d:]
        a, b = ids[:-d][same].astype(np.int64), ids[d:][same].astype(np.int64)
        keys += [a * vocab_size + b, b * vocab_size + a]
        weights += [np.full(2 * len(a), 1.0 / d)]
    unique, inverse = np.unique(np.concatenate(keys), return_inverse=True)
    return unique, np.bincount(inverse, weights=np.concatenate(weights))


def run(quick: bool = False) -> list[Row]:
    n = 300_000 if quick else 10_000_000
    ids, offsets, vocab_size = repeated_stream(n)
    with threadpool_limits(1):
        start = time.perf_counter()
        ours = cooccurrence_matrix(ids, offsets, vocab_size, window=5, weighting="harmonic")
        t_ours = time.perf_counter() - start
        start = time.perf_counter()
        keys, values = reference(ids, offsets, vocab_size, 5)
        t_ref = time.perf_counter() - start
    coo = ours.tocoo()
    ours_keys = coo.row.astype(np.int64) * vocab_size + coo.col
    order = np.argsort(ours_keys)
    assert np.array_equal(ours_keys[order], keys) and np.allclose(coo.data[order], values), "results differ"
    tokens = len(ids)
    rate, ref_rate = tokens / t_ours, tokens / t_ref
    case = f"window 5 harmonic, {tokens / 1e6:.1f}M tokens, V={vocab_size}, 1 core"
    return [
        Row("cooccurrence", case, "tokens/s", rate, ref_rate, "numpy sort-and-count", True, ">= 5e6",
            rate >= 5e6, "identical matrices checked"),
        Row("cooccurrence", case, "seconds", t_ours, t_ref, "numpy sort-and-count", False),
    ]
