"""models.lsi: tf-idf, the term-term matrix X·Xᵀ and LSI's rank-k reconstruction (notes 001, "Latent
Semantic Indexing" and the PPMI review question), by hand and against numpy."""

import math

import numpy as np
import pytest
import scipy.sparse as sp
from lexiflow.models.errors import ParameterError
from lexiflow.models.lsi import reconstruct, term_term, tfidf, weigh
from lexiflow.models.ppmi import ppmi_matrix
from lexiflow.models.svd import svd_vectors

# 4 terms x 3 documents
X = np.array([[1, 0, 2],
              [0, 3, 0],
              [1, 1, 1],   # in every document: idf 0
              [0, 0, 5]], dtype=float)


def test_tfidf_by_hand():
    w = tfidf(sp.csr_matrix(X)).toarray()
    assert w[0, 0] == pytest.approx(math.log10(2) * math.log10(3 / 2))
    assert w[0, 2] == pytest.approx(math.log10(3) * math.log10(3 / 2))
    assert w[1, 1] == pytest.approx(math.log10(4) * math.log10(3))
    assert w[3, 2] == pytest.approx(math.log10(6) * math.log10(3))
    assert not w[2].any() and w[0, 1] == 0
    np.testing.assert_array_equal(weigh(sp.csr_matrix(X), "count").toarray(), X)
    with pytest.raises(ParameterError, match="weighting"):
        weigh(sp.csr_matrix(X), "bm25")


def test_term_term_is_x_xt_and_its_marginals_feed_ppmi():
    tt = term_term(sp.csr_matrix(X)).toarray()
    np.testing.assert_array_equal(tt, X @ X.T)
    np.testing.assert_array_equal(tt, tt.T)  # symmetric: row sums = column sums, as in the review's table
    total, rows = tt.sum(), tt.sum(axis=1)
    p = ppmi_matrix(sp.csr_matrix(tt), alpha=1.0, log_base=2).toarray()
    expected = np.maximum(np.log2(tt * total / np.outer(rows, rows), where=tt > 0, out=np.full_like(tt, -1)), 0)
    np.testing.assert_allclose(p, expected, atol=1e-12)


def test_rank_k_reconstruction_is_the_best_rank_k_approximation():
    rng = np.random.default_rng(0)
    a = rng.poisson(1.0, size=(12, 9)).astype(float)
    t, s, d_t = np.linalg.svd(a, full_matrices=False)
    np.testing.assert_allclose(reconstruct(t, s, d_t), a, atol=1e-10)  # nothing dropped: X itself
    for k in (1, 3, 5):
        approx = reconstruct(t, s, d_t, k)
        assert np.linalg.matrix_rank(approx) == k
        # Eckart-Young: the error is the dropped singular values
        assert np.linalg.norm(a - approx) == pytest.approx(math.sqrt((s[k:] ** 2).sum()))
    # dropping the small values (below a threshold) = keeping the top ones
    cut = s[3] - 1e-9
    np.testing.assert_allclose(reconstruct(t, s, d_t, min_value=cut), reconstruct(t, s, d_t, 4))
    with pytest.raises(ParameterError, match="decreasing"):
        reconstruct(t, s[::-1], d_t)


def test_lsi_vectors_are_t_times_s_of_the_term_document_svd():
    rng = np.random.default_rng(1)
    a = sp.csr_matrix(rng.poisson(0.8, size=(40, 25)).astype(float))
    w = tfidf(a)
    vectors, s = svd_vectors(w, dim=5, power=1.0, n_iter=10)
    t, s_full, _ = np.linalg.svd(w.toarray(), full_matrices=False)
    np.testing.assert_allclose(s, s_full[:5], rtol=1e-4)
    # T S up to the sign of each column
    np.testing.assert_allclose(np.abs(vectors), np.abs(t[:, :5] * s_full[:5]), atol=1e-4)
