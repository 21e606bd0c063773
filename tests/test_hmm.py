"""HMM tagger: hand-computed MLE estimates and Viterbi lattice, decoders against each other, persistence,
robustness, and the tagging metrics against scikit-learn as an oracle."""

import json
import math

import numpy as np
import pytest
from lexiflow.models.conllu import read_conllu
from lexiflow.models.errors import InputError, ParameterError
from lexiflow.models.hmm import HMMTagger
from lexiflow.models.tagging_metrics import accuracy_report, confusion_matrix, per_tag_scores, plot_confusion
from sklearn.metrics import confusion_matrix as sk_confusion
from sklearn.metrics import precision_recall_fscore_support

from tests.conftest import EWT

# Three sentences; tags sorted: D, N, V.
TOY = [
    [("the", "D"), ("dog", "N"), ("runs", "V")],
    [("the", "D"), ("run", "N")],
    [("dogs", "N"), ("run", "V")],
]


def toy(order=2, **kw):
    return HMMTagger(order=order, lexicalize=0, **kw).fit(TOY)


def test_mle_tables_by_hand():
    m = toy(lambdas=(0.0, 1.0))
    assert m.tags_ == ["D", "N", "V"]
    # pi(s) = Count(<s>, s) / #sentences
    np.testing.assert_allclose(m.initial_probs(), [2 / 3, 1 / 3, 0])
    # P(s_i | s_{i-1}) = Count(s_{i-1}, s_i) / Count(s_{i-1}); columns D, N, V, </s>
    np.testing.assert_allclose(m.transition_probs(), [[0, 1, 0, 0], [0, 0, 2 / 3, 1 / 3], [0, 0, 0, 1]])
    # P(o | s) = Count(s, o) / Count(s)
    e = m.emission_probs()
    row = {w: e[i] for w, i in m.vocab_.items()}
    np.testing.assert_allclose(row["the"], [1, 0, 0])
    np.testing.assert_allclose(row["dog"], [0, 1 / 3, 0])
    np.testing.assert_allclose(row["run"], [0, 1 / 3, 1 / 2])
    np.testing.assert_allclose(row["runs"], [0, 0, 1 / 2])
    np.testing.assert_allclose(e.sum(axis=0), [1, 1, 1])


def test_deleted_interpolation_weights_by_hand():
    # Bigrams with counts: (<s>,D)2 (<s>,N)1 (D,N)2 (N,V)2 (N,</s>)1 (V,</s>)2; outcomes D2 N3 V2 </s>3 (N=10).
    # (<s>,D): uni 1/9 < bi 1/2 -> bi+2; (<s>,N): uni 2/9 > bi 0 -> uni+1; (D,N): bi 1 -> bi+2;
    # (N,V): uni 1/9 < bi 1/2 -> bi+2; (N,</s>): uni+1; (V,</s>): bi 1 -> bi+2. lambdas = (2, 8) / 10.
    np.testing.assert_allclose(toy().lambdas_, [0.2, 0.8])


def smoothed_transitions():
    """T[j, k] = 0.5 P(k) + 0.5 P(k | j) on the toy corpus, rows <s>, D, N, V; columns D, N, V, </s>."""
    p1 = np.array([2, 3, 2, 3]) / 10
    p2 = {"<s>": [2 / 3, 1 / 3, 0, 0], "D": [0, 1, 0, 0], "N": [0, 0, 2 / 3, 1 / 3], "V": [0, 0, 0, 1]}
    return {j: 0.5 * p1 + 0.5 * np.array(v) for j, v in p2.items()}


