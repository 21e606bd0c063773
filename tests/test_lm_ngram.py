"""n-gram LM: hand-computed probabilities, normalisation, NLTK's KneserNeyInterpolated as an oracle,
Parquet round trip, <unk> handling and user errors."""

from __future__ import annotations

import json
import math

import numpy as np
import polars as pl
import pytest
from lexiflow.models.errors import InputError, ParameterError
from lexiflow.models.lm.ngram import NgramLM
from nltk.lm import KneserNeyInterpolated, Vocabulary
from nltk.util import everygrams

from tests.conftest import WIKITEXT_VALID

UNK, BOS, EOS, PAD = 0, 1, 2, 3
A, B, C = 4, 5, 6
TINY = [np.array([A, B]), np.array([A, C])]


def _random_corpus(seed: int, n_sent: int = 150, vocab: int = 25) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    # a skewed unigram distribution gives repeated n-grams of every count (1, 2, 3, 4+)
    p = 1.0 / np.arange(1, vocab - 3) ** 1.1
    return [rng.choice(np.arange(4, vocab), size=rng.integers(0, 10), p=p / p.sum()) for _ in range(n_sent)]


@pytest.fixture(scope="module")
def wiki() -> tuple[list[np.ndarray], list[np.ndarray]]:
    """60 wikitext paragraphs to train, 5 truncated ones to score, as ids (<unk> literal -> 0)."""
    lines = [line.split() for line in WIKITEXT_VALID.read_text(encoding="utf-8").splitlines() if line.strip()]
    vocab: dict[str, int] = {"<unk>": UNK}

    def ids(words: list[str]) -> np.ndarray:
        return np.array([vocab.setdefault(w, len(vocab) + 3) for w in words], dtype=np.int64)

    return [ids(w) for w in lines[:60]], [ids(w[:25]) for w in lines[400:405]]


# ---------------------------------------------------------------- hand-computed known answers
def test_mle_and_add_k_match_hand_computed_probabilities() -> None:
    mle = NgramLM(order=2, smoothing="mle", min_count=1).fit(TINY)
    p = np.exp(mle.log_probs([BOS, A]))
    assert p[B] == pytest.approx(0.5) and p[C] == pytest.approx(0.5) and p[EOS] == 0
    assert np.exp(mle.log_probs([BOS]))[A] == pytest.approx(1.0)
    # <s> a b </s>: 1 * 0.5 * 1 over 3 predictions
    assert mle.perplexity([np.array([A, B])]) == pytest.approx(2 ** (1 / 3))
    # Laplace: W = {<unk>, </s>, a, b, c}; p(b | a) = (1 + 1) / (2 + 5)
    lap = NgramLM(order=2, smoothing="add_k", k=1.0, min_count=1).fit(TINY)
    p = np.exp(lap.log_probs([BOS, A]))
    assert p[B] == pytest.approx(2 / 7) and p[A] == pytest.approx(1 / 7) and p[UNK] == pytest.approx(1 / 7)
    assert p[BOS] == 0 and p[PAD] == 0


def test_kneser_ney_matches_hand_computed_probabilities() -> None:
    # unique bigrams: (<s> a) (a b) (a c) (b </s>) (c </s>): N1+(• •) = 5, N1+(• </s>) = 2
    kn = NgramLM(order=2, smoothing="kneser_ney", discount=0.5, min_count=1).fit(TINY)
    p = np.exp(kn.log_probs([BOS, A]))
    # gamma(a) = 0.5 * 2 / 2 = 0.5; p(b | a) = (1 - 0.5) / 2 + 0.5 * 1/5
    assert p[B] == pytest.approx(0.35) and p[C] == pytest.approx(0.35)
    assert p[EOS] == pytest.approx(0.5 * 2 / 5) and p[A] == pytest.approx(0.5 * 1 / 5)
    assert p[UNK] == 0 and p[BOS] == 0
    # an unseen context (<unk>) falls back to the continuation unigram
    assert np.exp(kn.log_probs([BOS, UNK]))[EOS] == pytest.approx(2 / 5)


def test_modified_kneser_ney_discounts_follow_chen_goodman() -> None:
    # counts with n1=4, n2=2, n3=1, n4=1: Y = 4/8; D1 = 1 - 2Y n2/n1, D2 = 2 - 3Y n3/n2, D3 = 3 - 4Y n4/n3
    d = NgramLM._estimate_discounts(np.array([1, 1, 1, 1, 2, 2, 3, 4], dtype=float))
    assert d == pytest.approx((0.5, 1.25, 1.0))
    model = NgramLM(order=3).fit(_random_corpus(0))
    top = model.counts_[3]
    n1, n2 = (top == 1).sum(), (top == 2).sum()
    assert model.discounts_[3][0] == pytest.approx(1 - 2 * n1 / (n1 + 2 * n2) * n2 / n1)


