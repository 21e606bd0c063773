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
    start: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Return (word vectors float32 [rows × dim], singular values [dim]); `threads`: BLAS threads. `start`: a
    warm start, the word vectors of an earlier SVD of a matrix like this one (rows in this matrix's order, zero
    rows for words it did not have): subspace iteration from their basis (`warm_svd`) instead of from random."""
    if dim < 1 or dim >= min(matrix.shape):
        raise ParameterError(f"svd.dim={dim}: must be between 1 and {min(matrix.shape) - 1} for this vocabulary")
    # float32 halves the memory traffic of the sparse products that dominate the time.
    m = sp.csr_matrix(matrix, dtype=np.float32)
    iterations = n_iter if start is None else warm_iterations(n_iter)
    with limit_threads(threads, "svd.threads"), _estimated_progress(m, dim, iterations, progress):
        from sklearn.utils.extmath import randomized_svd  # imported here: 1-2 s a cached run need not pay

        if start is None:
            u, s, vt = randomized_svd(m, n_components=dim, n_iter=n_iter, random_state=seed)
        else:
            u, s, vt = warm_svd(m, dim, start, iterations, seed)
    scale = s**power
    vectors = u * scale
    if add_context:
        vectors = vectors + vt.T * scale
    return vectors.astype(np.float32), s


def warm_iterations(n_iter: int) -> int:
    """Power iterations of a warm start: a basis that already spans most of the top subspace needs fewer (on
    the WikiText-2 validation text's PPMI matrix, dim 100, grown by 10 %: 2 iterations found singular values at
    least the cold 5's, 1 fell 0.7 % short). 2·2 + 3 products of the matrix, against a cold SVD's 2·5 + 2."""
    return min(n_iter, max(2, n_iter // 2))


def warm_svd(m: sp.csr_matrix, dim: int, start: np.ndarray, n_iter: int, seed: int
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Randomized SVD (Halko, Martinsson & Tropp 2011, algorithm 4.4: subspace iteration) whose range finder
    starts from Mᵀ·`start` (the earlier left vectors' span carried to the right side), completed to dim +
    oversamples columns with Gaussian ones, instead of from random columns alone: u, s, vt of the top `dim`."""
    from scipy.linalg import lu, qr, svd
    from sklearn.utils.extmath import svd_flip

    size = min(dim + _OVERSAMPLES, min(m.shape))
    rng = np.random.default_rng(seed)
    basis = np.asarray(m.T @ np.asarray(start[:, :size], dtype=np.float32), dtype=np.float32)
    extra = size - basis.shape[1]
    if extra > 0:
        basis = np.hstack([basis, rng.standard_normal((m.shape[1], extra)).astype(np.float32)])
    q = qr(basis, mode="economic")[0]
    for _ in range(n_iter):  # as scikit-learn's range finder: LU between products, QR at the end
        q = lu(m @ q, permute_l=True)[0]
        q = lu(m.T @ q, permute_l=True)[0]
    q = qr(m @ q, mode="economic")[0]
    u_small, s, vt = svd(np.asarray((m.T @ q).T), full_matrices=False)
    u = q @ u_small
    u, vt = svd_flip(u, vt)
    return u[:, :dim], s[:dim], vt[:dim]


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
