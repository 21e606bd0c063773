"""SVD warm start (issue 62): a rebuild of a grown corpus starts the randomized SVD from the earlier
embeddings' basis, with fewer power iterations, and gets the cold SVD's vectors' quality."""

from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from lexiflow.models import svd, vectors
from lexiflow.models.evaluation import word_similarity
from lexiflow.storage import ArtifactStore
from lexiflow.storage.formats import read_matrix, read_table, read_vectors
from lexiflow.tasks.corpus import ingest_corpus
from lexiflow.tasks.embeddings import svd_embeddings, warm_start_basis
from lexiflow.tasks.matrices import compute_ppmi, count_cooccurrence
from lexiflow.tasks.params import CooccurrenceParams, CorpusParams, PPMIParams, SVDParams, VocabularyParams
from lexiflow.tasks.vocabulary import encode_corpus, learn_vocabulary

from tests.stages import publish

WIKITEXT = Path(__file__).resolve().parents[2] / "shared" / "data" / "wikitext-2" / "wiki.valid.tokens"


def test_a_warm_start_finds_the_cold_subspace_with_fewer_iterations():
    rng = np.random.default_rng(0)
    n, rank = 300, 12
    spectrum = np.geomspace(50, 1, rank)
    left, right = (np.linalg.qr(rng.standard_normal((n, rank)))[0] for _ in range(2))
    old = left @ np.diag(spectrum) @ right.T + 0.01 * rng.standard_normal((n, n))
    new = old + 0.05 * rng.standard_normal((n, n))  # the corpus grew a little
    earlier, _ = svd.svd_vectors(sp.csr_matrix(old), dim=8, n_iter=5)
    cold, cold_s = svd.svd_vectors(sp.csr_matrix(new), dim=8, n_iter=5)
    warm, warm_s = svd.svd_vectors(sp.csr_matrix(new), dim=8, n_iter=5, start=earlier)
    assert np.allclose(warm_s, cold_s, rtol=1e-3)
    assert np.allclose(np.abs(np.sum(warm * cold, axis=0)) / np.sum(cold * cold, axis=0), 1, atol=1e-3)
    assert svd.warm_iterations(5) < 5


@pytest.mark.skipif(not WIKITEXT.exists(), reason="needs ../shared/data/wikitext-2")
def test_warm_started_svd_embeddings_score_as_the_cold_ones_and_say_where_they_started(tmp_path):
    lines = [line for line in WIKITEXT.read_text(encoding="utf-8").splitlines() if line.strip()]
    folder = tmp_path / "sources"
    folder.mkdir()
    store = ArtifactStore(tmp_path / "store")

    def ppmi_of(n_lines: int):
        (folder / "wiki.txt").write_text("\n".join(lines[:n_lines]) + "\n", encoding="utf-8")
        docs = publish(store, ingest_corpus, params=CorpusParams(sources=[str(folder / "wiki.txt")]))
        words = publish(store, learn_vocabulary, corpus=docs, params=VocabularyParams())
        tokens = publish(store, encode_corpus, corpus=docs, tokenizer=words)
        counts = publish(store, count_cooccurrence, tokens=tokens, tokenizer=words, params=CooccurrenceParams())
        return publish(store, compute_ppmi, cooccurrence=counts, params=PPMIParams())

    params = SVDParams(dim=100)
    earlier = publish(store, svd_embeddings, ppmi=ppmi_of(int(len(lines) * 0.9)), params=params)
    grown = ppmi_of(len(lines))
    cold = publish(store, svd_embeddings, ppmi=grown, params=params)
    warm_params = SVDParams(dim=100, warm_start=True)
    warm = publish(store, svd_embeddings, ppmi=grown, params=warm_params)
    manifest = store.manifest("embeddings", warm.version)
    assert manifest["parameters"]["warm_start_from"] == earlier.version
    assert manifest["metrics"]["warm_start_from"] == earlier.version
    assert warm.version != cold.version
    # A rerun finds the same earlier embeddings: the same version, nothing rebuilt
    assert svd_embeddings.version_of({"store": store.url, "ppmi": grown, "params": warm_params}) == warm.version

    def scores(ref) -> dict[str, float]:
        words, counts, matrix = read_vectors(ref)
        kv = vectors.keyed_vectors(words, matrix, counts)
        return {name: word_similarity(kv, name)["spearman"] for name in ("ws353", "simlex999")}

    # No worse than cold. Not "within 0.005 either way": on this 1 MB corpus the scores move more than that
    # with the cold SVD's own convergence (WS-353 0.320 at 5 power iterations, 0.295 at 15; SimLex 0.035,
    # 0.023), and the warm start, the earlier SVD's iterations carried over, scored 0.387 and 0.036.
    cold_scores, warm_scores = scores(cold), scores(warm)
    for name in cold_scores:
        assert warm_scores[name] >= cold_scores[name] - 0.005, (name, cold_scores, warm_scores)
    # The subspace: the top singular values the warm start finds are the cold SVD's
    matrix = read_matrix(grown)
    _, cold_s = svd.svd_vectors(matrix, dim=100)
    _, warm_s = svd.svd_vectors(matrix, dim=100, start=warm_start_basis(store.url, earlier.version,
                                                                        read_table(grown, "vocab.parquet")))
    # (a range finder's singular values are lower bounds: larger is nearer the exact ones). Two warm iterations
    # here: the top 50 within 0.5 % of the cold SVD's (some 0.1-0.3 % below, others above), their sum above.
    assert (warm_s[:50] >= cold_s[:50] * (1 - 5e-3)).all() and warm_s.sum() >= cold_s.sum() * (1 - 1e-3)
