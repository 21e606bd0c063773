import itertools

import numpy as np
import polars as pl
import pytest
import scipy.sparse as sp
import torch
from lexiflow.models.conllu import read_conllu
from lexiflow.models.cooccurrence import cooccurrence_matrix
from lexiflow.models.device import resolve_device
from lexiflow.models.errors import InputError, ParameterError
from lexiflow.models.glove import (
    GloVe,
    GloVeConfig,
    add_context_gradients,
    initial_parameters,
    noise_table,
    weighting,
)
from lexiflow.models.vectors import reweight_spectrum
from lexiflow.models.vocab import Vocabulary

torch.set_num_threads(1)
AS_TRAINED = {"spectrum_power": 1.0}  # hand-computed steps check the trained w + w̃, not its reweighting

# A 3-word co-occurrence matrix with one cell above x_max and an empty 4th row/column (a "special").
X = sp.csr_matrix(np.array([
    [0.0, 4.0, 0.5, 0.0],
    [4.0, 2.0, 12.0, 0.0],
    [0.5, 12.0, 0.0, 0.0],
    [0.0, 0.0, 0.0, 0.0],
]))


def test_weighting_known_values():
    x = np.array([0.0, 0.5, 5.0, 10.0, 20.0])
    want = np.array([0.0, 0.05**0.75, 0.5**0.75, 1.0, 1.0])  # x_max 10, alpha 0.75
    np.testing.assert_allclose(weighting(x, 10.0, 0.75), want, rtol=1e-12)
    np.testing.assert_allclose(weighting(torch.tensor(x), 10.0, 0.75).numpy(), want, rtol=1e-12)
    np.testing.assert_allclose(weighting(np.array([2.0]), 4.0, 1.0), [0.5])


def _hand_gradient(x_max, alpha, dim, seed):
    """Initial parameters, full-batch gradients of J w.r.t. w and w̃, and the mean loss, cell by cell (float64)."""
    w, c, b, bc = (p.astype(np.float64) for p in initial_parameters(4, dim, seed))
    gw, gc = np.zeros_like(w), np.zeros_like(c)
    loss = 0.0
    cells = [(i, j, X[i, j]) for i in range(4) for j in range(4) if X[i, j] > 0]
    for i, j, x in cells:
        f = min(1.0, (x / x_max) ** alpha)
        diff = w[i] @ c[j] + b[i] + bc[j] - np.log(x)
        loss += f * diff**2
        gw[i] += 2 * f * diff * c[j]
        gc[j] += 2 * f * diff * w[i]
    return (w, c), (gw, gc), loss / len(cells)


def _hand_step(x_max, alpha, lr, dim, seed, init):
    """One full-batch AdaGrad step (Duchi et al.): G = G0 + g², θ -= lr·g / sqrt(G); returns w + w̃."""
    (w, c), (gw, gc), loss = _hand_gradient(x_max, alpha, dim, seed)
    w1 = w - lr * gw / np.sqrt(init + gw**2)
    c1 = c - lr * gc / np.sqrt(init + gc**2)
    return w1 + c1, loss, (w, c)


def test_one_adagrad_step_matches_hand_computation():
    model = GloVe(dim=3, **AS_TRAINED, x_max=10.0, alpha=0.75, epochs=1, lr=0.3, adagrad_init=0.01, batch_size=64,
                  negative=0, device="cpu", seed=7).fit(X)
    want, want_loss, (w0, c0) = _hand_step(10.0, 0.75, 0.3, 3, 7, init=0.01)
    np.testing.assert_allclose(model.vectors_[:3], want[:3], rtol=1e-5, atol=1e-7)
    assert model.history_[0]["loss"] == pytest.approx(want_loss, rel=1e-6)
    # The step moved the vectors (so the comparison is not trivially the initial point).
    assert np.abs(model.vectors_[:3] - (w0 + c0)[:3]).max() > 1e-3
    # The empty row (a special token) is untrained: zero, not its random init.
    assert np.array_equal(model.vectors_[3], np.zeros(3, dtype=np.float32))
    assert model.vectors_.dtype == np.float32 and model.vectors_.shape == (4, 3)