# ---------------------------------------------------------------- normalisation
@pytest.mark.parametrize(
    "params",
    [dict(order=1, smoothing="mle"), dict(order=3, smoothing="mle"), dict(order=2, smoothing="add_k", k=0.3),
     dict(order=4, smoothing="add_k"), dict(order=2, smoothing="kneser_ney", discount=0.1),
     dict(order=5, smoothing="kneser_ney", discount=0.9), dict(order=3, smoothing="kneser_ney"),
     dict(order=5, smoothing="kneser_ney", min_count=2)],
)
def test_every_context_distribution_sums_to_one(params: dict) -> None:
    train = _random_corpus(1)
    model = NgramLM(**params, vocab_size=30).fit(train)
    rng = np.random.default_rng(2)
    contexts = [[BOS]] + [[BOS, *s[:i]] for s in train[:40] for i in range(len(s) + 1)]
    contexts += [[BOS, *rng.integers(0, 35, size=rng.integers(1, 6))] for _ in range(40)]  # unseen, OOV ids
    for ctx in contexts:
        p = np.exp(model.log_probs(ctx))
        assert p.shape == (30,)
        assert p.sum() == pytest.approx(1.0, abs=1e-12), ctx
        assert p[BOS] == 0 and p[PAD] == 0
        assert (p[~model.known_] == 0).all()  # out-of-vocabulary mass sits on <unk>


def test_vectorised_scoring_equals_log_probs_lookups() -> None:
    train, test = _random_corpus(3), _random_corpus(4, n_sent=20)
    for params in (dict(smoothing="kneser_ney"), dict(smoothing="mle"), dict(smoothing="add_k", k=0.5)):
        model = NgramLM(order=3, **params).fit(train)
        expected = []
        for s in test:
            ctx = [BOS]
            for t in [*s.tolist(), EOS]:
                expected.append(model.log_probs(ctx)[model._map_ids(np.array([t]))[0]])
                ctx.append(t)
        got = model.token_log_probs(test)
        np.testing.assert_allclose(got, expected, rtol=1e-12)
        assert len(got) == sum(len(s) + 1 for s in test)  # tokens and one </s> per sentence
        assert model.perplexity(test) == pytest.approx(math.exp(-np.mean(expected)), rel=1e-12)


def test_searches_in_sorted_order_find_what_searches_in_query_order_find(monkeypatch) -> None:
    from lexiflow.models.lm import ngram

    keys = np.array([2, 5, 9, 14])
    query = np.array([[14, 3, -1], [2, 2, 20]])  # absent, negative and past-the-end queries are -1
    found = {}
    for threshold in (0, 10**12):  # every query sorted first, or none
        monkeypatch.setattr(ngram, "_SORT_QUERIES", threshold)
        assert ngram._find(keys, query).tolist() == [[3, -1, -1], [0, 0, -1]]
        model = NgramLM(order=3).fit(_random_corpus(3))
        found[threshold] = model.token_log_probs(_random_corpus(4, n_sent=50))
    np.testing.assert_array_equal(found[0], found[10**12])

def reference_probs(model: NgramLM, context: list[int]) -> np.ndarray:
    """p(. | context) one context at a time, in plain Python from the saved count tables (the
    estimators as the NgramLM docstring writes them); context: <s> then ids the model knows."""
    n, V = model.order, model.vocab_size_
    kn = model.smoothing == "kneser_ney"
    counts = {}  # order -> {context tuple: {word: count}} (continuation counts below the top order, KN)
    for k in range(1, n + 1):
        table, by_ctx = model.ngram_table(k), {}
        column = "count" if k == n or not kn else "continuation"
        for row in table.iter_rows(named=True):
            ctx = tuple(row[f"w{i}"] for i in range(1, k))
            by_ctx.setdefault(ctx, {})[row[f"w{k}"]] = row[column]
        counts[k] = by_ctx
    full = tuple([BOS] * (n - 1) + context[1:])[-(n - 1):] if n > 1 else ()
    predictable = [w for w in range(V) if model.known_[w] and w not in (BOS, PAD)]
    if model.smoothing == "add_k":
        seen = counts[n].get(full, {})
        den = sum(seen.values()) + model.k * len(predictable)
        return np.array([(seen.get(w, 0) + model.k) / den if w in predictable else 0.0 for w in range(V)])
    p = np.zeros(V)
    for k in range(1, n + 1):
        seen = counts[k].get(full[len(full) - (k - 1):] if k > 1 else ())
        if seen is None:
            break  # an unseen context: the shorter one's distribution stands
        total = sum(seen.values())
        d = model.discounts_[k]
        discount = {w: min(c, d[min(c, 3) - 1]) if kn and k > 1 else 0.0 for w, c in seen.items()}
        gamma = sum(discount.values()) if kn else 0.0
        p = np.array([(seen.get(w, 0) - discount.get(w, 0.0) + gamma * p[w]) / total for w in range(V)])
    return p


