import gensim
import numpy as np
import polars as pl
import pytest
from lexiflow.models.errors import InputError, ParameterError
from lexiflow.models.vectors import keyed_vectors
from lexiflow.models.vocab import Vocabulary
from lexiflow.models.word2vec import ParquetSentences, Word2Vec


def distinct_count_corpus(seed: int = 0) -> list[list[str]]:
    """Word k of 40 occurs exactly 8 + 3k times (all counts distinct, so gensim's own vocabulary
    order is unique); 30 rare words occur once or twice. Shuffled into 12-token sentences."""
    rng = np.random.default_rng(seed)
    stream = [f"w{k}" for k in range(40) for _ in range(8 + 3 * k)]
    stream += [f"rare{k}" for k in range(30) for _ in range(1 + k % 2)]
    stream = [stream[i] for i in rng.permutation(len(stream))]
    return [stream[i:i + 12] for i in range(0, len(stream), 12)]


def tied_corpus(seed: int = 1) -> list[list[str]]:
    """Many words share a count (ties), in an order unrelated to their spelling."""
    rng = np.random.default_rng(seed)
    words = [f"t{k:02d}" for k in rng.permutation(30)]
    stream = [w for k, w in enumerate(words) for _ in range(6 + 2 * (k % 3))]
    stream = [stream[i] for i in rng.permutation(len(stream))]
    return [stream[i:i + 10] for i in range(0, len(stream), 10)]


def vocab_of(sentences, min_count):
    return Vocabulary.count(pl.Series("tokens", sentences), min_count=min_count)


@pytest.mark.parametrize("sg", [True, False])
def test_equals_raw_gensim_with_same_params(sg, tmp_path):
    sentences = distinct_count_corpus()
    path = tmp_path / "corpus.parquet"
    pl.DataFrame({"tokens": sentences}).write_parquet(path, row_group_size=50)
    stream = ParquetSentences(path, batch_rows=17)  # streamed in small batches, restartable
    ours = Word2Vec(sg=sg, dim=16, window=3, negative=4, sample=1e-2, epochs=3, ns_exponent=0.6, seed=11,
                    workers=1, min_count=5)
    ours.fit(stream, vocab_of(sentences, 5))
    raw = gensim.models.Word2Vec(sentences, **ours.gensim_kwargs())
    assert raw.wv.index_to_key == ours.keyed_vectors_.index_to_key
    for word in raw.wv.index_to_key:
        assert np.array_equal(raw.wv[word], ours.keyed_vectors_[word]), word
    assert sum(h["loss"] for h in ours.history_) == pytest.approx(raw.get_latest_training_loss(), rel=1e-6)
    assert len(ours.history_) == 3 and all(h["words_per_s"] > 0 and h["loss"] > 0 for h in ours.history_)
    assert ours.n_sentences_ == len(sentences) and ours.n_words_ == sum(map(len, sentences))


def test_sentences_longer_than_gensims_limit_are_trained_in_pieces():
    # gensim's compiled loop stops a sentence at 10,000 tokens; an unsplit document (split_sentences off,
    # text8-style files) must still train every word: as raw gensim does on the same text cut in pieces.
    rng = np.random.default_rng(0)
    first, second = ([f"{p}{i}" for i in rng.integers(0, 30, 12_000)] for p in "ab")
    document = first[:10_000] + second[:10_000] + first[10_000:]  # "b" words only after token 10,000
    vocab = vocab_of([document], 1)
    whole = Word2Vec(sg=True, dim=8, window=2, epochs=1, seed=3, workers=1).fit([document], vocab)
    pieces = Word2Vec(sg=True, dim=8, window=2, epochs=1, seed=3, workers=1)
    pieces.fit([document[:10_000], document[10_000:20_000], document[20_000:]], vocab)
    assert np.array_equal(whole.vectors_, pieces.vectors_)
    start = Word2Vec(sg=True, dim=8, window=2, epochs=1, seed=3, workers=1).fit([["a0"]], vocab)  # b0 unseen
    assert not np.array_equal(start.keyed_vectors_["b0"], whole.keyed_vectors_["b0"])  # trained: moved


def test_vectors_aligned_with_our_vocabulary_ids_and_words_exactly_ours():
    sentences = tied_corpus()
    vocab = vocab_of(sentences, 1)
    model = Word2Vec(sg=True, dim=8, epochs=1, min_count=1).fit(sentences, vocab)
    tokens = vocab.tokens
    assert model.keyed_vectors_.index_to_key == tokens[4:]  # same words, same order, ties included
    assert model.vectors_.shape == (len(vocab), 8) and model.vectors_.dtype == np.float32
    assert not model.vectors_[:4].any()  # specials: zero rows
    for word, idx in model.keyed_vectors_.key_to_index.items():
        assert np.array_equal(model.vectors_[tokens.index(word)], model.keyed_vectors_.vectors[idx])
    assert model.vectors_[4:].any(axis=1).all()