def test_glove_c_adagrad_is_lr_one_with_initial_accumulator_one_over_eta_squared():
    # glove.c: u = eta·g, G = 1 + u², θ -= u / sqrt(G)  ==  AdaGrad with lr 1 and G0 = 1/eta².
    eta = 0.3
    model = GloVe(dim=3, **AS_TRAINED, x_max=10.0, epochs=1, lr=1.0, adagrad_init=1 / eta**2, batch_size=64, negative=0,
                  device="cpu", seed=7).fit(X)
    (w, c), (gw, gc), _ = _hand_gradient(10.0, 0.75, 3, 7)
    u_w, u_c = eta * gw, eta * gc
    glove_c = (w - u_w / np.sqrt(1 + u_w**2)) + (c - u_c / np.sqrt(1 + u_c**2))
    np.testing.assert_allclose(model.vectors_[:3], glove_c[:3], rtol=1e-5, atol=1e-7)
    # ... and differs from the same lr with the default accumulator (the test can fail)
    other = GloVe(dim=3, **AS_TRAINED, x_max=10.0, epochs=1, lr=1.0, batch_size=64, negative=0, device="cpu",
                  seed=7).fit(X)
    assert np.abs(other.vectors_[:3] - glove_c[:3]).max() > 1e-3


def test_first_adam_step_is_lr_times_gradient_sign():
    # Bias-corrected Adam's first step is lr·g/(|g|+eps) = lr·sign(g) for every touched parameter.
    model = GloVe(dim=3, **AS_TRAINED, epochs=1, lr=0.01, batch_size=64, optimizer="adam", negative=0, device="cpu",
                  seed=7).fit(X)
    w, c, *_ = initial_parameters(4, 3, 7)
    moved = model.vectors_[:3] - (w + c)[:3]
    # each of w and w̃ moves by exactly ±lr per coordinate, so w + w̃ moves by 0 or ±2·lr
    np.testing.assert_allclose(np.abs(moved) / 0.01, np.round(np.abs(moved) / 0.01), atol=1e-3)
    assert set(np.round(np.abs(moved) / 0.01).ravel().tolist()) <= {0.0, 2.0}


def test_one_step_with_unobserved_cells_matches_hand_computation():
    # negative=2: each observed cell brings two cells of its row word with contexts drawn ∝ count^0.75
    # (replayed here from the same generator), penalised by max(0, prediction - log(0.6 · x_min))², x_min = 0.5.
    k, lr, init, seed = 2, 0.3, 0.01, 7
    model = GloVe(dim=3, **AS_TRAINED, x_max=10.0, epochs=1, lr=lr, adagrad_init=init, batch_size=64, negative=k,
                  negative_weight=0.7, negative_bound=0.6, device="cpu", seed=seed).fit(X)
    w, c, b, bc = (p.astype(np.float64) for p in initial_parameters(4, 3, seed))
    coo = X.tocoo()
    rows, cols, counts = coo.row, coo.col, coo.data
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(counts), generator=gen).numpy()
    table = noise_table(np.array([X[:, m].sum() for m in range(4)]) ** 0.75)
    drawn = table[torch.randint(len(table), (len(counts), k), generator=gen).numpy()]  # (cells, k)
    assert 3 not in drawn and len(set(drawn.ravel())) > 1  # the empty column is never drawn
    cells = [(rows[o], cols[o], np.log(counts[o]), min(1.0, (counts[o] / 10.0) ** 0.75), False) for o in order]
    cells += [(rows[o], m, np.log(0.6 * 0.5), 0.7, True) for o, ms in zip(order, drawn, strict=True) for m in ms]
    gw, gc = np.zeros_like(w), np.zeros_like(c)
    loss = unobserved = 0.0
    for i, j, target, f, censored in cells:
        diff = w[i] @ c[j] + b[i] + bc[j] - target
        diff = max(diff, 0.0) if censored else diff
        unobserved, loss = (unobserved + f * diff**2, loss) if censored else (unobserved, loss + f * diff**2)
        gw[i] += 2 * f * diff * c[j]
        gc[j] += 2 * f * diff * w[i]
    want = (w - lr * gw / np.sqrt(init + gw**2)) + (c - lr * gc / np.sqrt(init + gc**2))
    np.testing.assert_allclose(model.vectors_[:3], want[:3], rtol=1e-5, atol=1e-7)
    assert model.history_[0]["loss"] == pytest.approx(loss / len(order), rel=1e-6)
    assert model.history_[0]["unobserved_loss"] == pytest.approx(unobserved / drawn.size, rel=1e-6)
    assert unobserved > 0  # near-zero initial predictions sit above log 0.3: the term is active here
    paper = GloVe(dim=3, **AS_TRAINED, x_max=10.0, epochs=1, lr=lr, adagrad_init=init, batch_size=64, negative=0,
                  device="cpu", seed=seed).fit(X)
    assert np.abs(paper.vectors_[:3] - want[:3]).max() > 1e-3 and "unobserved_loss" not in paper.history_[0]


