import numpy as np
import polars as pl
import pytest
from gensim.test.utils import datapath
from lexiflow.models import evaluation
from lexiflow.models.cooccurrence import cooccurrence_matrix, id_stream
from lexiflow.models.ingest import IngestOptions, build_corpus, resolve_sources
from lexiflow.models.ppmi import ppmi_matrix
from lexiflow.models.svd import svd_vectors
from lexiflow.models.vectors import keyed_vectors, reweight_spectrum
from lexiflow.models.vocab import SPECIALS, Vocabulary, sentence_tokens


@pytest.fixture(scope="module")
def enwiki_svd():
    """The default pipeline's models on the default corpus (gensim's Wikipedia excerpt)."""
    corpus = build_corpus(resolve_sources(["builtin:enwiki"]), IngestOptions())
    sentences = sentence_tokens(corpus.documents)
    vocab = Vocabulary.count(sentences.filter(pl.col("split") == "train")["words"], min_count=5)
    ids, offsets = id_stream(vocab.encode_batch(sentences["words"], is_pretokenized=True), min_id=len(SPECIALS))
    counts = cooccurrence_matrix(ids, offsets, len(vocab), window=5)
    vectors, _ = svd_vectors(ppmi_matrix(counts, 0.75), dim=300, seed=0)
    return keyed_vectors(vocab.tokens[len(SPECIALS):], vectors[len(SPECIALS):])


@pytest.mark.slow
def test_svd_on_default_corpus_clears_the_ws353_floor(enwiki_svd):
    ws = evaluation.word_similarity(enwiki_svd, "ws353")
    assert ws["spearman"] > 0.3  # a floor, not the goal
    assert ws["oov_rate"] < 0.5


def _questions(n_per_section=150):
    q = evaluation.read_analogies()
    return q.group_by("section", maintain_order=True).head(n_per_section)


@pytest.mark.slow
def test_3cosadd_equals_gensim_on_the_same_vectors(enwiki_svd, tmp_path):
    questions = _questions()
    path = tmp_path / "q.txt"
    lines = []
    for section, group in questions.group_by("section", maintain_order=True):
        lines.append(f": {section[0]}")
        lines += [" ".join(r) for r in group.select("a", "b", "c", "d").iter_rows()]
    path.write_text("\n".join(lines) + "\n")
    ours = evaluation.analogies(enwiki_svd, restrict_vocab=8000, questions=questions)
    gensim_acc, sections = enwiki_svd.evaluate_word_analogies(str(path), restrict_vocab=8000)
    covered = sum(len(s["correct"]) + len(s["incorrect"]) for s in sections if s["section"] == "Total accuracy")
    assert ours.covered == covered > 50
    assert ours.add_accuracy == pytest.approx(gensim_acc, abs=1e-12)


@pytest.mark.slow
def test_3cosmul_equals_gensim_most_similar_cosmul(enwiki_svd):
    q = evaluation.read_analogies()
    vocab = set(enwiki_svd.index_to_key[:5000])
    rows = [r for r in q.select("a", "b", "c", "d").iter_rows() if set(r) <= vocab][:60]
    questions = pl.DataFrame(rows, schema=["a", "b", "c", "d"], orient="row").with_columns(section=pl.lit("s"))
    ours = evaluation.analogies(enwiki_svd, restrict_vocab=5000, questions=questions)
    expected = np.mean([
        next(w for w, _ in enwiki_svd.most_similar_cosmul(positive=[b, c], negative=[a], topn=5,
                                                           restrict_vocab=5000) if w not in (a, b, c)) == d
        for a, b, c, d in rows])
    assert ours.mul_accuracy == pytest.approx(expected)


def test_similarity_uses_gensim_word_pairs_and_reports_oov():
    words = ["tiger", "cat", "king", "queen", "car", "automobile"]
    rng = np.random.default_rng(0)
    kv = keyed_vectors(words, rng.normal(size=(6, 4)))
    res = evaluation.word_similarity(kv, "ws353")
    assert 0 < res["oov_rate"] < 1
    assert -1 <= res["spearman"] <= 1
    assert datapath("wordsim353.tsv")


def test_untrained_zero_rows_change_no_figure():
    # GloVe leaves words it never trained as zero rows; a zero vector has no cosine, so it must count
    # as out of vocabulary, not win every argmax as NaN (which scored every analogy wrong).
    words = ["king", "queen", "man", "woman", "tiger", "cat"]
    vectors = np.array([[1, 1, 0], [1, 0, 1], [0, 1, 0], [0, 0, 1], [0.3, 0.2, 0.9], [0.2, 0.3, 0.8]])
    questions = pl.DataFrame([("man", "woman", "king", "queen")], schema=["a", "b", "c", "d"],
                             orient="row").with_columns(section=pl.lit("s"))
    trained = evaluation.analogies(keyed_vectors(words, vectors), questions=questions)
    ghost = keyed_vectors(words + ["ghost", "cat2"], np.vstack([vectors, np.zeros((2, 3))]))
    with_ghost = evaluation.analogies(ghost, questions=questions)
    assert trained.add_accuracy == with_ghost.add_accuracy == with_ghost.mul_accuracy == 1.0
    assert evaluation.word_similarity(ghost, "ws353") == evaluation.word_similarity(keyed_vectors(words, vectors),
                                                                                    "ws353")