def test_viterbi_lattice_by_hand():
    m = toy(lambdas=(0.5, 0.5))
    t = smoothed_transitions()
    np.testing.assert_allclose(np.exp(m.log_trans_[3, :]), t["<s>"])  # row K = <s>
    tags, delta, back = m.viterbi_lattice(["dogs", "run"])
    # t=0 "dogs": only N emits it: delta(N) = log T(<s>, N) + log 1/3
    d0 = math.log(t["<s>"][1] * (1 / 3))
    assert delta[0, 1] == pytest.approx(d0) and np.isneginf(delta[0, [0, 2]]).all()
    assert back[0, 1] == 3  # <s>
    # t=1 "run": N via N: d0 + log T(N,N) + log 1/3;  V via N: d0 + log T(N,V) + log 1/2
    assert delta[1, 1] == pytest.approx(d0 + math.log(t["N"][1] / 3))
    assert delta[1, 2] == pytest.approx(d0 + math.log(t["N"][2] / 2))
    assert back[1, 1] == 1 and back[1, 2] == 1
    # end: N then </s> vs V then </s>: .0017 < .0149, so N V
    assert delta[1, 2] + math.log(t["V"][3]) > delta[1, 1] + math.log(t["N"][3])
    assert tags == ["N", "V"] == m.tag(["dogs", "run"])
    tags, delta, back = m.viterbi_lattice(["the", "run"])
    d0 = math.log(t["<s>"][0])
    assert delta[1, 1] == pytest.approx(d0 + math.log(t["D"][1] / 3))  # 0.4333 * 0.65 / 3
    assert delta[1, 2] == pytest.approx(d0 + math.log(t["D"][2] / 2))  # 0.4333 * 0.1 / 2
    assert back[1, 1] == back[1, 2] == 0 and tags == ["D", "N"]


def test_trigram_lattice_matches_brute_force():
    m = HMMTagger(order=3, lambdas=(0.2, 0.3, 0.5), lexicalize=0).fit(TOY)
    words = ["the", "dog", "run", "runs"]
    em = m._emissions(words)
    k = len(m.tags_)
    best, best_path = -np.inf, None
    for path in np.ndindex(*([k] * len(words))):
        states = [k, k, *path]
        s = sum(m.log_trans_[states[i], states[i + 1], states[i + 2]] + em[i, path[i]] for i in range(len(path)))
        s += m.log_trans_[path[-2], path[-1], k]
        if s > best:
            best, best_path = s, path
    tags, delta, _ = m.viterbi_lattice(words)
    assert tags == [m.tags_[j] for j in best_path] == m.tag(words)
    final = delta[-1][:k] + m.log_trans_[:k, :k, k]
    assert final.max() == pytest.approx(best)


def test_greedy_differs_from_viterbi_on_a_garden_path():
    # "x" is more often A, but "y" only follows B: greedy commits to A, Viterbi recovers B.
    corpus = [[("x", "A"), ("z", "C")]] * 3 + [[("x", "B"), ("y", "D")]]
    m = HMMTagger(order=2, lambdas=(0.1, 0.9), lexicalize=0).fit(corpus)
    assert m.tag(["x", "y"], method="greedy") == ["A", "D"]
    assert m.tag(["x", "y"]) == ["B", "D"] == m.tag(["x", "y"], method="beam", beam_width=4)
    assert m.tag(["x", "y"], method="beam", beam_width=1) == ["A", "D"]


def synthetic_corpus(seed=0, n=300, k=5, v=25):
    rng = np.random.default_rng(seed)
    trans = rng.dirichlet(np.ones(k) * 0.5, size=k + 1)
    emit = rng.dirichlet(np.ones(v) * 0.3, size=k)
    sents = []
    for _ in range(n):
        s, prev = [], k
        for _ in range(rng.integers(1, 12)):
            t = rng.choice(k, p=trans[prev])
            s.append((f"w{rng.choice(v, p=emit[t])}", f"T{t}"))
            prev = t
        sents.append(s)
    return sents


@pytest.mark.parametrize("order", [2, 3])
def test_beam_equals_viterbi_when_wide_and_greedy_is_no_better(order):
    sents = synthetic_corpus()
    m = HMMTagger(order=order, max_candidates=100, prune=None, unknown="suffix", lexicalize=0).fit(sents[:250])
    k = len(m.tags_)
    width = k if order == 2 else (k + 1) * k  # the number of states
    words = [[w for w, _ in s] for s in sents[250:]] + [["w3", "unseen", "w1"]]
    vit = m.tag_many(words)
    assert m.tag_many(words, method="beam", beam_width=width) == vit
    assert [m.viterbi_lattice(w)[0] for w in words] == vit  # batched/ragged paths = the single-sentence lattice
    # Viterbi's path never scores below greedy's; on this data they differ somewhere.
    greedy = m.tag_many(words, method="greedy")
    assert greedy != vit
    for w, g, v in zip(words, greedy, vit, strict=True):
        assert path_score(m, w, g) <= path_score(m, w, v) + 1e-9