def test_min_count_leaves_out_rare_vocabulary_words():
    sentences = distinct_count_corpus()
    vocab = vocab_of(sentences, 1)  # rare words included in our vocabulary
    model = Word2Vec(dim=8, epochs=1, min_count=5).fit(sentences, vocab)
    kept = [t for t, c in zip(vocab.tokens, vocab.counts, strict=True) if c >= 5]
    assert model.keyed_vectors_.index_to_key == kept
    rare_ids = [i for i, c in enumerate(vocab.counts) if 0 < c < 5]
    assert rare_ids and not model.vectors_[rare_ids].any()


def test_parquet_text_column_is_pretokenized(tmp_path):
    path = tmp_path / "docs.parquet"
    pl.DataFrame({"text": ["the cat sat.\nit's well-known", "a b"]}).write_parquet(path)
    stream = ParquetSentences(path, column="text")
    assert list(stream) == [["the", "cat", "sat", "."], ["it's", "well-known"], ["a", "b"]]
    assert list(stream) == list(stream)  # restartable
    with pytest.raises(InputError, match="column"):
        list(ParquetSentences(path, column="tokens"))
    with pytest.raises(InputError, match="not found"):
        ParquetSentences(tmp_path / "missing.parquet")
    # a corpus artifact's documents: only the train rows are read (held-out text never trains vectors)
    pl.DataFrame({"text": ["a b", "c d", "e f"], "split": ["train", "test", "train"]}).write_parquet(path)
    assert list(ParquetSentences(path, column="text", split="train")) == [["a", "b"], ["e", "f"]]
    pl.DataFrame({"tokens": [["a"]]}).write_parquet(tmp_path / "tokens.parquet")
    with pytest.raises(InputError, match="no column 'split'"):
        list(ParquetSentences(tmp_path / "tokens.parquet", split="train"))


def test_errors():
    sentences = tied_corpus()
    vocab = vocab_of(sentences, 1)
    with pytest.raises(InputError, match="restartable"):
        Word2Vec().fit(iter(sentences), vocab)
    with pytest.raises(ParameterError, match="negative"):
        Word2Vec(negative=0).fit(sentences, vocab)
    with pytest.raises(InputError, match="min_count"):
        Word2Vec(min_count=1000).fit(sentences, vocab)


def test_keyed_vectors_skip_zero_rows():
    vectors = np.array([[0, 0], [1, 0], [0, 0], [0, 2]], dtype=np.float32)
    kv = keyed_vectors(["<unk>", "a", "<s>", "b"], vectors, counts=np.array([9, 8, 7, 6]))
    assert kv.index_to_key == ["a", "b"] and list(kv.expandos["count"]) == [8, 6]
    assert np.array_equal(kv["b"], [0, 2])


def test_pipeline_parameters_default_to_the_model_defaults():
    # glove's twin: the pipeline's word2vec.* and `Word2Vec()` share the documented defaults (25 epochs for
    # ~1 M-token corpora, docs/embeddings.md; gensim's own default is 5)
    from dataclasses import asdict

    from lexiflow.tasks.params import Word2VecParams

    model = asdict(Word2Vec().config)
    assert Word2VecParams().model_dump(exclude={"continue_from"}) == {
        k: model[k] for k in Word2VecParams.model_fields if k != "continue_from"}
    assert Word2VecParams().continue_from == ""  # trained from random unless asked
    assert model["epochs"] == 25 and gensim.models.Word2Vec().epochs == 5


def test_stage_refuses_a_subword_tokenizer(tmp_path):
    # train-embeddings takes the latest tokenizer when none is named; after a BPE run that is a
    # subword vocabulary, which would leave nearly every corpus word unknown to word2vec.
    from lexiflow.storage import ArtifactStore
    from lexiflow.tasks.corpus import ingest_corpus
    from lexiflow.tasks.embeddings import word2vec_embeddings
    from lexiflow.tasks.params import CorpusParams, TokenizerParams, Word2VecParams
    from lexiflow.tasks.vocabulary import learn_subword

    from tests.stages import publish

    store = ArtifactStore(str(tmp_path))
    docs = publish(store, ingest_corpus, params=CorpusParams(sources=["builtin:lee"]))
    bpe = publish(store, learn_subword, corpus=docs, params=TokenizerParams(kind="bpe", vocab_size=300))
    with pytest.raises(InputError, match=f"inputs.tokenizer={bpe.version}: a bpe tokenizer; sgns learns word"):
        publish(store, word2vec_embeddings, corpus=docs, tokenizer=bpe, method="sgns",
                params=Word2VecParams(epochs=1, dim=8))
    assert not store.exists("embeddings", word2vec_embeddings.version_of(
        {"store": store.url, "corpus": docs, "tokenizer": bpe, "method": "sgns",
         "params": Word2VecParams(epochs=1, dim=8)}))  # nothing published