def test_context_gradients_of_the_gpu_path_equal_the_cpu_path():
    # CUDA scatters every drawn cell (zeros included) to avoid a sync; the CPU only the active ones.
    gen = torch.Generator().manual_seed(0)
    drawn = torch.randint(0, 6, (50, 3), generator=gen)
    gn = torch.rand(50, 3, generator=gen).sub_(0.6).clamp_(min=0)  # ~60 % inactive, as late in training
    wi = torch.rand(50, 4, generator=gen)
    want_w, want_b = torch.zeros(6, 4, dtype=torch.float64), torch.zeros(6, dtype=torch.float64)
    for c in range(50):
        for s in range(3):
            want_w[drawn[c, s]] += gn[c, s].double() * wi[c].double()
            want_b[drawn[c, s]] += gn[c, s].double()
    for only_active in (True, False):
        g_w, g_b = torch.zeros(6, 4), torch.zeros(6)
        add_context_gradients(g_w, g_b, drawn, gn, wi, only_active=only_active)
        torch.testing.assert_close(g_w.double(), want_w, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(g_b.double(), want_b, rtol=1e-6, atol=1e-6)


def test_noise_table_draws_in_proportion_to_mass():
    mass = np.array([0.0, 3.0, 1.0, 0.0, 6.0])
    table = noise_table(mass, size=1000)
    assert len(table) == 1000 and np.bincount(table, minlength=5).tolist() == [0, 300, 100, 0, 600]
    # ids with tiny mass still get their rounded share, and the table is filled exactly
    assert np.bincount(noise_table(np.array([1.0, 1.0, 1.0]), size=10), minlength=3).tolist() == [3, 3, 4]


def test_unobserved_cells_predicted_below_the_smallest_count_cost_nothing():
    # Counts of 4 and more: the bound log(0.5 · x_min) = log 2 > 0 lies above every initial prediction
    # (~0), so the one-sided term is zero and the first full-batch step is the paper's.
    X2 = X.copy()
    X2.data = np.where(X2.data < 4, 4.0, X2.data)
    args = dict(dim=3, x_max=10.0, epochs=1, lr=0.3, batch_size=64, device="cpu", seed=7)
    ours, paper = GloVe(negative=3, **args).fit(X2), GloVe(negative=0, **args).fit(X2)
    np.testing.assert_array_equal(ours.vectors_, paper.vectors_)
    assert ours.history_[0]["unobserved_loss"] == 0.0


@pytest.fixture(scope="module")
def ewt_matrix(shared_data):
    sentences = itertools.islice(read_conllu(shared_data / "ud-english-ewt" / "en_ewt-ud-train.conllu"), 2000)
    words = [[w.lower() for w in s.words] for s in sentences]
    tokens = pl.Series("tokens", words)
    vocab = Vocabulary.count(tokens, min_count=3)
    ids = vocab.encode_batch(tokens, is_pretokenized=True)
    offsets = np.concatenate(([0], np.cumsum(ids.list.len().to_numpy())))
    return cooccurrence_matrix(ids.explode().to_numpy(), offsets, len(vocab), window=5)


def test_loss_decreases_on_real_text(ewt_matrix):
    seen = []
    model = GloVe(dim=16, epochs=6, batch_size=4096, device="cpu")
    model.fit(ewt_matrix, on_epoch=lambda rec, vec: seen.append((rec, vec)))
    # the objective per observed cell: the observed cells' loss plus their `negative` unobserved cells'
    losses = [h["loss"] + model.negative * h["unobserved_loss"] for h in model.history_]
    assert [rec for rec, _ in seen] == model.history_
    assert np.array_equal(seen[-1][1], model.vectors_) and not np.array_equal(seen[0][1], model.vectors_)
    assert all(b < a for a, b in zip(losses, losses[1:], strict=False)), losses
    assert losses[-1] < 0.65 * losses[0]  # defaults: 4.5 -> 2.0 here
    assert [h["epoch"] for h in model.history_] == list(range(1, 7))
    assert all(h["cells_per_s"] > 0 and h["seconds"] > 0 for h in model.history_)
    assert np.isfinite(model.vectors_).all()
    # Rows without any co-occurrence (<s> </s> <pad>; words only seen alone) are zero, all others trained.
    has_cells = np.asarray((ewt_matrix != 0).sum(axis=1)).ravel() > 0
    assert not has_cells[1:4].any() and has_cells[0]  # <unk> stands for the rare words here
    assert not model.vectors_[~has_cells].any()
    assert model.vectors_[has_cells].any(axis=1).all()


def test_output_is_the_trained_sum_with_its_singular_values_raised_to_spectrum_power(ewt_matrix):
    def fit(power):
        return GloVe(dim=12, epochs=2, batch_size=4096, device="cpu", spectrum_power=power).fit(ewt_matrix).vectors_

    trained, default = fit(1.0), fit(GloVeConfig.spectrum_power)
    np.testing.assert_allclose(default, reweight_spectrum(trained, GloVeConfig.spectrum_power), rtol=1e-5, atol=1e-6)
    s_trained = np.linalg.svd(trained, compute_uv=False)
    s_default = np.linalg.svd(default, compute_uv=False)
    np.testing.assert_allclose(s_default / s_default[0], (s_trained / s_trained[0]) ** GloVeConfig.spectrum_power,
                               rtol=1e-4, atol=1e-6)
    assert np.array_equal(default.any(axis=1), trained.any(axis=1))  # untrained rows stay zero


def test_deterministic_with_a_seed_on_cpu(ewt_matrix):
    def fit(seed):
        return GloVe(dim=10, epochs=2, batch_size=4096, device="cpu", seed=seed).fit(ewt_matrix)

    a, b, c = fit(3), fit(3), fit(4)
    assert np.array_equal(a.vectors_, b.vectors_)
    assert [h["loss"] for h in a.history_] == [h["loss"] for h in b.history_]
    assert not np.array_equal(a.vectors_, c.vectors_)


def test_params_and_devices():
    params = GloVe(dim=50, x_max=5.0).get_params()
    assert params == GloVe(**params).get_params()
    assert params["dim"] == 50 and params["x_max"] == 5.0 and params["optimizer"] == "adagrad"
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ParameterError, match="device"):
            GloVe(device="cuda").fit(X)