def path_score(m, words, tags):
    em = m._emissions(words)
    k = len(m.tags_)
    ids = [m.tags_.index(t) for t in tags]  # states (lexicalize=0, no refinement: a tag is a state)
    states = [k] * (m.order - 1) + ids + [k]
    s = sum(em[i, j] for i, j in enumerate(ids))
    for i in range(len(ids) + 1):
        s += m.log_trans_[tuple(states[i:i + m.order])]
    return s


def test_pruned_viterbi_equals_exact_when_words_have_few_tags():
    sents = synthetic_corpus(seed=1, k=4)
    exact = HMMTagger(order=3, max_candidates=100, prune=None, unknown="suffix", lexicalize=0).fit(sents[:250])
    fast = HMMTagger(order=3, max_candidates=4, prune=None, unknown="suffix", lexicalize=0).fit(sents[:250])
    words = [[w for w, _ in s] for s in sents[250:]]
    assert fast.tag_many(words) == exact.tag_many(words)


def test_suffix_model_successive_abstraction_by_hand():
    m = HMMTagger(order=2, theta=1.0, unknown="suffix").fit([[("red", "A"), ("walked", "V")], [("talked", "V")]])
    suf, _ = m._unknown_components(["baked"], [False])
    # P(t|"") = (1/3, 2/3); "d", "ed" seen on all three words: unchanged; "ked" only on V words:
    # ((0, 1) + 1 * (1/3, 2/3)) / 2 = (1/6, 5/6); "aked" unseen: stop there.
    np.testing.assert_allclose(np.exp(suf[0]), [1 / 6, 5 / 6])


def test_unknown_emission_with_prior_scaling_by_hand():
    # Same suffix model; P(t) = (1/3, 2/3) (A once, V twice). Emission of an unknown word:
    # log P_suffix(t | w) - kappa log P(t), kappa = prior_weight (1 = Bayes' rule).
    corpus = [[("red", "A"), ("walked", "V")], [("talked", "V")]]
    for kappa in (1.0, 0.5):
        m = HMMTagger(order=2, theta=1.0, unknown="suffix", prior_weight=kappa).fit(corpus)
        expected = np.log([1 / 6, 5 / 6]) - kappa * np.log([1 / 3, 2 / 3])
        np.testing.assert_allclose(m._emissions(["baked"])[0], expected)


@pytest.mark.parametrize("rare_tags", [("NOUN", "VERB"), ("NOUN", "VERB", "ADJ")])
def test_rare_word_classifier_equals_scikit_learns_probabilities(rare_tags):
    # Two tags on rare words is scikit-learn's binary case (one coefficient row); three, its multinomial one.
    from sklearn.linear_model import LogisticRegression

    endings = {"NOUN": "ax", "VERB": "ed", "ADJ": "ous"}
    rare = [[("the", "DET"), (f"w{i}{endings[t]}", t)] for i, t in enumerate(rare_tags * 4)]
    m = HMMTagger(order=2, unknown="logreg").fit([[("the", "DET"), ("dog", "NOUN")]] * 5 + rare)
    words = [w for s in rare for w, _ in s[1:]]
    features = [m._lr_word_features(w, False) for w in words]
    names = sorted({f for row in features for f in row})
    x = np.array([[f in row for f in names] for row in features], dtype=float)
    tags = [t for s in rare for _, t in s[1:]]
    clf = LogisticRegression(C=m.lr_C, max_iter=m.max_iter, random_state=m.seed).fit(x, tags)
    probe = ["zorbax", "glimped"]
    _, lr = m._unknown_components(probe, [False, False])
    expected = clf.predict_proba(np.array([[f in m._lr_word_features(w, False) for f in names] for w in probe], float))
    columns = [m.tags_.index(t) for t in clf.classes_]
    seen = np.exp(lr[:, columns])  # DET, never on a rare word, keeps a sliver (bias 10 below the others)
    assert (seen.sum(axis=1) > 0.999).all()
    np.testing.assert_allclose(seen / seen.sum(axis=1, keepdims=True), expected, atol=1e-9)


