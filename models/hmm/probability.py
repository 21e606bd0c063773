"""Sequence probabilities of an HMM, as the midterm review (notes 000, "Hidden Markov Models") writes them:

    P(S, O) = pi(s_1) P(o_1 | s_1) prod_{i=2..n} P(s_i | s_{i-1}) P(o_i | s_i)     (joint_log_prob)
    P(O)    = sum_S P(S, O), by the forward algorithm in O(n K^2)                   (forward_log_prob)

Pure functions of the tables, in natural logs (a zero probability is -inf). `emissions[t, s]` is
P(o_t | s) for the observation at position t, so the same code serves any emission model. `final`
(optional) multiplies in P(</s> | s_n), the end transition the notes leave out; without it the joint
sums to 1 over the tag sequences and words of each fixed length n.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from lexiflow.models.errors import ParameterError
from lexiflow.models.hmm.counts import log
from lexiflow.models.hmm.unknown import logsumexp


def _check(initial: np.ndarray, transition: np.ndarray, emissions: np.ndarray, final: np.ndarray | None) -> int:
    k = initial.shape[0]
    if transition.shape != (k, k) or emissions.ndim != 2 or emissions.shape[1] != k or emissions.shape[0] < 1:
        raise ParameterError(f"HMM tables: initial {initial.shape}, transition {transition.shape} and emissions "
                             f"{emissions.shape} must be (K,), (K, K) and (n >= 1, K)")
    if final is not None and final.shape != (k,):
        raise ParameterError(f"HMM final {final.shape}: must be (K,) = ({k},)")
    return k


def joint_log_prob(initial: np.ndarray, transition: np.ndarray, emissions: np.ndarray, states: Sequence[int],
                   final: np.ndarray | None = None) -> float:
    """log P(S, O) of the state ids `states` (length n) with emissions (n, K)."""
    _check(initial, transition, emissions, final)
    s = np.asarray(states, dtype=np.int64)
    if s.shape != (emissions.shape[0],):
        raise ParameterError(f"{len(s)} states for {emissions.shape[0]} observations: give one state per word")
    terms = [log(initial[s[0]])] + list(log(transition[s[:-1], s[1:]])) + list(log(emissions[np.arange(len(s)), s]))
    if final is not None:
        terms.append(log(final[s[-1]]))
    return float(np.sum(terms))


def forward_log_prob(initial: np.ndarray, transition: np.ndarray, emissions: np.ndarray,
                     final: np.ndarray | None = None) -> float:
    """log P(O) = log sum_S P(S, O): alpha_1(s) = pi(s) P(o_1|s), alpha_t(s) = sum_r alpha_{t-1}(r) P(s|r) P(o_t|s)."""
    _check(initial, transition, emissions, final)
    log_a, log_e = log(transition), log(emissions)
    alpha = log(initial) + log_e[0]
    for t in range(1, emissions.shape[0]):
        alpha = logsumexp(alpha[:, None] + log_a, axis=0)[0] + log_e[t]
    if final is not None:
        alpha = alpha + log(final)
    return float(logsumexp(alpha, axis=0)[0])

