"""Decoding strategies against hand-made next-token distributions and brute-force search."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lexiflow.models.errors import ParameterError
from lexiflow.models.lm.decoding import beam, filter_probs, generate, greedy, sample
from lexiflow.models.lm.ngram import NgramLM

BOS, EOS = 1, 2


def batched(log_probs):
    """The decoders' scorer, (B contexts) -> (B, V), from a one-context toy model."""
    return lambda contexts: np.stack([log_probs(c) for c in contexts])


def table_lm(table: dict[tuple[int, ...], dict[int, float]], vocab: int = 6):
    """log_probs from a hand-made table: generated suffix (after the prompt [BOS]) -> {token: prob}."""

    def log_probs(context: Sequence[int]) -> np.ndarray:
        p = np.zeros(vocab)
        for t, v in table[tuple(context[1:])].items():
            p[t] = v
        with np.errstate(divide="ignore"):
            return np.log(p)

    return batched(log_probs)


# <s> -> a (0.6) or b (0.4); a -> c / d / </s> (0.35 / 0.35 / 0.3); b -> </s> (0.9) or c (0.1); ...
A, B, C, D = 3, 4, 5, 0
TREE = table_lm({
    (): {A: 0.6, B: 0.4},
    (A,): {C: 0.35, D: 0.35, EOS: 0.3},
    (B,): {EOS: 0.9, C: 0.1},
    (A, C): {EOS: 1.0}, (A, D): {EOS: 1.0}, (B, C): {EOS: 1.0},
})


def test_greedy_follows_the_argmax_and_stops_at_eos() -> None:
    # ties (c and d at 0.35) go to the lower id: d = 0
    assert greedy(TREE, [BOS], max_new_tokens=10, eos_id=EOS) == [A, D, EOS]
    assert greedy(TREE, [BOS], max_new_tokens=2, eos_id=EOS) == [A, D]
    assert greedy(TREE, [BOS], max_new_tokens=0, eos_id=EOS) == []


def test_beam_finds_the_sequence_greedy_misses() -> None:
    # greedy: a d </s> = 0.6 * 0.35 = 0.21; best: b </s> = 0.36
    assert beam(TREE, [BOS], max_new_tokens=5, eos_id=EOS, width=2, alpha=0.0) == [B, EOS]
    assert beam(TREE, [BOS], max_new_tokens=5, eos_id=EOS, width=1, alpha=0.0) == [A, D, EOS]


def test_length_normalisation_alpha_trades_length_for_mean_log_probability() -> None:
    lm = table_lm({(): {EOS: 0.4, A: 0.6}, (A,): {EOS: 0.6, A: 0.4}, (A, A): {EOS: 1.0}})
    # [</s>]: log 0.4 = -0.92; [a </s>]: log 0.36 = -1.02, per token -0.51
    assert beam(lm, [BOS], max_new_tokens=2, eos_id=EOS, width=3, alpha=0.0) == [EOS]
    assert beam(lm, [BOS], max_new_tokens=2, eos_id=EOS, width=3, alpha=1.0) == [A, EOS]


def _random_lm(seed: int, vocab: int = 4):
    def log_probs(context: Sequence[int]) -> np.ndarray:
        rng = np.random.default_rng([seed, *context])
        return np.log(rng.dirichlet(np.full(vocab, 0.5)))

    return log_probs


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_wide_beam_equals_exhaustive_search(seed: int, alpha: float) -> None:
    lm, vocab, max_len = _random_lm(seed), 4, 3
    best, best_score = None, -math.inf
    for length in range(1, max_len + 1):
        for seq in itertools.product(range(vocab), repeat=length):
            if EOS in seq[:-1] or (length < max_len and seq[-1] != EOS):
                continue  # finished at </s>, or cut at max_new_tokens
            total = sum(lm([BOS, *seq[:i]])[t] for i, t in enumerate(seq))
            if total / length**alpha > best_score:
                best, best_score = list(seq), total / length**alpha
    assert beam(batched(lm), [BOS], max_new_tokens=max_len, eos_id=EOS, width=64, alpha=alpha) == best


def test_beam_scores_all_live_hypotheses_in_one_call_per_step() -> None:
    lm = _random_lm(7, vocab=6)
    calls = []

    def scorer(contexts: Sequence[Sequence[int]]) -> np.ndarray:
        calls.append([list(c) for c in contexts])
        return np.stack([lm(c) for c in contexts])

    out = beam(scorer, [BOS, 4], max_new_tokens=6, eos_id=EOS, width=3)
    assert [len(c) for c in calls] == [1, 3, 3, 3, 3, 3]  # one call a step; the prompt alone, then the beam
    assert all(len({tuple(c) for c in step}) == len(step) for step in calls)  # distinct hypotheses
    assert all(c[:2] == [BOS, 4] and len(c) == 2 + i for i, step in enumerate(calls) for c in step)
    # the same answer as scoring each hypothesis on its own (a scorer that sees one context a call)
    assert beam(lambda cs: np.concatenate([scorer([c]) for c in cs]), [BOS, 4], max_new_tokens=6, eos_id=EOS,
                width=3) == out