def test_case_variant_backoff_by_hand():
    # "RED" is unknown, "red" is known (A once). Suffix model: no capitalised rare word, so the lowercase
    # tables; "D" is not a lowercase suffix: P(t | "") = (1/3, 2/3) = P(t), unknown score log 1 = 0 for both.
    # On the rare-word scale (P(w) = 1/N, N = 3 tokens) mixed with the variants' P(red | t) = (1/1, 0/2):
    # mu = 0.25: A: 0.25 * 1 + 0.75 * 1/3 = 1/2, V: 0.25 * 0 + 0.75 * 1/3 = 1/4.
    corpus = [[("red", "A"), ("walked", "V")], [("talked", "V")]]
    m = HMMTagger(order=2, theta=1.0, unknown="suffix", prior_weight=1.0, case_mix=0.25).fit(corpus)
    np.testing.assert_allclose(m._emissions(["red", "RED"])[1], np.log([1 / 2, 1 / 4]))
    off = HMMTagger(order=2, theta=1.0, unknown="suffix", prior_weight=1.0, case_mix=0.0).fit(corpus)
    np.testing.assert_allclose(off._emissions(["red", "RED"])[1], [0.0, 0.0], atol=1e-12)
    with pytest.raises(ParameterError, match="case_mix"):
        HMMTagger(case_mix=1.5).fit(corpus)


def test_default_theta_is_the_spread_of_output_tags_not_of_split_states():
    # States N|NN 2, N|NNS 1, V|VB 1, V|VBZ 1 -> output tags N 3/5, V 2/5: theta = std(0.6, 0.4) = sqrt(0.02)
    # (over the four states it would be std(0.4, 0.2, 0.2, 0.2) = 0.1).
    corpus = [[("dogs", "N", "NNS"), ("run", "V", "VB")], [("dog", "N", "NN"), ("runs", "V", "VBZ")],
              [("cat", "N", "NN")]]
    m = HMMTagger(order=2, unknown="suffix", lexicalize=0).fit(corpus)
    assert len(m.tags_) == 4 and m.theta_ == pytest.approx(math.sqrt(0.02))


@pytest.fixture(scope="module")
def ewt_small():
    def load(split, n):
        out = []
        for s in read_conllu(EWT / f"en_ewt-ud-{split}.conllu"):
            out.append(list(zip(s.words, s.upos, strict=True)))
            if len(out) == n:
                return out
        return out

    return load("train", 600), load("dev", 120)


@pytest.mark.parametrize("order", [2, 3])
def test_exact_viterbi_equals_brute_force_with_every_tag_possible(order):
    # unknown words and rare known words (rare_mix > 0) have every tag possible: nothing is pruned
    sents = synthetic_corpus(seed=2, n=120, k=4, v=12)
    m = HMMTagger(order=order, unknown="suffix", lexicalize=0, rare_mix=0.3, rare_max_count=3).fit(sents)
    k = len(m.tags_)
    rng = np.random.default_rng(0)
    for n in (1, 2, 5):
        for _ in range(4):
            words = [f"w{rng.integers(0, 14)}" for _ in range(n)]  # w12, w13 are unknown
            best = max(np.ndindex(*([k] * n)), key=lambda p: path_score(m, words, [m.tags_[j] for j in p]))
            assert m.tag(words) == [m.tags_[j] for j in best]


@pytest.mark.parametrize("order", [2, 3])
def test_exact_viterbi_never_scores_below_beam_or_pruned_search_on_ewt(order, ewt_small):
    train, dev = ewt_small
    m = HMMTagger(order=order, unknown="suffix", rare_mix=0.3, max_candidates=2, prune=None, lexicalize=0).fit(train)
    words = [[w for w, _ in s] for s in dev]
    exact = m.tag_many(words)
    scores = {method: [path_score(m, w, t) for w, t in zip(words, m.tag_many(words, method=method, beam_width=3),
                                                           strict=True)]
              for method in ("viterbi_pruned", "beam")}
    best = [path_score(m, w, t) for w, t in zip(words, exact, strict=True)]
    for method, got in scores.items():
        assert all(b >= g - 1e-9 for b, g in zip(best, got, strict=True)), method
    assert sum(b > g + 1e-9 for b, g in zip(best, scores["viterbi_pruned"], strict=True)) >= 3  # pruning loses
    # one sentence at a time (the per-call kernels) = batched
    for method in ("viterbi", "viterbi_pruned", "beam", "greedy"):
        assert [m.tag(w, method=method, beam_width=3) for w in words[:40]] == m.tag_many(words[:40], method=method,
                                                                                           beam_width=3)


