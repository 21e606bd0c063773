"""Truncated SVD of a (PPMI or term–document) matrix into word vectors (LSA/LSI).

M ≈ U Σ Vᵀ; word vectors are U Σ^p (p = 0.5 by default: Levy, Goldberg & Dagan 2015 found
symmetric weighting better than the classic p = 1), optionally plus the context vectors V Σ^p.
Randomized SVD (Halko, Martinsson & Tropp 2011) via scikit-learn; `svd_flip` makes signs
deterministic for a given seed.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from collections.abc import Callable, Iterator
from typing import Annotated

import numpy as np
import scipy.sparse as sp
from lexiflow.models.errors import ParameterError
from lexiflow.models.progress import Progress
from lexiflow.models.threads import DEFAULT_THREADS, Threads, limit_threads
from pydantic import Field

_OVERSAMPLES = 10  # scikit-learn's default n_oversamples


def svd_vectors(
    matrix: sp.spmatrix,
    dim: Annotated[int, Field(ge=2, le=2000, description="Embedding dimension.")] = 300,
    power: Annotated[float, Field(ge=0, le=1, description="Vectors are U·S^power.")] = 0.5,
    add_context: Annotated[bool, Field(description="Add the context vectors V·S^power.")] = False,
    n_iter: Annotated[int, Field(ge=1, le=50, description="Power iterations of the randomized SVD.")] = 5,
    seed: Annotated[int, Field(ge=0, description="Random seed.")] = 0,
    threads: Threads = DEFAULT_THREADS,
    progress: Callable[[float | None], None] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Return (word vectors float32 [rows × dim], singular values [dim]); `threads`: BLAS threads."""
    if dim < 1 or dim >= min(matrix.shape):
        raise ParameterError(f"svd.dim={dim}: must be between 1 and {min(matrix.shape) - 1} for this vocabulary")
    # float32 halves the memory traffic of the sparse products that dominate the time.
    m = sp.csr_matrix(matrix, dtype=np.float32)
    with limit_threads(threads, "svd.threads"), _estimated_progress(m, dim, n_iter, progress):
        from sklearn.utils.extmath import randomized_svd  # imported here: 1-2 s a cached run need not pay

        u, s, vt = randomized_svd(m, n_components=dim, n_iter=n_iter, random_state=seed)
    scale = s**power
    vectors = u * scale
    if add_context:
        vectors = vectors + vt.T * scale
    return vectors.astype(np.float32), s


@contextlib.contextmanager
def _estimated_progress(m: sp.csr_matrix, dim: int, n_iter: int,
                        progress: Callable[[float | None], None] | None) -> Iterator[None]:
    """Progress of scikit-learn's randomized SVD, which has no hook: its time is 2·n_iter + 2 products of
    the matrix with a (dim + oversamples)-column block; one such product is timed first (a few % of the
    work), and a heartbeat thread logs the products that time allows for (rate and ETA, an estimate)."""
    total = 2 * n_iter + 2
    bar = Progress("svd", total=total, unit="matrix products (estimated)", callback=progress)
    start = time.perf_counter()
    m @ np.ones((m.shape[1], min(dim + _OVERSAMPLES, m.shape[1])), dtype=np.float32)
    one = max(time.perf_counter() - start, 1e-9)
    finished, counted = threading.Event(), [0.0]

    def heartbeat() -> None:
        while not finished.wait(1.0):
            estimate = min(total - 0.5, (time.perf_counter() - start) / one - 1)  # never claims the end
            if estimate > counted[0]:
                bar.update(estimate - counted[0])
                counted[0] = estimate

    # in this thread's context: a Prefect progress artifact needs the task run's context variables
    thread = threading.Thread(target=contextvars.copy_context().run, args=(heartbeat,), name="svd-progress",
                              daemon=True)
    thread.start()
    try:
        yield
    finally:
        finished.set()
        thread.join()
    bar.update(total - counted[0])
    bar.close()
