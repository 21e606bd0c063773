import numpy as np
import polars as pl
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st
from lexiflow.models import cooccurrence
from lexiflow.models.cooccurrence import (
    cooccurrence_matrix,
    id_stream,
    keep_probabilities,
    subsample,
    term_document_columns,
)
from lexiflow.models.errors import ParameterError


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


@pytest.mark.parametrize("ids, offsets, message", [
    ([0, -1, 1], [0, 3], "token id -1 is outside the vocabulary of size 3"),  # would wrap around to a pair
    ([0, 1, 2], [0, 2], r"offsets \(got 0..2\) must start at 0, never decrease and end at len\(ids\) = 3"),
    ([0, 1, 2], [0, 1, 4], "end at len"),
    ([0, 1, 2], [1, 3], "start at 0"),
    ([0, 1, 2], [0, 2, 1, 3], "never decrease"),
    ([], [], "got none"),
])
def test_malformed_streams_are_rejected_with_a_clear_error(ids, offsets, message):
    with pytest.raises(ParameterError, match=message):
        cooccurrence_matrix(np.array(ids, dtype=np.int64), np.array(offsets), 3)


def term_document_reference(ids, doc_offsets, vocab_size, first_doc=0):
    """The textbook (vocab_size × documents) count matrix: a 1 at (term, document) per token, duplicates summed."""
    docs = np.repeat(np.arange(first_doc, first_doc + len(doc_offsets) - 1), np.diff(doc_offsets))
    return sp.csr_matrix((np.ones(len(ids)), (ids, docs)), shape=(vocab_size, first_doc + len(doc_offsets) - 1))


def test_term_document_counts():
    # Documents [0, 1, 1], [], [2, 0]: column by column, (term, count).
    got = term_document_columns(np.array([0, 1, 1, 2, 0]), np.array([0, 3, 3, 5]), 3)
    assert got.rows() == [(0, 0, 1.0), (1, 0, 2.0), (0, 2, 1.0), (2, 2, 1.0)]
    np.testing.assert_array_equal(term_document_reference(np.array([0, 1, 1, 2, 0]), np.array([0, 3, 3, 5]), 3)
                                  .toarray(), [[1, 0, 1], [2, 0, 0], [0, 0, 1]])


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(0, 20), max_size=15), vocab_size=st.integers(1, 12), first=st.integers(0, 3),
       block=st.integers(1, 40), seed=st.integers(0, 2**32 - 1))
def test_term_document_columns_are_the_matrix_entries_by_document(lengths, vocab_size, first, block, seed):
    # Known answer: the textbook matrix (one COO -> CSR) read column by column; blocks of any size.
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    ids = np.random.default_rng(seed).integers(0, vocab_size, offsets[-1]).astype(np.uint32)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cooccurrence, "_CHUNK_TOKENS", block)
        got = term_document_columns(ids, offsets, vocab_size, first)
    csc = term_document_reference(ids, offsets, vocab_size, first).tocsc()
    csc.sum_duplicates()
    assert got.schema == {"row": pl.UInt32, "col": pl.UInt32, "value": pl.Float64}
    np.testing.assert_array_equal(got["row"], csc.indices)
    np.testing.assert_array_equal(got["col"], np.repeat(np.arange(csc.shape[1]), np.diff(csc.indptr)))
    np.testing.assert_array_equal(got["value"], csc.data)


def test_id_stream_by_hand():
    # Sentences: [5, 1, 6], null, [], [7, 8] (held out), [2, None, 9]; ids below 4 are specials.
    lists = pl.Series([[9, 9], [5, 1, 6], None, [], [7, 8], [2, None, 9]], dtype=pl.List(pl.UInt32)).slice(1)
    ids, offsets = id_stream(lists, min_id=4, sentences=np.array([True, True, True, False, True]))
    np.testing.assert_array_equal(ids, [5, 6, 9])
    np.testing.assert_array_equal(offsets, [0, 2, 2, 2, 2, 3])
    ids, offsets = id_stream(lists)
    np.testing.assert_array_equal(ids, [5, 1, 6, 7, 8, 2, 9])
    np.testing.assert_array_equal(offsets, [0, 3, 3, 3, 5, 7])


def _draw(seed: int, sentence: int, position: int) -> float:
    """u(seed, s, k) of `subsample`, one token at a time in Python integers (SplitMix64's finaliser)."""
    def mix(x):
        x = (x + 0x9E3779B97F4A7C15) % 2**64
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) % 2**64
        return x ^ (x >> 31)
    return (mix(((sentence << 24) + position) ^ mix(seed)) >> 11) * 2.0**-53