def test_round_trip_save_load_and_open_formats(tmp_path, ewt_small):
    train, dev = ewt_small
    m = HMMTagger(order=3, max_iter=60, lexicalize=10).fit(train, dev=dev)
    m.save(tmp_path)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["config.json", "emissions.parquet", "initial.parquet", "suffixes.parquet",
                     "transitions.parquet", "trigrams.parquet", "unknown_lr.parquet"]
    assert json.loads((tmp_path / "config.json").read_text())["params"]["order"] == 3
    again = HMMTagger.load(tmp_path)
    assert again.tags_ == m.tags_ and again.vocab_ == m.vocab_ and again.calibration_ == m.calibration_
    for name in ("log_trans_", "_emit_table", "lr_weights_", "lr_bias_", "suffix_log_", "lambdas_"):
        np.testing.assert_array_equal(getattr(again, name), getattr(m, name))
    words = [[w for w, _ in s] for s in dev] + [["Zyxwv", "qwertyuiop", "123-abc"]]
    for method in ("viterbi", "greedy", "beam"):
        assert again.tag_many(words, method=method) == m.tag_many(words, method=method)
    # the tagger learned something: well above the majority-tag baseline on held-out text
    gold = [t for s in dev for _, t in s]
    pred = [t for s in m.tag_many([[w for w, _ in s] for s in dev]) for t in s]
    assert np.mean(np.array(gold) == np.array(pred)) > 0.8


def test_robust_to_empty_sentences_and_unseen_tags(ewt_small):
    train, _ = ewt_small
    m = HMMTagger(order=2, unknown="suffix").fit([[]] + train[:200] + [[]])
    assert m.tag([]) == []
    assert m.tag_many([[], ["The", "dog"], []])[0] == [] and len(m.tag_many([[], ["The", "dog"], []])[1]) == 2
    assert m.tag_many([[]], method="beam") == [[]] and m.tag_many([], method="greedy") == []
    # dev tags unseen in train do not break calibration; they count as errors
    dev = [[("foo", "NEWTAG"), ("the", "DET")]]
    m2 = HMMTagger(order=2, unknown="suffix").fit(train[:200], dev=dev)
    assert 0.0 <= m2.dev_accuracy_ <= 0.5


def test_tag_text_and_refined_states():
    corpus = [[("the", "DET", "DT"), ("dog", "NOUN", "NN"), ("runs", "VERB", "VBZ"), (".", "PUNCT", ".")],
              [("dogs", "NOUN", "NNS"), ("run", "VERB", "VBP"), (".", "PUNCT", ".")]] * 3
    m = HMMTagger(order=3, lexicalize=0).fit(corpus)
    assert "NOUN|NNS" in m.tags_ and set(m.state_output_) == {"DET", "NOUN", "VERB", "PUNCT"}
    # lexicalised states: an ambiguous frequent word gets states of its own, the output stays the tag
    lex = HMMTagger(order=3, lexicalize=1).fit(corpus + [[("run", "NOUN", "NN")]])
    assert {"VERB|VBP|run", "NOUN|NN|run"} <= set(lex.tags_) and "VERB|VBP" not in lex.tags_
    assert lex.tag(["dogs", "run", "."]) == ["NOUN", "VERB", "PUNCT"]
    out = m.tag_text("the dog runs. Dogs run.")
    assert out == [[("the", "DET"), ("dog", "NOUN"), ("runs", "VERB"), (".", "PUNCT")],
                   [("Dogs", "NOUN"), ("run", "VERB"), (".", "PUNCT")]]