def test_input_output_and_summed_vectors():
    """Notes 000 "Which set of vectors are used as word embeddings? Typically just u": u is gensim's wv,
    v its negative-sampling output vectors (syn1neg); vectors='u+v' sums them, 'v' takes the outputs."""
    sentences = [["a0", "b0", "a1", "b1"], ["b1", "a0", "b0"]] * 20
    vocab = vocab_of(sentences, 1)
    fits = {which: Word2Vec(sg=True, dim=8, window=2, epochs=2, seed=5, vectors=which).fit(sentences, vocab)
            for which in ("u", "v", "u+v")}
    u, v = fits["u"].input_vectors_, fits["u"].output_vectors_
    assert np.abs(v).sum() > 0 and not np.allclose(u, v)
    np.testing.assert_array_equal(fits["u"].vectors_, u)
    np.testing.assert_array_equal(fits["v"].vectors_, v)  # same seed, same training: the same two sets
    np.testing.assert_allclose(fits["u+v"].vectors_, u + v)
    np.testing.assert_array_equal(fits["u+v"].keyed_vectors_["a0"], (u + v)[vocab.tokens.index("a0")])


def test_continue_from_a_released_version_starts_from_its_vectors_and_says_so(tmp_path):
    """Issue 62: a rebuild of a grown corpus may continue skip-gram from the released model (off by default). The
    continued model starts from the released vectors (its shared words point where they did; a cold model's
    point anywhere: word2vec's axes are arbitrary), and its version names the version it continued, whether
    given by version or by alias."""
    from lexiflow.storage import ArtifactStore, Catalog
    from lexiflow.storage.formats import read_manifest, read_vectors
    from lexiflow.tasks.corpus import ingest_corpus
    from lexiflow.tasks.embeddings import word2vec_embeddings
    from lexiflow.tasks.params import CorpusParams, VocabularyParams, Word2VecParams
    from lexiflow.tasks.vocabulary import learn_vocabulary

    from tests.stages import publish

    store = ArtifactStore(str(tmp_path / "store"))
    grown = tmp_path / "more.txt"
    grown.write_text("\n".join(f"the new line {i} about the government and the police ." for i in range(200)) + "\n")

    def embeddings(sources: list[str], method: str = "sgns", **settings):
        docs = publish(store, ingest_corpus, params=CorpusParams(sources=sources))
        words = publish(store, learn_vocabulary, corpus=docs, params=VocabularyParams(min_count=3))
        return publish(store, word2vec_embeddings, corpus=docs, tokenizer=words, method=method,
                       params=Word2VecParams(epochs=3, dim=16, **settings))

    first = embeddings(["builtin:lee"], seed=1)  # another seed than the rebuilds': another random start
    Catalog(store).release("embeddings", first.version, "production-sgns")
    cold = embeddings(["builtin:lee", str(grown)])
    continued = embeddings(["builtin:lee", str(grown)], continue_from="production-sgns")
    assert continued.version not in (cold.version, first.version)
    assert embeddings(["builtin:lee", str(grown)], continue_from=first.version).version == continued.version
    manifest = read_manifest(continued)
    assert manifest["metrics"]["continued_from"] == manifest["parameters"]["params"]["continue_from"] == \
        first.version

    def cosines(ref) -> np.ndarray:  # each frequent shared word's cosine with its vector in `first`
        (words, _, before), (now_words, _, now) = read_vectors(first), read_vectors(ref)
        index = {w: i for i, w in enumerate(now_words)}
        a, b = before[:300], now[[index[w] for w in words[:300]]]
        return (a * b).sum(axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)

    assert np.median(cosines(continued)) > 0.8 and abs(np.median(cosines(cold))) < 0.5  # measured: 0.94, -0.18
    with pytest.raises(ParameterError, match="sgns.continue_from='nope': no embeddings version or release alias"):
        embeddings(["builtin:lee", str(grown)], continue_from="nope")
    with pytest.raises(ParameterError, match=f"embeddings:{first.version} are sgns vectors of 16 dimensions, not "
                                             "cbow of 16"):
        embeddings(["builtin:lee", str(grown)], method="cbow", continue_from=first.version)
