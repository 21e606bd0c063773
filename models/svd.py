"""Truncated SVD of a (PPMI or term–document) matrix into word vectors (LSA/LSI).

M ≈ U Σ Vᵀ; word vectors are U Σ^p (p = 0.5 by default: Levy, Goldberg & Dagan 2015 found
symmetric weighting better than the classic p = 1), optionally plus the context vectors V Σ^p.
Randomized SVD (Halko, Martinsson & Tropp 2011) via scikit-learn; `svd_flip` makes signs
deterministic for a given seed.
"""

from __future__ import annotations

from typing import Annotated

import numpy as np
import scipy.sparse as sp
from lexiflow.models.errors import ParameterError
from pydantic import Field
from sklearn.utils.extmath import randomized_svd


def svd_vectors(
    matrix: sp.spmatrix,
    dim: Annotated[int, Field(ge=2, le=2000, description="Embedding dimension.")] = 300,
    power: Annotated[float, Field(ge=0, le=1, description="Vectors are U·S^power.")] = 0.5,
    add_context: Annotated[bool, Field(description="Add the context vectors V·S^power.")] = False,
    n_iter: Annotated[int, Field(ge=1, le=50, description="Power iterations of the randomized SVD.")] = 5,
    seed: Annotated[int, Field(ge=0, description="Random seed.")] = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Return (word vectors float32 [rows × dim], singular values [dim])."""
    if dim < 1 or dim >= min(matrix.shape):
        raise ParameterError(f"svd.dim={dim}: must be between 1 and {min(matrix.shape) - 1} for this vocabulary")
    # float32 halves the memory traffic of the sparse products that dominate the time.
    u, s, vt = randomized_svd(sp.csr_matrix(matrix, dtype=np.float32), n_components=dim, n_iter=n_iter,
                              random_state=seed)
    scale = s**power
    vectors = u * scale
    if add_context:
        vectors = vectors + vt.T * scale
    return vectors.astype(np.float32), s