def test_top_k_keeps_exactly_the_k_most_probable() -> None:
    lp = np.log([0.1, 0.4, 0.2, 0.3])
    np.testing.assert_allclose(filter_probs(lp, top_k=2), [0, 4 / 7, 0, 3 / 7])
    np.testing.assert_allclose(filter_probs(lp, top_k=1), [0, 1, 0, 0])
    np.testing.assert_allclose(filter_probs(lp, top_k=10), [0.1, 0.4, 0.2, 0.3])


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    lp = np.log([0.1, 0.4, 0.2, 0.3])
    np.testing.assert_allclose(filter_probs(lp, top_p=0.4), [0, 1, 0, 0])  # 0.4 alone reaches 0.4
    np.testing.assert_allclose(filter_probs(lp, top_p=0.7), [0, 4 / 7, 0, 3 / 7])  # 0.4 + 0.3 = 0.7
    np.testing.assert_allclose(filter_probs(lp, top_p=0.71), [0, 4 / 9, 2 / 9, 3 / 9])
    np.testing.assert_allclose(filter_probs(lp, top_p=1.0), [0.1, 0.4, 0.2, 0.3])
    np.testing.assert_allclose(filter_probs(lp, top_k=3, top_p=0.95), [0, 4 / 9, 2 / 9, 3 / 9])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.01, 1.0), min_size=2, max_size=12), st.floats(0.05, 0.99))
def test_top_p_set_is_minimal(weights: list[float], p: float) -> None:
    probs = np.array(weights) / sum(weights)
    kept = filter_probs(np.log(probs), top_p=p) > 0
    mass = probs[kept].sum()
    assert mass >= p * (1 - 1e-9)
    assert mass - probs[kept].min() < p  # dropping the least probable kept token falls short of p
    # kept tokens are the most probable, up to the last bit: the filter ranks log-probabilities, which cannot
    # order probabilities a rounding apart (weights 1.0 and 0.9999999999999999)
    assert probs[~kept].max(initial=0) <= probs[kept].min() * (1 + 1e-12)


def test_temperature_sharpens_and_flattens_and_zero_is_greedy() -> None:
    lp = np.log([0.1, 0.4, 0.2, 0.3])
    p2 = np.sqrt([0.1, 0.4, 0.2, 0.3])
    np.testing.assert_allclose(filter_probs(lp, temperature=2.0), p2 / p2.sum())
    np.testing.assert_allclose(filter_probs(lp, temperature=1e-3), [0, 1, 0, 0], atol=1e-12)
    lm = batched(_random_lm(3, vocab=8))
    want = greedy(lm, [BOS], max_new_tokens=12, eos_id=EOS)
    for seed in range(5):
        assert sample(lm, [BOS], max_new_tokens=12, eos_id=EOS, temperature=0.0, seed=seed) == want
        assert sample(lm, [BOS], max_new_tokens=12, eos_id=EOS, temperature=1e-4, seed=seed) == want


def test_tiny_temperature_is_greedy_and_nan_or_infinite_temperature_is_refused() -> None:
    lp = np.array([np.log(0.1), np.log(0.4), -np.inf, np.log(0.5)])  # a zero-probability token, as n-grams give
    np.testing.assert_array_equal(filter_probs(lp, temperature=1e-308), [0, 0, 0, 1])  # lp / T overflows; T normal
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ParameterError, match="temperature=(nan|inf): must be a finite number >= 0"):
            filter_probs(lp, temperature=bad)


def test_sampling_frequencies_follow_the_filtered_distribution_and_seed_is_deterministic() -> None:
    probs = np.array([0.05, 0.45, 0.2, 0.3])

    def lm(contexts: Sequence[Sequence[int]]) -> np.ndarray:
        return np.log(np.tile(probs, (len(contexts), 1)))

    n = 6000
    draws = sample(lm, [BOS], max_new_tokens=n, eos_id=-1, top_k=3, temperature=1.0, seed=11)
    freq = np.bincount(draws, minlength=4) / n
    want = filter_probs(np.log(probs), top_k=3)
    assert freq[0] == 0
    assert np.abs(freq - want).max() < 4 * np.sqrt(0.25 / n)
    assert draws[:50] == sample(lm, [BOS], max_new_tokens=50, eos_id=-1, top_k=3, seed=11)
    assert draws[:50] != sample(lm, [BOS], max_new_tokens=50, eos_id=-1, top_k=3, seed=12)
    nucleus = sample(lm, [BOS], max_new_tokens=500, eos_id=-1, top_p=0.7, seed=np.random.default_rng(0))
    assert set(nucleus) == {1, 3}  # 0.45 + 0.3 >= 0.7


def test_generate_dispatches_and_rejects_unknown_options() -> None:
    assert generate(TREE, [BOS], "beam", max_new_tokens=5, eos_id=EOS, width=2, alpha=0.0) == [B, EOS]
    assert generate(TREE, [BOS], max_new_tokens=5, eos_id=EOS) == [A, D, EOS]
    with pytest.raises(ParameterError, match="strategy"):
        generate(TREE, [BOS], "nucleus")
    with pytest.raises(ParameterError, match="top_p"):
        generate(TREE, [BOS], "greedy", top_p=0.9)
    with pytest.raises(ParameterError):
        filter_probs(np.log([0.5, 0.5]), top_p=1.5)
    for seed in (-1, 1.5):  # numpy's ValueError / TypeError reached `lexiflow generate --seed -1` as a traceback
        with pytest.raises(ParameterError, match=f"seed={seed}: must be an integer >= 0"):
            generate(TREE, [BOS], "sample", seed=seed)


def test_decoding_an_ngram_model_reproduces_its_training_sentence() -> None:
    sentence = np.array([7, 5, 9, 4, 8])
    lm = NgramLM(order=3, smoothing="kneser_ney", discount=0.1).fit([sentence] * 3 + [np.array([5, 4])])
    assert generate(lm.log_probs_batch, [BOS], "greedy", max_new_tokens=10) == [*sentence.tolist(), EOS]
    assert generate(lm.log_probs_batch, [BOS], "beam", max_new_tokens=10, width=3) == [*sentence.tolist(), EOS]
    out = generate(lm.log_probs_batch, [BOS, 7], "sample", max_new_tokens=10, top_p=0.5, seed=0)
    assert out == [5, 9, 4, 8, EOS]
