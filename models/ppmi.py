"""Positive pointwise mutual information with context-distribution smoothing.

PPMI(w, c) = max(0, log[ P(w, c) / (P(w) · P_α(c)) ] − log k)

with P(w, c) = X_wc / ΣX, P(w) = Σ_c X_wc / ΣX, and the smoothed context distribution
P_α(c) = (Σ_w X_wc)^α / Σ_c' (Σ_w X_wc')^α (Levy, Goldberg & Dagan 2015, "Improving
Distributional Similarity with Lessons Learned from Word Embeddings"; α = 0.75 as in word2vec's
negative sampling). k ≥ 1 is the shift (SPPMI; k = 1 is plain PPMI). Only nonzero counts can be
positive, so the work is on the sparse entries alone.
"""

from __future__ import annotations

from typing import Annotated

import numpy as np
import scipy.sparse as sp
from lexiflow.models.errors import ParameterError
from pydantic import Field


def ppmi_matrix(
    counts: sp.spmatrix,
    alpha: Annotated[float, Field(gt=0, le=1, description="Context-distribution smoothing exponent "
                                                          "(1 = none).")] = 0.75,
    shift: Annotated[float, Field(ge=1, description="Shift k: subtract log k (1 = plain PPMI).")] = 1.0,
) -> sp.csr_matrix:
    if not 0 < alpha <= 1:
        raise ParameterError(f"ppmi.alpha={alpha}: must be in (0, 1]")
    if shift < 1:
        raise ParameterError(f"ppmi.shift={shift}: must be at least 1 (1 = no shift)")
    coo = sp.coo_matrix(counts, dtype=np.float64)
    coo.sum_duplicates()
    total = coo.sum()
    if total <= 0:
        raise ParameterError("the co-occurrence matrix is empty: the corpus is too small for this window/min count")
    row_sums = np.asarray(coo.sum(axis=1)).ravel()
    col_smoothed = np.asarray(coo.sum(axis=0)).ravel() ** alpha
    p_context = col_smoothed / col_smoothed.sum()
    # log(X_wc / total) - log(row_w / total) - log(P_α(c)) = log X_wc - log row_w - log P_α(c)
    pmi = np.log(coo.data) - np.log(row_sums[coo.row]) - np.log(p_context[coo.col]) - np.log(shift)
    keep = pmi > 0
    if not keep.any():  # every embedding built on it would be zero
        largest = pmi.max() + np.log(shift)  # unshifted
        raise ParameterError(f"ppmi.shift={shift} leaves no positive cell (the largest PMI is {largest:.2f} nats, "
                             f"so use a shift below {np.exp(largest):.3g})")
    return sp.csr_matrix((pmi[keep], (coo.row[keep], coo.col[keep])), shape=coo.shape)
