import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from models.cooccurrence import cooccurrence_matrix, term_document_matrix
from models.errors import ParameterError


def reference(ids, offsets, vocab_size, window, weighting):
    """The textbook double loop over tokens and distances."""
    out = np.zeros((vocab_size, vocab_size))
    for a, b in zip(offsets[:-1], offsets[1:], strict=True):
        sent = ids[a:b]
        for i in range(len(sent)):
            for d in range(1, window + 1):
                if i + d < len(sent):
                    w = 1.0 / d if weighting == "harmonic" else 1.0
                    out[sent[i], sent[i + d]] += w
                    out[sent[i + d], sent[i]] += w
    return out


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 30), min_size=1, max_size=12),
    vocab_size=st.integers(1, 9),
    window=st.integers(1, 6),
    weighting=st.sampled_from(["uniform", "harmonic"]),
    chunk=st.integers(1, 50),
    seed=st.integers(0, 2**32 - 1),
)
def test_equals_slow_reference_on_random_streams(lengths, vocab_size, window, weighting, chunk, seed):
    rng = np.random.default_rng(seed)
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    ids = rng.integers(0, vocab_size, size=offsets[-1]).astype(np.uint32)
    got = cooccurrence_matrix(ids, offsets, vocab_size, window, weighting, chunk_tokens=chunk).toarray()
    np.testing.assert_allclose(got, reference(ids, offsets, vocab_size, window, weighting), atol=1e-12)


def test_hand_counted_example():
    # "a b a c" with window 2, harmonic: (a,b)=1+1 [d=1 twice], (a,a)=1/2+1/2, (b,c)=1/2, (a,c)=1
    ids = np.array([0, 1, 0, 2])
    got = cooccurrence_matrix(ids, np.array([0, 4]), 3, window=2, weighting="harmonic").toarray()
    np.testing.assert_allclose(got, [[1.0, 2.0, 1.0], [2.0, 0.0, 0.5], [1.0, 0.5, 0.0]])


def test_windows_do_not_cross_sentences():
    got = cooccurrence_matrix(np.array([0, 1]), np.array([0, 1, 2]), 2, window=5).toarray()
    assert got.sum() == 0


def test_bad_parameters_are_named():
    with pytest.raises(ParameterError, match="window=0"):
        cooccurrence_matrix(np.array([0]), np.array([0, 1]), 1, window=0)
    with pytest.raises(ParameterError, match="outside the vocabulary"):
        cooccurrence_matrix(np.array([5]), np.array([0, 1]), 3)


def test_term_document_counts():
    m = term_document_matrix(np.array([0, 1, 1, 2, 0]), np.array([0, 3, 3, 5]), 3).toarray()
    np.testing.assert_array_equal(m, [[1, 0, 1], [2, 0, 0], [0, 0, 1]])
