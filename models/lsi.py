"""Count-based models from the term–document matrix, as the summary sheet (notes 001) teaches them.

- TF-IDF weighting (Jurafsky & Martin, SLP3 §6.5): w(t, d) = log10(1 + count(t, d)) · log10(N / df(t)),
  N documents, df(t) the documents that hold t;
- the term–term matrix as X·Xᵀ of the term–document matrix X (the review question's "self dot-product":
  cell (a, b) = Σ_d count(a, d)·count(b, d)), beside the window counts of `cooccurrence`;
- LSI (Deerwester et al. 1990): X = T S Dᵀ by SVD, S sorted by decreasing value ("how important a
  concept is"); setting the small singular values to 0 gives the rank-k approximation X̂ (the best one
  in Frobenius norm, Eckart–Young); word vectors are rows of T·S^p (`models.svd`).
"""

from __future__ import annotations

from typing import Annotated, Literal

import numpy as np
import scipy.sparse as sp
from lexiflow.models.errors import ParameterError
from pydantic import Field

Weighting = Annotated[Literal["tfidf", "count"], Field(
    description="Term–document cells: tf-idf, log10(1 + count) · log10(N / df), or raw counts.")]


def tfidf(termdoc: sp.spmatrix) -> sp.csr_matrix:
    """log10(1 + count) · log10(N / df) of a (terms × documents) count matrix; a term in every document
    weighs 0 everywhere (it tells documents apart no better than chance)."""
    x = sp.csr_matrix(termdoc, dtype=np.float64)
    n_docs = x.shape[1]
    df = np.asarray((x > 0).sum(axis=1)).ravel()
    with np.errstate(divide="ignore"):
        idf = np.where(df > 0, np.log10(n_docs / np.maximum(df, 1)), 0.0)
    out = x.copy()
    out.data = np.log10(1 + out.data) * np.repeat(idf, np.diff(out.indptr))
    out.eliminate_zeros()
    return out


def weigh(termdoc: sp.spmatrix, weighting: Weighting = "tfidf") -> sp.csr_matrix:
    if weighting == "tfidf":
        return tfidf(termdoc)
    if weighting == "count":
        return sp.csr_matrix(termdoc, dtype=np.float64)
    raise ParameterError(f"lsi.weighting={weighting!r}: choose 'tfidf' or 'count'")


def term_term(termdoc: sp.spmatrix) -> sp.csr_matrix:
    """X·Xᵀ: cell (a, b) = Σ_d X[a, d]·X[b, d]; its row sums are the marginals of the notes' PPMI review."""
    x = sp.csr_matrix(termdoc, dtype=np.float64)
    return (x @ x.T).tocsr()


def reconstruct(t: np.ndarray, s: np.ndarray, d_t: np.ndarray, k: int | None = None,
                min_value: float = 0.0) -> np.ndarray:
    """X̂ = T S_k Dᵀ from an SVD (t, s, d_t = Dᵀ; s in decreasing order): singular values past the k-th or
    below `min_value` are set to 0."""
    if np.any(np.diff(s) > 0):
        raise ParameterError("singular values must come in decreasing order (as numpy and scikit-learn give them)")
    kept = np.where((np.arange(len(s)) < (len(s) if k is None else k)) & (s >= min_value), s, 0.0)
    return (t * kept) @ d_t
