import matplotlib.image
import numpy as np
import pytest
from lexiflow.models.embedding_plots import frequent_rows, plot_loss, plot_projection, project
from lexiflow.models.errors import InputError, ParameterError
from scipy.spatial.distance import pdist


def test_loss_png(tmp_path):
    history = [{"epoch": e, "loss": 1.0 / e} for e in range(1, 6)]
    path = plot_loss(history, tmp_path / "loss.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert matplotlib.image.imread(path).shape[:2] == (400, 600)  # 6x4 inches at 100 dpi
    with pytest.raises(InputError, match="empty"):
        plot_loss([], tmp_path / "none.png")


def test_pca_of_planar_vectors_preserves_distances():
    # Unit vectors in a 2-D subspace of R^6: PCA to 2-D is an isometry (known answer).
    rng = np.random.default_rng(0)
    angles = rng.uniform(0, 2 * np.pi, 40)
    basis, _ = np.linalg.qr(rng.normal(size=(6, 2)))
    vectors = np.stack([np.cos(angles), np.sin(angles)], 1) @ basis.T * rng.uniform(0.5, 3, (40, 1))
    xy = project(vectors, "pca")
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    np.testing.assert_allclose(pdist(xy), pdist(unit), atol=1e-9)
    with pytest.raises(ParameterError, match="method"):
        project(vectors, "umap")


def test_projection_draws_the_most_frequent_nonzero_rows(tmp_path):
    rng = np.random.default_rng(1)
    vectors = rng.normal(size=(60, 5)).astype(np.float32)
    vectors[[0, 1, 2, 3, 10]] = 0  # specials and an untrained word
    tokens = [f"w{i}" for i in range(60)]
    assert frequent_rows(vectors, 3, skip=2).tolist() == [6, 7, 8]
    words = plot_projection(vectors, tokens, tmp_path / "map.png", n_words=20, skip=1, methods=("pca", "tsne"))
    assert words == [f"w{i}" for i in [5, 6, 7, 8, 9] + list(range(11, 26))]
    assert matplotlib.image.imread(tmp_path / "map.png").shape[1] == 2 * 11 * 80  # two panels