def test_bad_input_and_parameters():
    with pytest.raises(InputError, match="square"):
        GloVe().fit(sp.csr_matrix(np.ones((2, 3))))
    with pytest.raises(InputError, match="nonzero"):
        GloVe().fit(sp.csr_matrix((3, 3)))
    with pytest.raises(InputError, match="scipy.sparse"):
        GloVe().fit(np.ones((3, 3)))
    with pytest.raises(ParameterError, match="x_max"):
        GloVe(x_max=0).fit(X)
    with pytest.raises(ParameterError, match="optimizer"):
        GloVe(optimizer="sgd").fit(X)
    with pytest.raises(ParameterError, match="adagrad_init"):
        GloVe(adagrad_init=0.0).fit(X)
    with pytest.raises(ParameterError, match="negative=-1"):
        GloVe(negative=-1).fit(X)
    with pytest.raises(ParameterError, match="spectrum_power=0"):
        GloVe(spectrum_power=0).fit(X)
    with pytest.raises(ParameterError, match="negative_bound=1.5"):
        GloVe(negative_bound=1.5).fit(X)


def test_pipeline_parameters_default_to_the_model_defaults():
    # the documented defaults (docs/embeddings.md) are what both `GloVe()` and the pipeline's glove.* give
    from dataclasses import asdict

    from lexiflow.tasks.params import GloVeParams

    assert GloVeParams().model_dump(exclude={"continue_from"}) == asdict(GloVeConfig()) == GloVe().get_params()
    assert GloVeParams().continue_from == ""  # trained from random unless asked
    assert (GloVeConfig.x_max, GloVeConfig.epochs, GloVeConfig.lr, GloVeConfig.adagrad_init, GloVeConfig.negative,
            GloVeConfig.negative_weight, GloVeConfig.negative_bound, GloVeConfig.spectrum_power) == \
        (0.5, 20, 0.1, 1.0, 5, 1.0, 0.5, 1.5)