def test_user_errors():
    with pytest.raises(ParameterError, match="order"):
        HMMTagger(order=4).fit(TOY)
    with pytest.raises(ParameterError, match="lambdas"):
        HMMTagger(order=2, lambdas=(0.5, 0.6)).fit(TOY)
    with pytest.raises(InputError, match="no tagged sentence"):
        HMMTagger().fit([[], []])
    with pytest.raises(InputError, match="word, tag"):
        HMMTagger().fit([["the", "dog"]])
    with pytest.raises(ParameterError, match="not fitted"):
        HMMTagger().tag(["a"])
    for bad in ({"rare_mix": 1.5}, {"unknown_mix": -0.1}, {"emission_weight": 0.0}, {"unknown_weight": float("nan")}):
        with pytest.raises(ParameterError, match=next(iter(bad))):  # out of range used to crash decoding later
            HMMTagger(order=2, **bad).fit(TOY)
    m = toy()
    with pytest.raises(ParameterError, match="method"):
        m.tag(["the"], method="posterior")
    with pytest.raises(InputError, match="tokenise"):
        m.tag_many(["the dog"])


# ---------------------------------------------------------------------------------------------- metrics

GOLD = [["D", "N", "V"], ["N", "V", "X"], ["D", "N"]]
PRED = [["D", "N", "N"], ["N", "V", "V"], ["V", "N"]]


def test_per_tag_scores_match_sklearn():
    df = per_tag_scores(GOLD, PRED)
    g = [t for s in GOLD for t in s]
    p = [t for s in PRED for t in s]
    labels = sorted(set(g) | set(p))
    prec, rec, f1, sup = precision_recall_fscore_support(g, p, labels=labels, zero_division=0)
    assert df["tag"].to_list() == labels
    np.testing.assert_allclose(df["precision"].to_numpy(), prec)
    np.testing.assert_allclose(df["recall"].to_numpy(), rec)
    np.testing.assert_allclose(df["f1"].to_numpy(), f1)
    assert df["support"].to_list() == sup.tolist()
    assert df.filter(df["tag"] == "X")["recall"].item() == 0  # gold tag the tagger never predicts