@pytest.mark.parametrize("block", [1, 5, 64, 1 << 18])
def test_subsampling_draws_each_token_by_its_sentence_and_position(block, monkeypatch):
    # Known answer: the hash evaluated token by token; drawn in blocks of any size (blocks cut sentences).
    monkeypatch.setattr(cooccurrence, "_SUBSAMPLE_BLOCK", block)
    rng = np.random.default_rng(2)
    offsets = np.concatenate(([0], np.cumsum(rng.integers(0, 9, 60))))
    ids = rng.integers(0, 3, offsets[-1])
    keep_prob = np.array([0.3, 0.8, 1.0])
    kept, kept_offsets = subsample(ids, offsets, keep_prob, seed=11, first_sentence=100)
    expected = [[t for k, t in enumerate(ids[a:b]) if keep_prob[t] == 1.0 or _draw(11, 100 + s, k) < keep_prob[t]]
                for s, (a, b) in enumerate(zip(offsets[:-1], offsets[1:], strict=True))]
    np.testing.assert_array_equal(kept, np.concatenate(expected))
    np.testing.assert_array_equal(kept_offsets, np.concatenate(([0], np.cumsum([len(e) for e in expected]))))


def test_keep_probabilities_by_hand_and_as_gensim_computes_them():
    # f = .6, .2, .2 at t = .1: (√6 + 1)·.1/.6 = .5749; (√2 + 1)·.1/.2 > 1 -> 1; unseen words are kept.
    np.testing.assert_allclose(keep_probabilities(np.array([6, 2, 2, 0]), 0.1),
                               [(6**0.5 + 1) / 6, 1, 1, 1], rtol=1e-12)
    np.testing.assert_array_equal(keep_probabilities(np.array([6, 2]), 0), [1, 1])
    from gensim.models import Word2Vec

    rng = np.random.default_rng(0)
    words = [f"w{k}" for k in rng.zipf(1.3, 20_000) if k < 400]
    model = Word2Vec(vector_size=4, min_count=1, sample=1e-3)
    model.build_vocab([words])
    vocab = sorted(model.wv.key_to_index)
    counts = np.array([model.wv.get_vecattr(w, "count") for w in vocab])
    gensim_p = np.array([model.wv.get_vecattr(w, "sample_int") for w in vocab]) / 2**32
    np.testing.assert_allclose(keep_probabilities(counts, 1e-3), gensim_p, atol=1e-9)


def test_subsampling_keeps_each_word_at_its_rate_and_shards_agree_with_the_whole():
    rng = np.random.default_rng(1)
    lengths = rng.integers(0, 40, 5000)
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    ids = rng.integers(0, 4, offsets[-1])
    keep_prob = np.array([0.1, 0.5, 0.9, 1.0])
    kept, kept_offsets = subsample(ids, offsets, keep_prob, seed=3)
    assert kept_offsets[-1] == len(kept) and np.all(np.diff(kept_offsets) <= lengths)
    for word, p in enumerate(keep_prob):
        n = np.sum(ids == word)
        assert abs(np.sum(kept == word) / n - p) <= 4 * np.sqrt(p * (1 - p) / n) + 1e-12
    # A sentence keeps an order-preserving subsequence of its own tokens.
    for s in (0, 17, 4999):
        sentence = iter(ids[offsets[s]:offsets[s + 1]].tolist())
        assert all(t in sentence for t in kept[kept_offsets[s]:kept_offsets[s + 1]].tolist())  # consumes in order
    # Shards cut at sentence 1234: each draws by its sentences' numbers in the whole corpus.
    cut = 1234
    head = subsample(ids[:offsets[cut]], offsets[:cut + 1], keep_prob, seed=3)
    tail = subsample(ids[offsets[cut]:], offsets[cut:] - offsets[cut], keep_prob, seed=3, first_sentence=cut)
    np.testing.assert_array_equal(np.concatenate((head[0], tail[0])), kept)
    np.testing.assert_array_equal(np.concatenate((head[1], tail[1][1:] + head[1][-1])), kept_offsets)
    other_seed, _ = subsample(ids, offsets, keep_prob, seed=4)
    assert not np.array_equal(other_seed, kept)
    everything, same_offsets = subsample(ids, offsets, np.ones(4), seed=3)
    np.testing.assert_array_equal(everything, ids)
    np.testing.assert_array_equal(same_offsets, offsets)


def test_counting_reuses_its_buffers_and_gives_them_back():
    # Fresh memory is zero-filled by the kernel on first touch: the second count of a stream takes no new
    # buffer, a smaller one neither, and counts the same; the stage's end frees them.
    rng = np.random.default_rng(4)
    offsets = np.concatenate(([0], np.cumsum(rng.integers(0, 20, 3000))))
    ids = rng.integers(0, 50, offsets[-1])
    first = cooccurrence.distance_counts(ids, offsets, 50, window=4)
    buffers = dict(cooccurrence._scratch().buffers)
    again = cooccurrence.distance_counts(ids, offsets, 50, window=4)
    smaller = cooccurrence.distance_counts(ids[: offsets[100]], offsets[:101], 50, window=4)
    assert all(cooccurrence._scratch().buffers[name] is buffer for name, buffer in buffers.items())
    assert (first != again).nnz == 0
    np.testing.assert_allclose(cooccurrence.weigh(smaller, 50).toarray(),
                               reference(ids[: offsets[100]], offsets[:101], 50, 4, "harmonic"), atol=1e-12)
    cooccurrence.release_scratch()
    assert not cooccurrence._scratches