def test_glove_stage_reports_corpus_words_per_second_beside_cells_per_second(tmp_path):
    # words/s is the speed unit of every method: for GloVe, the train split's words (all of them, as
    # word2vec counts its raw corpus tokens) per second of an epoch.
    from lexiflow.storage import ArtifactStore
    from lexiflow.storage.formats import read_table
    from lexiflow.tasks.corpus import ingest_corpus
    from lexiflow.tasks.embeddings import glove_embeddings
    from lexiflow.tasks.matrices import count_cooccurrence
    from lexiflow.tasks.params import CooccurrenceParams, CorpusParams, GloVeParams, VocabularyParams
    from lexiflow.tasks.vocabulary import encode_corpus, learn_vocabulary

    from tests.stages import publish

    store = ArtifactStore(str(tmp_path))
    docs = publish(store, ingest_corpus, params=CorpusParams(sources=["builtin:lee"]))
    words = publish(store, learn_vocabulary, corpus=docs, params=VocabularyParams(min_count=3))
    tokens = publish(store, encode_corpus, corpus=docs, tokenizer=words)
    counts = publish(store, count_cooccurrence, tokens=tokens, tokenizer=words, params=CooccurrenceParams())
    emb = publish(store, glove_embeddings, cooccurrence=counts, params=GloVeParams(dim=8, epochs=2, device="cpu"))
    n_tokens = store.manifest(counts.kind, counts.version)["metrics"]["corpus_tokens"]  # all train words
    history = read_table(emb, "history.parquet")
    assert n_tokens > 10_000 and history.height == 2
    assert np.allclose(history["words_per_s"], n_tokens / history["seconds"])
    assert np.allclose(history["cells_per_s"], store.manifest(counts.kind, counts.version)["metrics"]["nonzeros"]
                       / history["seconds"])
    metrics = store.manifest(emb.kind, emb.version)["metrics"]
    # total work over total time, not a mean of per-epoch rates
    assert metrics["words_per_s"] == pytest.approx(2 * n_tokens / history["seconds"].sum())
    assert metrics["cells_per_s"] == pytest.approx(
        2 * store.manifest(counts.kind, counts.version)["metrics"]["nonzeros"] / history["seconds"].sum())
    assert n_tokens > store.manifest(counts.kind, counts.version)["metrics"]["tokens"]  # <unk> counted too


def test_a_fit_continues_from_the_state_given_and_starts_the_rest_at_random():
    """`start`: w, w̃, b, b̃ per row, NaN rows left at the seeded random start. With a vanishing step the fit
    ends where it started: the given rows hold the given values, the others a cold fit's start."""
    cold = GloVe(dim=3, epochs=1, negative=0, seed=4).fit(X)
    start = [p.copy() for p in cold.state_]
    for p in start:
        p[1] = np.nan  # word 1 unknown to the earlier model
    still = GloVe(dim=3, epochs=1, negative=0, seed=7, lr=1e-12).fit(X, start=start)
    random = initial_parameters(4, 3, 7)
    for given, ended, drawn in zip(start, still.state_, random, strict=True):
        np.testing.assert_allclose(ended[[0, 2, 3]], given[[0, 2, 3]], atol=1e-9)
        np.testing.assert_allclose(ended[1], drawn[1], atol=1e-9)