def test_text_export_reads_back_as_gensims_own(tmp_path):
    """`save_text` against gensim's `save_word2vec_format(binary=False)` on the same vectors: the same words in
    the same order (by count, ties kept, zero rows left out) and every value the same float32."""
    from gensim.models import KeyedVectors
    from lexiflow.models.vectors import save_text

    rng = np.random.default_rng(3)
    scale = rng.choice([1e-7, 1e-3, 1.0, 1e6], size=(7, 4))
    vectors = (rng.standard_normal((7, 4)) * scale).astype(np.float32)
    vectors[2] = 0  # dropped by keyed_vectors
    vectors[4, 0] = -0.0
    kv = keyed_vectors(["the", "é", "zero", "b", "c", "ties", "x"], vectors, np.array([9, 5, 5, 7, 5, 1, 5]))
    save_text(kv, str(tmp_path / "ours.txt"))
    kv.save_word2vec_format(str(tmp_path / "gensim.txt"), binary=False)
    ours, theirs = (KeyedVectors.load_word2vec_format(str(tmp_path / name)) for name in ("ours.txt", "gensim.txt"))
    assert ours.index_to_key == theirs.index_to_key == ["the", "b", "é", "c", "x", "ties"]
    np.testing.assert_array_equal(ours.vectors, theirs.vectors)
    lines = (tmp_path / "ours.txt").read_text(encoding="utf-8").splitlines()
    assert lines[0] == "6 4" and len(lines) == 7 and all(len(line.split(" ")) == 5 for line in lines[1:])


def test_report_lists_metrics_and_neighbours():
    words = [f"w{i}" for i in range(20)] + ["king"]  # no WS353/SimLex word but king: NaN, not a crash
    kv = keyed_vectors(words, np.random.default_rng(1).normal(size=(21, 5)))
    res = evaluation.evaluate(kv, restrict_vocab=100, probes=["king", "absent"])
    md = evaluation.report_markdown("Title", {"svd": res})
    assert "| svd |" in md and "**king**" in md and "absent" not in md
    assert res["neighbours"].height == 8


def test_reweight_spectrum_raises_the_singular_values_to_the_power():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 5)).astype(np.float32) * np.array([5, 3, 2, 1, 0.5], dtype=np.float32)
    x[7] = 0.0
    u, s, vt = np.linalg.svd(x.astype(np.float64), full_matrices=False)
    for power in (0.5, 2.0, 3.0):
        want = (u * s**power) @ vt / s[0] ** (power - 1)  # U Σ^p Vᵀ, the leading singular value kept
        got = reweight_spectrum(x, power)
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        assert not got[7].any()
    assert reweight_spectrum(x, 1.0) is x
    # Rank-deficient: a direction with no variance is dropped, not blown up by σ^(p-1) with p < 1.
    flat = np.hstack([x[:, :3], np.zeros((40, 2), dtype=np.float32)])
    got = reweight_spectrum(flat, 0.5)
    assert np.isfinite(got).all() and not got[:, 3:].any()
    assert not reweight_spectrum(np.zeros((3, 2), dtype=np.float32), 2.0).any()


def test_evaluation_stage_of_a_toy_vocabulary_leaves_out_only_the_map(tmp_path):
    # Three trained words: too few for a PCA/t-SNE map and no analogy covered. The stage still
    # publishes every metric, says why the map is missing, and reports the analogy accuracy as
    # missing ("–"), not as 0 %.
    from lexiflow.storage import ArtifactStore
    from lexiflow.tasks.embeddings import write_embeddings
    from lexiflow.tasks.evaluation import evaluate_embeddings
    from lexiflow.tasks.params import EvaluationParams

    from tests.stages import publish

    store = ArtifactStore(str(tmp_path))
    words = ["king", "queen", "tiger"]
    frame = pl.DataFrame({"id": range(len(SPECIALS) + 3), "token": [*SPECIALS, *words],
                          "count": [0] * len(SPECIALS) + [9, 8, 7]})
    vectors = np.vstack([np.zeros((len(SPECIALS), 4)), np.random.default_rng(0).normal(size=(3, 4))])
    with store.writer("embeddings", "0123456789abcdef") as out:
        write_embeddings(out, frame, vectors.astype(np.float32), "svd")
    ref = publish(store, evaluate_embeddings, embeddings=store.ref("embeddings", "0123456789abcdef"),
                  params=EvaluationParams(analogy_vocabulary=100, probes=["king"]))
    metrics = store.manifest(ref.kind, ref.version)["metrics"]
    assert metrics["analogy_coverage"] == 0 and metrics["analogy_add_accuracy"] is None  # NaN: null in JSON
    assert metrics["analogy_mul_accuracy"] is None and metrics["vocabulary"] == 3
    assert np.isnan(store.read_parquet(ref.kind, ref.version, "metrics.parquet")["analogy_add_accuracy"][0])
    assert not (tmp_path / "evaluation" / ref.version / "projection.png").exists()
    report = store.read_text(ref.kind, ref.version, "report.md")
    assert "No PCA/t-SNE map: 3 trained words, a map needs at least 5." in report
    assert "| – | – | 0.000 | 3 |" in report and "**king**" in report  # 3CosAdd, 3CosMul, coverage, words