@pytest.mark.parametrize("params", [dict(order=3), dict(order=4, discount=0.6), dict(order=3, smoothing="mle"),
                                    dict(order=2, smoothing="add_k", k=0.5)])
def test_batched_scorer_equals_per_context_scoring(params: dict) -> None:
    train = _random_corpus(3)
    model = NgramLM(**params).fit(train)
    contexts = [[BOS]] + [[BOS, *s[:i].tolist()] for s in train[:12] for i in range(1, len(s) + 1)]
    contexts += [[BOS, 7, 7, 7, 7], [BOS, 20, 4, 19]]  # likely unseen at the top order: backs off
    batch = model.log_probs_batch(contexts)
    assert batch.shape == (len(contexts), model.vocab_size_)
    for ctx, row in zip(contexts, batch, strict=True):
        np.testing.assert_allclose(np.exp(row), reference_probs(model, ctx), rtol=1e-12, atol=1e-15)
        np.testing.assert_array_equal(row, model.log_probs(ctx))
    assert model.log_probs_batch([]).shape == (0, model.vocab_size_)


# ---------------------------------------------------------------- NLTK oracle
def _nltk_tokens(ids: np.ndarray) -> list[str]:
    return ["<UNK>" if i == UNK else str(i) for i in ids.tolist()]


@pytest.mark.parametrize("order,discount,min_count", [(2, 0.1, 1), (3, 0.1, 1), (3, 0.75, 2), (4, 0.5, 1)])
def test_kneser_ney_perplexity_equals_nltk(wiki, order: int, discount: float, min_count: int) -> None:
    train, test = wiki
    ours = NgramLM(order=order, smoothing="kneser_ney", discount=discount, min_count=min_count).fit(train)

    def padded(s: np.ndarray) -> list[str]:
        return ["<s>"] * (order - 1) + _nltk_tokens(s) + ["</s>"]

    # our convention fed to NLTK: everygrams of the padded sentence that end on a predicted token
    nltk_train = [[g for g in everygrams(padded(s), max_len=order) if g[-1] != "<s>"] for s in train]
    words = [w for s in train for w in _nltk_tokens(s)] + ["<s>", "</s>"] * min_count
    oracle = KneserNeyInterpolated(order, discount=discount, vocabulary=Vocabulary(words, unk_cutoff=min_count))
    oracle.fit(nltk_train)
    test_ngrams = [tuple(p[i - order + 1: i + 1]) for s in test for p in [padded(s)] for i in range(order - 1, len(p))]
    assert len(test_ngrams) == len(ours.token_log_probs(test))
    assert ours.perplexity(test) == pytest.approx(oracle.perplexity(test_ngrams), rel=1e-6)
    theirs = [oracle.logscore(g[-1], g[:-1]) * math.log(2) for g in test_ngrams[:40]]
    np.testing.assert_allclose(ours.token_log_probs(test)[:40], theirs, rtol=1e-9)


# ---------------------------------------------------------------- persistence
def test_save_load_round_trips_exactly_as_parquet_and_json(tmp_path) -> None:
    train, test = _random_corpus(5), _random_corpus(6, n_sent=15)
    for params in (dict(order=4), dict(order=3, smoothing="add_k", k=0.2, min_count=2),
                   dict(order=2, smoothing="kneser_ney", discount=0.3, vocab_size=40)):
        model = NgramLM(**params).fit(train)
        d = tmp_path / str(len(list(tmp_path.iterdir())))
        model.save(d)
        assert sorted(p.name for p in d.iterdir()) == sorted(
            ["config.json"] + [f"ngrams_{k}.parquet" for k in range(1, model.order + 1)])
        assert json.loads((d / "config.json").read_text())["order"] == model.order
        loaded = NgramLM.load(d)
        assert loaded.get_params() == model.get_params()
        np.testing.assert_array_equal(loaded.known_, model.known_)
        assert loaded.discounts_ == model.discounts_
        np.testing.assert_array_equal(loaded.token_log_probs(test), model.token_log_probs(test))
        for ctx in ([BOS], [BOS, 5, 6], [BOS, 0, 9, 7]):
            np.testing.assert_array_equal(loaded.log_probs(ctx), model.log_probs(ctx))