def test_glove_continued_from_a_released_version_says_so_and_keeps_its_state(tmp_path):
    from lexiflow.storage import ArtifactStore, Catalog
    from lexiflow.storage.formats import read_manifest, read_table
    from lexiflow.tasks.corpus import ingest_corpus
    from lexiflow.tasks.embeddings import GLOVE_STATE, glove_embeddings
    from lexiflow.tasks.matrices import count_cooccurrence
    from lexiflow.tasks.params import CooccurrenceParams, CorpusParams, GloVeParams, VocabularyParams
    from lexiflow.tasks.vocabulary import encode_corpus, learn_vocabulary

    from tests.stages import publish

    store = ArtifactStore(str(tmp_path / "store"))
    grown = tmp_path / "more.txt"
    grown.write_text("\n".join(f"the new line {i} about the government and the police ." for i in range(200)) + "\n")

    def glove(sources: list[str], **settings):
        docs = publish(store, ingest_corpus, params=CorpusParams(sources=sources))
        words = publish(store, learn_vocabulary, corpus=docs, params=VocabularyParams(min_count=3))
        tokens = publish(store, encode_corpus, corpus=docs, tokenizer=words)
        counts = publish(store, count_cooccurrence, tokens=tokens, tokenizer=words, params=CooccurrenceParams())
        return publish(store, glove_embeddings, cooccurrence=counts,
                       params=GloVeParams(dim=8, epochs=2, device="cpu", **settings))

    first = glove(["builtin:lee"], seed=1)
    state = read_table(first, "glove_state.parquet")
    assert state.columns == ["token", *GLOVE_STATE] and state.height == read_manifest(first)["metrics"]["words"] + 4
    Catalog(store).release("embeddings", first.version, "production-glove")
    cold = glove(["builtin:lee", str(grown)])
    continued = glove(["builtin:lee", str(grown)], continue_from="production-glove")
    assert continued.version not in (cold.version, first.version)
    assert read_manifest(continued)["metrics"]["continued_from"] == first.version
    assert glove(["builtin:lee", str(grown)], continue_from=first.version).version == continued.version
    # the continued model started from the released one: its shared words' w moved less from it than a cold start
    before, after, fresh = (read_table(ref, "glove_state.parquet") for ref in (first, continued, cold))
    shared = before.join(after, on="token", suffix="_after").join(fresh, on="token", suffix="_cold")
    w, w_after, w_cold = (np.stack(shared[name].to_numpy()) for name in ("w", "w_after", "w_cold"))
    def cosine(a: np.ndarray) -> float:  # the median over shared words of cos(w, w of `first`)
        return float(np.median((a * w).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(w, axis=1)))

    assert cosine(w_after) > 0.9 and abs(cosine(w_cold)) < 0.5  # measured: 0.99 and 0.18


def test_a_fit_runs_on_its_threads_parameter_and_restores_the_setting():
    import torch
    from lexiflow.models.threads import limit_threads
    from threadpoolctl import threadpool_info

    before = torch.get_num_threads()
    seen = []
    GloVe(dim=4, epochs=1, device="cpu", threads=1).fit(
        sp.random(30, 30, density=0.3, random_state=0, format="csr") * 10 + sp.eye(30),
        on_epoch=lambda record, vectors: seen.append((torch.get_num_threads(),
                                                      {p["num_threads"] for p in threadpool_info()})))
    assert seen == [(1, {1})] and torch.get_num_threads() == before
    with pytest.raises(ParameterError, match="threads=0"):
        GloVe(threads=0).fit(sp.eye(3, format="csr"))
    with pytest.raises(ParameterError, match="svd.threads"), limit_threads(0, "svd.threads"):
        pass
