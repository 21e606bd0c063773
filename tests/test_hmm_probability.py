"""HMM sequence probabilities (notes 000, "Hidden Markov Models"): P(S, O) and the forward algorithm P(O),
checked against brute-force enumeration of every tag sequence."""

import itertools
import math

import numpy as np
import pytest
from lexiflow.models.errors import ParameterError
from lexiflow.models.hmm import HMMTagger
from lexiflow.models.hmm.probability import forward_log_prob, joint_log_prob

RNG = np.random.default_rng(7)
K, V = 3, 4
PI = RNG.dirichlet(np.ones(K))
A = RNG.dirichlet(np.ones(K), size=K)  # rows sum to 1
B = RNG.dirichlet(np.ones(V), size=K)  # B[s, o] = P(o | s)


def brute_joint(states, obs):
    p = PI[states[0]] * B[states[0], obs[0]]
    for prev, cur, o in zip(states, states[1:], obs[1:], strict=False):
        p *= A[prev, cur] * B[cur, o]
    return p


def test_joint_is_the_notes_product():
    obs, states = [0, 3, 1], [2, 0, 1]
    assert math.exp(joint_log_prob(PI, A, B[:, obs].T, states)) == pytest.approx(brute_joint(states, obs), rel=1e-12)


@pytest.mark.parametrize("obs", [[1], [0, 2], [3, 1, 1, 0]])
def test_forward_equals_sum_over_every_tag_sequence(obs):
    em = B[:, obs].T
    brute = sum(brute_joint(s, obs) for s in itertools.product(range(K), repeat=len(obs)))
    assert math.exp(forward_log_prob(PI, A, em)) == pytest.approx(brute, rel=1e-12)
    # and the joint, summed by enumeration through the public function, agrees
    joint_sum = sum(math.exp(joint_log_prob(PI, A, em, s)) for s in itertools.product(range(K), repeat=len(obs)))
    assert joint_sum == pytest.approx(brute, rel=1e-12)


def test_p_of_o_sums_to_one_over_all_observation_sequences_of_a_length():
    total = sum(math.exp(forward_log_prob(PI, A, B[:, list(o)].T)) for o in itertools.product(range(V), repeat=3))
    assert total == pytest.approx(1.0, rel=1e-12)


def test_final_transition_multiplies_in_p_end():
    final = np.array([0.5, 0.1, 0.2])
    obs = [2, 0]
    em = B[:, obs].T
    brute = sum(brute_joint(s, obs) * final[s[-1]] for s in itertools.product(range(K), repeat=2))
    assert math.exp(forward_log_prob(PI, A, em, final=final)) == pytest.approx(brute, rel=1e-12)


TOY = [[("the", "D"), ("dog", "N"), ("runs", "V")], [("the", "D"), ("run", "N")], [("dogs", "N"), ("run", "V")]]


def test_tagger_methods_use_the_mle_tables():
    m = HMMTagger(order=2, lambdas=(0.0, 1.0), lexicalize=0).fit(TOY)
    # P(D N V, the dog runs) = pi(D) P(the|D) P(N|D) P(dog|N) P(V|N) P(runs|V) = 2/3 * 1 * 1 * 1/3 * 2/3 * 1/2
    assert math.exp(m.joint_log_prob(["the", "dog", "runs"], ["D", "N", "V"])) == pytest.approx(2 / 3 / 3 * 2 / 3 / 2)
    # with the end transition P(</s> | V) = 1
    assert m.joint_log_prob(["the", "dog", "runs"], ["D", "N", "V"], end=True) == pytest.approx(
        m.joint_log_prob(["the", "dog", "runs"], ["D", "N", "V"]))
    words = ["the", "run"]
    brute = sum(math.exp(m.joint_log_prob(words, list(s))) for s in itertools.product(m.tags_, repeat=2))
    assert math.exp(m.forward_log_prob(words)) == pytest.approx(brute, rel=1e-12)
    assert m.forward_log_prob(["the", "cat"]) == -math.inf  # an unseen word has MLE probability 0
    with pytest.raises(ParameterError, match="not states"):
        m.joint_log_prob(["the"], ["X"])
    with pytest.raises(ParameterError, match="one state per word"):
        m.joint_log_prob(["the", "dog"], ["D"])