def test_a_model_fit_from_the_summed_counts_of_parts_is_the_model_fit_from_the_whole(tmp_path) -> None:
    # What the n-gram pieces rely on (tasks/ngram_pieces.py: count_ngrams): counted rows of parts, in any order, with
    # repeats, give the same files as `fit`; <unk> (min_count) follows the summed counts, not any part's.
    train = _random_corpus(7)
    for params in (dict(order=3, min_count=3), dict(order=2, smoothing="add_k", k=0.5, min_count=2)):
        whole = NgramLM(**params, vocab_size=30).fit(train)
        model = NgramLM(**params, vocab_size=30)
        parts = [model.ngram_rows(train[i: i + 40]) for i in range(0, len(train), 40)]
        rows = np.concatenate(parts[::-1])
        unique, counts = np.unique(rows, axis=0, return_counts=True)
        summed = model.fit_counts(np.concatenate([unique, rows[:5]]),
                                  np.concatenate([counts, np.zeros(5, np.int64)]))
        whole.save(tmp_path / "whole")
        summed.save(tmp_path / "summed")
        for name in sorted(p.name for p in (tmp_path / "whole").iterdir()):
            assert (tmp_path / "whole" / name).read_bytes() == (tmp_path / "summed" / name).read_bytes(), name


def test_damaged_saved_model_names_the_file(tmp_path) -> None:
    model = NgramLM(order=2).fit(_random_corpus(5))
    model.save(tmp_path / "m")
    (tmp_path / "m" / "ngrams_2.parquet").write_bytes(b"not parquet")  # was polars' ComputeError, no file name
    with pytest.raises(InputError, match="ngrams_2.parquet: cannot read the n-gram table"):
        NgramLM.load(tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    del config["order"]
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match="config.json: the n-gram config lacks order"):  # was KeyError
        NgramLM.load(tmp_path / "m")


def test_ngram_tables_hold_hand_counted_ngrams() -> None:
    model = NgramLM(order=2, discount=0.5, min_count=1).fit(TINY + [np.array([A, B])])
    bigrams = model.ngram_table(2).sort(["w1", "w2"])
    assert bigrams.to_dict(as_series=False) == {
        "w1": [BOS, A, A, B, C], "w2": [A, B, C, EOS, EOS], "count": [3, 2, 1, 2, 1]}
    unigrams = model.ngram_table(1).sort("w1")
    # continuation counts: distinct left neighbours (</s> follows b and c)
    assert unigrams.to_dict(as_series=False) == {
        "w1": [EOS, A, B, C], "count": [3, 3, 2, 1], "continuation": [2, 1, 1, 1]}
    assert unigrams.schema["w1"] == pl.UInt32


# ---------------------------------------------------------------- <unk> handling
def test_rare_unseen_and_out_of_range_ids_are_unk() -> None:
    train = [np.array([A, B, A]), np.array([A, C]), np.array([B])]  # c occurs once
    model = NgramLM(order=2, smoothing="kneser_ney", discount=0.5, min_count=2, vocab_size=8).fit(train)
    assert not model.known_[C] and model.known_[UNK]
    p = np.exp(model.log_probs([BOS, A]))
    assert p[C] == 0 and p[UNK] > 0
    # a rare, an unseen (7) and an out-of-range (99) id all score as <unk>, in context and as the word
    ref = model.token_log_probs([np.array([A, UNK, UNK])])
    for other in (C, 7, 99):
        np.testing.assert_array_equal(model.token_log_probs([np.array([A, other, other])]), ref)
        np.testing.assert_array_equal(model.log_probs([BOS, other]), model.log_probs([BOS, UNK]))
    # leading <s> ids are optional: a short context is sentence-initial
    np.testing.assert_array_equal(model.log_probs([A]), model.log_probs([BOS, BOS, A]))