def test_confusion_and_accuracy_report(tmp_path):
    labels, cm = confusion_matrix(GOLD, PRED)
    g = [t for s in GOLD for t in s]
    p = [t for s in PRED for t in s]
    np.testing.assert_array_equal(cm, sk_confusion(g, p, labels=labels))
    words = [["a", "b", "c"], ["d", "e", "f"], ["a", "z"]]
    rep = accuracy_report(words, GOLD, PRED, known={"a", "b", "c", "d"})
    assert rep["accuracy"] == pytest.approx(5 / 8)
    assert rep["known_accuracy"] == pytest.approx(3 / 5)  # a b c d a: right, right, wrong, right, wrong
    assert rep["unknown_accuracy"] == pytest.approx(2 / 3)  # e f z: right, wrong, right
    assert rep["unknown_tokens"] == 3
    path = plot_confusion(GOLD, PRED, tmp_path / "cm.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    img = matplotlib.image.imread(path)
    assert img.shape[0] > 100 and img.shape[1] > 100
    with pytest.raises(InputError, match="sentence 0"):
        per_tag_scores([["D"]], [["D", "N"]])
    with pytest.raises(InputError, match="words has 2 sentences but gold has 3"):  # names what is short
        accuracy_report(words[:2], GOLD, PRED, known={"a"})


@pytest.mark.parametrize("names, evaluated", [(["a-train.conllu"], None),
                                              (["a-train.conllu", "a-dev.conllu"], "valid")])
def test_tagger_stage_with_no_held_out_sentences_reports_no_accuracy_not_nan(tmp_path, names, evaluated):
    from lexiflow.storage import ArtifactStore
    from lexiflow.tasks.corpus import ingest_tagged
    from lexiflow.tasks.params import CorpusParams, TaggerParams
    from lexiflow.tasks.tagger import train_tagger

    from tests.stages import publish

    block = "1\tthe\t_\tDET\tDT\t_\t_\t_\t_\t_\n2\tdog\t_\tNOUN\tNN\t_\t_\t_\t_\t_\n\n"
    for name in names:  # every sentence goes to the split its file's name gives
        (tmp_path / name).write_text(block * 5, encoding="utf-8")
    store = ArtifactStore(tmp_path / "store")
    tagged = publish(store, ingest_tagged, params=CorpusParams(sources=[str(tmp_path / n) for n in names]))
    ref = publish(store, train_tagger, tagged=tagged, column="upos", params=TaggerParams(order=2))
    manifest = store.manifest(ref.kind, ref.version)
    metrics = manifest["metrics"]
    assert metrics["evaluated_on"] == evaluated
    assert "NaN" not in json.dumps(metrics)  # strict JSON: a figure with no tokens behind it is null
    report = store.read_text(ref.kind, ref.version, "report.md")
    if evaluated is None:
        assert metrics["accuracy"] is None and "Not evaluated: the tagged corpus has no valid or test" in report
    else:  # dev has no unknown word: no unknown-word accuracy
        assert metrics["accuracy"] == metrics["known_accuracy"] == 1.0 and metrics["unknown_accuracy"] is None


def test_tagger_stage_without_train_sentences_says_which_split_they_went_to(tmp_path):
    from lexiflow.storage import ArtifactStore
    from lexiflow.tasks.corpus import ingest_tagged
    from lexiflow.tasks.params import CorpusParams, TaggerParams
    from lexiflow.tasks.tagger import train_tagger

    from tests.stages import publish

    (tmp_path / "en-ud-test.conllu").write_text("1\tthe\t_\tDET\tDT\t_\t_\t_\t_\t_\n\n" * 3, encoding="utf-8")
    store = ArtifactStore(tmp_path / "store")
    tagged = publish(store, ingest_tagged, params=CorpusParams(sources=[str(tmp_path / "en-ud-test.conllu")]))
    with pytest.raises(InputError, match=r"^tagged corpus \w+ has no train split \(held out: 3 test\), .* A source "
                                         r"file named after a split"):
        publish(store, train_tagger, tagged=tagged, column="upos", params=TaggerParams())
    assert not store.exists("tagger", train_tagger.describe(
        {"store": store.url, "tagged": tagged, "column": "upos", "params": TaggerParams()})[2])


@pytest.mark.parametrize("order", [2, 3])
def test_the_per_call_kernel_finds_the_best_path_over_any_candidates(order):
    """viterbi_one (compiled) against enumeration of every path over random candidate sets, on
    random tables where most trigrams equal their smallest over the tag two back (as interpolated
    trigrams do), so the sparse step and its row skipping are exercised."""
    import itertools

    from lexiflow.models.hmm import decoding

    rng = np.random.default_rng(order)
    k = 6
    for trial in range(200):
        if order == 3:
            base = np.log(rng.dirichlet(np.ones(k + 1), size=k + 1))
            log_trans = np.repeat(base[None], k + 1, axis=0) - rng.exponential(2.0, (k + 1, k + 1, k + 1)) * (
                rng.random((k + 1, k + 1, k + 1)) < 0.7)
            listed = rng.random(log_trans.shape) < 0.3
            log_trans[listed] += rng.exponential(3.0, int(listed.sum()))  # listed trigrams above the base
        else:
            log_trans = np.log(rng.dirichlet(np.ones(k + 1), size=k + 1))
        n = int(rng.integers(1, 6))
        ids = [np.sort(rng.choice(k, size=int(rng.integers(1, k + 1)), replace=False)) for _ in range(n)]
        sc = [rng.normal(-3, 2, len(c)) for c in ids]

        def score(path, ids=ids, sc=sc, log_trans=log_trans):
            states = [k] * (order - 1) + list(path) + [k]
            total = sum(float(s[list(c).index(p)]) for p, c, s in zip(path, ids, sc, strict=True))
            for t in range(order - 1, len(states)):
                total += log_trans[tuple(states[t - order + 1:t + 1])]
            return total

        best = max(itertools.product(*ids), key=score)
        found = decoding.viterbi_one(decoding.one_sentence_tables(log_trans), ids, sc)
        assert score(found) == pytest.approx(score(best), abs=1e-9), trial
