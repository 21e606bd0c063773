import numpy as np
import pytest
import scipy.sparse as sp
from lexiflow.models.errors import ParameterError
from lexiflow.models.ppmi import ppmi_matrix
from lexiflow.models.svd import svd_vectors
from lexiflow.tasks.params import PPMIParams
from pydantic import ValidationError

COUNTS = np.array([[0.0, 2.0, 1.0], [2.0, 0.0, 0.0], [1.0, 0.0, 4.0]])


def test_ppmi_by_hand_alpha_1():
    # total 10; rows (3, 2, 5); P(w,c)/(P(w)P(c)) = X·total/(row·col)
    got = ppmi_matrix(sp.csr_matrix(COUNTS), alpha=1.0).toarray()
    expected = np.zeros((3, 3))
    expected[0, 1] = np.log(2 * 10 / (3 * 2))  # 1.204
    expected[1, 0] = np.log(2 * 10 / (2 * 3))
    expected[2, 2] = np.log(4 * 10 / (5 * 5))  # 0.470
    # (0,2): log(1·10/(3·5)) < 0 -> 0 ; (2,0) likewise
    np.testing.assert_allclose(got, expected, atol=1e-12)


def test_ppmi_by_hand_alpha_075_and_shift():
    col = np.array([3.0, 2.0, 5.0]) ** 0.75
    p_c = col / col.sum()
    got = ppmi_matrix(sp.csr_matrix(COUNTS), alpha=0.75).toarray()
    assert got[0, 1] == pytest.approx(np.log((2 / 10) / ((3 / 10) * p_c[1])))
    assert got[0, 2] == pytest.approx(max(0.0, np.log((1 / 10) / ((3 / 10) * p_c[2]))))
    assert got[2, 2] == pytest.approx(np.log((4 / 10) / ((5 / 10) * p_c[2])))
    shifted = ppmi_matrix(sp.csr_matrix(COUNTS), alpha=0.75, shift=2.0).toarray()
    np.testing.assert_allclose(shifted, np.maximum(got - np.log(2), 0) * (got > 0), atol=1e-12)


def test_ppmi_rejects_bad_parameters():
    with pytest.raises(ParameterError, match="alpha"):
        ppmi_matrix(sp.csr_matrix(COUNTS), alpha=0)
    with pytest.raises(ParameterError, match="empty"):
        ppmi_matrix(sp.csr_matrix((3, 3)))
    # The largest PMI (alpha 1) is log(20/6): a shift above 10/3 leaves nothing, so it is refused.
    assert ppmi_matrix(sp.csr_matrix(COUNTS), alpha=1.0, shift=3.3).nnz == 2
    with pytest.raises(ParameterError, match=r"ppmi.shift=3.4 leaves no positive cell .* below 3.33"):
        ppmi_matrix(sp.csr_matrix(COUNTS), alpha=1.0, shift=3.4)
    with pytest.raises(ValidationError, match="finite number"):  # inf would pass the bound shift >= 1
        PPMIParams(shift=float("inf"))


def test_svd_reconstructs_a_low_rank_matrix_and_is_deterministic():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(40, 3))
    m = sp.csr_matrix(a @ a.T)
    w, s = svd_vectors(m, dim=3, power=1.0, seed=1)
    u_exact, s_exact, _ = np.linalg.svd(a @ a.T)
    np.testing.assert_allclose(s, s_exact[:3], rtol=1e-4)
    np.testing.assert_allclose(np.abs(w), np.abs(u_exact[:, :3] * s_exact[:3]), rtol=1e-3, atol=1e-3)
    np.testing.assert_array_equal(w, svd_vectors(m, dim=3, power=1.0, seed=1)[0])
    with pytest.raises(ParameterError, match="svd.dim=40"):
        svd_vectors(m, dim=40)