# ---------------------------------------------------------------- user errors
def test_bad_parameters_and_inputs_raise_clear_errors() -> None:
    for bad in (dict(order=0), dict(smoothing="witten_bell"), dict(order=1, smoothing="kneser_ney"),
                dict(discount=1.5), dict(k=0), dict(min_count=0), dict(unk_id=1), dict(vocab_size=3)):
        with pytest.raises(ParameterError):
            NgramLM(**bad)
    with pytest.raises(InputError, match="empty"):
        NgramLM().fit([])
    with pytest.raises(InputError, match="boundary"):
        NgramLM().fit([np.array([BOS, A])])
    with pytest.raises(InputError, match="negative"):
        NgramLM().fit([np.array([-1, A])])
    with pytest.raises(ParameterError, match="not fitted"):
        NgramLM().log_probs([BOS])


def read_arpa(path) -> dict[int, dict[tuple[str, ...], tuple[float, float]]]:
    """{order: {n-gram: (log10 p, log10 back-off)}} of an ARPA file."""
    table: dict[int, dict[tuple[str, ...], tuple[float, float]]] = {}
    order = 0
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.endswith("-grams:"):
            order = int(line[1:].split("-")[0])
            table[order] = {}
        elif order and line.strip() and not line.startswith("\\"):
            parts = line.split("\t")
            table[order][tuple(parts[1].split())] = (float(parts[0]), float(parts[2]) if len(parts) > 2 else 0.0)
    return table


def arpa_log10(table, context: tuple[str, ...], word: str) -> float:
    """The textbook back-off reading: the longest stored (context suffix, word), times the back-off
    weights of the longer contexts it skipped (1 for a context not stored)."""
    for start in range(len(context) + 1):
        gram = (*context[start:], word)
        if gram in table.get(len(gram), {}):
            skipped = [table.get(len(context) - s, {}).get(context[s:], (0.0, 0.0))[1] for s in range(start)]
            return table[len(gram)][gram][0] + sum(skipped)
    return -math.inf


@pytest.mark.parametrize("order", [2, 3, 4])
def test_arpa_export_read_by_back_off_gives_our_probabilities(tmp_path, order: int) -> None:
    rng = np.random.default_rng(order)
    ids = np.array([0, *range(4, 12)])  # <unk> and words; 1..3 are <s> </s> <pad>
    train = [rng.choice(ids, size=rng.integers(1, 9)) for _ in range(200)]
    held = [rng.choice(np.append(ids, 12), size=rng.integers(1, 9)) for _ in range(30)]  # 12 unseen: <unk>
    lm = NgramLM(order=order).fit(train)
    tokens = ["<unk>", "<s>", "</s>", "<pad>"] + [f"w{i}" for i in range(4, lm.vocab_size_)]
    lm.to_arpa(tmp_path / "lm.arpa", tokens)
    table = read_arpa(tmp_path / "lm.arpa")
    expected = lm.token_log_probs(held) / math.log(10)
    got = []
    for s in held:
        words = [tokens[int(w)] if int(w) < lm.vocab_size_ else "<unk>" for w in s] + ["</s>"]
        padded = ["<s>"] * (order - 1) + words
        got += [arpa_log10(table, tuple(padded[i:i + order - 1]), padded[i + order - 1]) for i in range(len(words))]
    np.testing.assert_allclose(got, expected, atol=1e-6)
    kenlm = pytest.importorskip("kenlm")  # the benchmark's peer (a dev extra): same numbers
    model = kenlm.Model(str(tmp_path / "lm.arpa"))
    scores = []
    for s in held:
        state, out = kenlm.State(), kenlm.State()
        model.NullContextWrite(state)
        for _ in range(order - 1):
            model.BaseScore(state, "<s>", out)
            state, out = out, state
        for w in [tokens[int(w)] if int(w) < lm.vocab_size_ else "<unk>" for w in s] + ["</s>"]:
            scores.append(model.BaseScore(state, w, out))
            state, out = out, state
    np.testing.assert_allclose(scores, expected, atol=1e-5)


def test_sentence_arrays_are_each_lists_ids_empty_lists_included():
    from lexiflow.models.lm.ngram import sentence_arrays

    ids = pl.Series("ids", [[4, 5, 6], [], [7], [8, 9]], dtype=pl.List(pl.UInt32))
    got = sentence_arrays(ids)
    assert [a.tolist() for a in got] == [[4, 5, 6], [], [7], [8, 9]]
    assert all(a.dtype == np.int64 for a in got)
    assert sentence_arrays(ids.head(0)) == []
