"""BiLSTM tagger and ELMo biLM: bidirectionality, the scalar mix, padding, save/load, resume."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from lexiflow.models.elmo import BiLM, BiLMConfig, ScalarMix, reverse_padded
from lexiflow.models.errors import InputError, ParameterError
from lexiflow.models.lm.train import StopTraining, TrainConfig, length_batches, module_tensors
from lexiflow.models.neural_tagger import BiLSTMTagger, TaggerConfig

WORDS = [f"w{c}" for c in "abcdefghijkl"]  # letters: digits share one embedding (as 0)


def lookahead_corpus(n: int, seed: int) -> list[list[tuple[str, str, str]]]:
    """Each word's tag is decided by the NEXT word (even index: 'E', odd: 'O'; the last word: 'END'), so
    only a model that reads to the right can tag it; the second column is the word's own parity."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        ids = rng.integers(0, len(WORDS), rng.integers(3, 9))
        tags = ["E" if ids[i + 1] % 2 == 0 else "O" for i in range(len(ids) - 1)] + ["END"]
        out.append([(WORDS[k], t, f"p{k % 2}") for k, t in zip(ids, tags, strict=True)])
    return out


def train_cfg(**kw) -> TrainConfig:
    return TrainConfig(**{"epochs": 1, "batch_size": 8, "lr": 1e-2, "clip_grad_norm": 5.0, "log_every_s": 1e9, **kw})


def tiny(**kw) -> TaggerConfig:
    train = kw.pop("train", train_cfg())
    return TaggerConfig(**{"word_dim": 8, "char_dim": 4, "char_filters": 4, "char_kernels": (2,), "hidden_dim": 12,
                           "num_layers": 2, "dropout": 0.1, "tag_batch_size": 3, "hmm_features": False, "train": train,
                           **kw})


def tiny_bilm(sentences, **kw) -> BiLM:
    cfg = BiLMConfig(dim=6, hidden_dim=10, num_layers=2, char_dim=4, char_filters=3, char_kernels=(1, 2),
                     min_count=1, train=train_cfg(), **kw)
    return BiLM(cfg).fit(sentences)


TRAIN = lookahead_corpus(60, 0)
WORD_SENTS = [[w for w, _, _ in s] for s in TRAIN]


@pytest.fixture(scope="module")
def tagger() -> BiLSTMTagger:
    return BiLSTMTagger(tiny()).fit(TRAIN)


@pytest.fixture(scope="module")
def char_lstm_tagger() -> BiLSTMTagger:
    return BiLSTMTagger(tiny(char_encoder="lstm", char_hidden=5)).fit(TRAIN)


@pytest.fixture(scope="module")
def hmm_tagger() -> BiLSTMTagger:
    return BiLSTMTagger(tiny(hmm_features=True, hmm_folds=3)).fit(TRAIN)


@pytest.fixture(scope="module")
def elmo_tagger() -> BiLSTMTagger:
    bilm = tiny_bilm(WORD_SENTS)
    return BiLSTMTagger(tiny(elmo=True)).fit(TRAIN, bilm=bilm)


def scores(tagger: BiLSTMTagger, words: list[str]) -> torch.Tensor:
    with torch.no_grad():
        return tagger.module_(tagger.batch([words]))[0][0]


@pytest.mark.parametrize("bidirectional", [True, False])
def test_output_at_t_depends_on_later_tokens_only_when_bidirectional(bidirectional):
    tagger = BiLSTMTagger(tiny(bidirectional=bidirectional, train=train_cfg(max_steps=1))).fit(TRAIN[:10])
    a = scores(tagger, ["wb", "wc", "wd", "we", "wf"])
    b = scores(tagger, ["wb", "wc", "wd", "wh", "wi"])  # only positions 3 and 4 changed
    assert bool((a[:3] != b[:3]).any()) is bidirectional
    assert not torch.allclose(a[3:], b[3:])


def test_bidirectional_tagger_learns_a_tag_set_by_the_next_word_and_a_left_to_right_one_cannot():
    test = lookahead_corpus(40, 1)
    words = [[w for w, _, _ in s] for s in test]
    gold = [t for s in test for _, t, _ in s]
    acc = {}
    for bidirectional in (True, False):
        cfg = tiny(bidirectional=bidirectional, train=train_cfg(epochs=12, lr=2e-2), word_dropout_alpha=0.0)
        t = BiLSTMTagger(cfg).fit(lookahead_corpus(200, 2))
        pred = [x for s in t.tag_many(words) for x in s]
        acc[bidirectional] = np.mean(np.array(pred) == np.array(gold))
    assert acc[True] > 0.97  # reads the next word
    assert acc[False] < 0.75  # guesses E/O: about half of the non-final words


def test_bilm_forward_half_ignores_later_tokens_and_backward_half_ignores_earlier_ones():
    bilm = tiny_bilm(WORD_SENTS, token_input="word")
    a = bilm.layers([["wb", "wc", "wd", "we", "wf"]])[0]  # (L+1, n, 2d)
    b = bilm.layers([["wb", "wc", "wj", "we", "wf"]])[0]  # position 2 changed
    d = bilm.config.dim
    for j in range(1, a.shape[0]):
        np.testing.assert_array_equal(a[j, :2, :d], b[j, :2, :d])  # forward LM before the change: untouched
        np.testing.assert_array_equal(a[j, 3:, d:], b[j, 3:, d:])  # backward LM after the change: untouched
        assert not np.allclose(a[j, 3:, :d], b[j, 3:, :d])  # forward LM after it: changed
        assert not np.allclose(a[j, :2, d:], b[j, :2, d:])  # backward LM before it: changed
    np.testing.assert_array_equal(a[0, :, :d], a[0, :, d:])  # layer 0: the token vector, doubled


def test_scalar_mix_is_a_convex_combination_times_gamma():
    mix = ScalarMix(3)
    with torch.no_grad():
        mix.scalars.copy_(torch.tensor([0.0, np.log(2.0), np.log(5.0)]))  # softmax = 1/8, 2/8, 5/8
        mix.gamma.fill_(3.0)
    layers = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]], [[8.0, 8.0]]])  # (3 layers, 1 token, 2 dims)
    w = mix.weights()
    torch.testing.assert_close(w, torch.tensor([1 / 8, 2 / 8, 5 / 8]))
    torch.testing.assert_close(mix(layers), 3.0 * torch.tensor([[1 / 8 + 5, 2 / 8 + 5]]))
    identical = torch.randn(1, 4, 2).expand(3, 4, 2)
    torch.testing.assert_close(mix(identical), 3.0 * identical[0])  # weights sum to 1


def test_reverse_padded_reverses_each_row_within_its_length():
    x = torch.tensor([[1, 2, 3, 0], [4, 5, 0, 0]])
    assert reverse_padded(x, torch.tensor([3, 2])).tolist() == [[3, 2, 1, 0], [5, 4, 0, 0]]


@pytest.mark.parametrize("which", ["tagger", "char_lstm_tagger", "hmm_tagger", "elmo_tagger"])
def test_padding_never_changes_a_sentences_tags(which, request):
    t = request.getfixturevalue(which)
    short = ["wd", "wb", "we"]
    alone = scores(t, short)
    with torch.no_grad():
        batched = t.module_(t.batch([WORDS, short, WORDS[::-1] + WORDS]))[0][1, :3]
    torch.testing.assert_close(alone, batched, atol=1e-5, rtol=1e-5)
    chars = t.chars.encode(["wd", "wordy", "w"])  # a word's char vector ignores the other words' padding
    with torch.no_grad():
        torch.testing.assert_close(t.module_.chars(chars)[:1], t.module_.chars(t.chars.encode(["wd"])),
                                   atol=1e-6, rtol=1e-6)
    sents = [s for s in WORD_SENTS[:20]]
    one_by_one = [t.tag(s) for s in sents]
    assert t.tag_many(sents) == one_by_one  # tag_batch_size 3: batches of mixed lengths


@pytest.mark.parametrize("which", ["tagger", "char_lstm_tagger", "hmm_tagger", "elmo_tagger"])
def test_saved_and_reloaded_tagger_tags_identically(which, request, tmp_path):
    t = request.getfixturevalue(which)
    t.save(tmp_path / "m")
    back = BiLSTMTagger.load(tmp_path / "m")
    sents = WORD_SENTS[:30] + [["unseen", "Words", "wb"]]
    assert back.tag_many(sents) == t.tag_many(sents)
    assert back.tag_many(sents, head=1) == t.tag_many(sents, head=1)
    for k, v in module_tensors(t.module_).items():
        torch.testing.assert_close(module_tensors(back.module_)[k], v, rtol=0, atol=0)
    assert back.is_known("wb") and not back.is_known("unseen")
    if which == "elmo_tagger":
        w = back.elmo_weights()
        assert len(w["weights"]) == 3 and sum(w["weights"]) == pytest.approx(1.0)


def test_bilm_save_and_load_give_identical_layers(tmp_path):
    bilm = tiny_bilm(WORD_SENTS)
    bilm.save(tmp_path / "b")
    back = BiLM.load(tmp_path / "b")
    for x, y in zip(bilm.layers(WORD_SENTS[:5]), back.layers(WORD_SENTS[:5]), strict=True):
        np.testing.assert_array_equal(x, y)


def test_resumed_training_ends_where_an_uninterrupted_run_does(tmp_path):
    dev = lookahead_corpus(10, 5)

    def cfg(ckpt):
        return tiny(train=train_cfg(epochs=2, checkpoint_dir=ckpt, checkpoint_every=3))

    whole = BiLSTMTagger(cfg(None)).fit(TRAIN, dev=dev)

    def kill(step, loss):
        if step == 10:  # 8 batches an epoch: mid-epoch 2, one step after the checkpoint at 9
            raise StopTraining

    with pytest.raises(StopTraining):
        BiLSTMTagger(cfg(str(tmp_path))).fit(TRAIN, dev=dev, on_step=kill)
    # The best epoch so far, read from the checkpoint of the stopped run: epoch 1, as its dev score says.
    early = BiLSTMTagger.from_checkpoint(cfg(str(tmp_path)), TRAIN)
    def scores_of(history):
        return [(r["epoch"], r["train_loss"], r["valid_loss"]) for r in history]  # not the timings

    assert scores_of(early.history_) == scores_of(whole.history_[:1])
    gold = [t for s in dev for _, t, _ in s]
    pred = [t for s in early.tag_many([[w for w, _, _ in s] for s in dev]) for t in s]
    assert np.mean(np.array(pred) == np.array(gold)) == pytest.approx(early.dev_accuracy_)
    resumed = BiLSTMTagger(cfg(str(tmp_path))).fit(TRAIN, dev=dev)
    for k, v in module_tensors(whole.module_).items():
        torch.testing.assert_close(module_tensors(resumed.module_)[k], v, rtol=0, atol=0)
    assert scores_of(resumed.history_) == scores_of(whole.history_)


def test_length_batches_visit_every_sentence_once_in_a_seeded_order():
    lengths = np.arange(100) % 7 + 1
    b = length_batches(lengths, 8, seed=0, epoch=3)
    assert sorted(np.concatenate(b).tolist()) == list(range(100))
    assert all(len(x) <= 8 for x in b)
    assert [x.tolist() for x in b] == [x.tolist() for x in length_batches(lengths, 8, 0, 3)]
    assert [x.tolist() for x in b] != [x.tolist() for x in length_batches(lengths, 8, 0, 4)]


def test_pretrained_vectors_initialise_and_freeze_the_word_embeddings():
    from lexiflow.models.vectors import keyed_vectors

    vecs = np.arange(3 * 5, dtype=np.float32).reshape(3, 5)
    kv = keyed_vectors(["wb", "wc", "faraway"], vecs)
    t = BiLSTMTagger(tiny(freeze_embeddings=True, train=train_cfg(max_steps=2))).fit(TRAIN[:10], vectors=kv)
    emb = t.module_.embedding.weight
    assert emb.shape[1] == 5 and not emb.requires_grad
    for w, v in zip(["wb", "wc", "faraway"], vecs, strict=True):  # 'faraway' is not in train: still looked up
        np.testing.assert_array_equal(emb[t._index[w]].detach().numpy(), v)


def test_bad_input_and_settings_fail_before_training():
    with pytest.raises(ParameterError, match="elmo=True needs a trained biLM"):
        BiLSTMTagger(tiny(elmo=True)).fit(TRAIN)
    with pytest.raises(InputError, match=r"sentences\[0\]\[1\]"):
        BiLSTMTagger(tiny()).fit([[("a", "X"), ("b",)]])
    with pytest.raises(ParameterError, match="TaggerConfig.dropout"):
        TaggerConfig(dropout=1.5).validate()
    with pytest.raises(ParameterError, match="not trained"):
        BiLSTMTagger(tiny()).tag(["a"])
    with pytest.raises(InputError, match="bilm.json"):
        BiLM.load("/nonexistent-folder")


def test_precomputed_elmo_layers_give_the_live_biLMs_scores(elmo_tagger):
    t = elmo_tagger
    sents = [WORD_SENTS[0], WORD_SENTS[1][:3]]
    pre = [a.astype(np.float32) for a in t.bilm.layers(sents)]  # what fit caches for the training sentences
    with torch.no_grad():
        live = t.module_(t.batch(sents))[0]
        cached = t.module_(t.batch(sents, elmo=pre))[0]
    torch.testing.assert_close(live, cached)


def test_hmm_features_on_the_training_set_come_from_the_other_folds():
    """Every word occurs once, its tag drawn at random: the HMM trained on all sentences knows each
    word's tag (it tags its own training set perfectly), the HMMs of the other folds never saw the word
    and can only guess. The features the BiLSTM trains on must be those guesses (jackknifed)."""
    rng = np.random.default_rng(0)
    train = [[(f"u{i}x{j}", str(rng.choice(["A", "B"]))) for j in range(5)] for i in range(60)]
    tagger = BiLSTMTagger(tiny(hmm_features=True, hmm_folds=3, aux_weight=0.0))
    tagger._prepare(train, None, None)
    jackknifed = tagger._jackknifed_hmm_tags(train)
    gold = [[tagger.tags[0].index(t) for _, t in s] for s in train]
    full = tagger._hmm_tag_ids(tagger.hmm_, [[w for w, _ in s] for s in train])
    assert all(f.tolist() == g for f, g in zip(full, gold, strict=True))
    agree = np.mean([a == b for j, g in zip(jackknifed, gold, strict=True) for a, b in zip(j.tolist(), g, strict=True)])
    assert 0.3 < agree < 0.7  # guesses on unseen words, not the memorised tags
    batch = tagger.batch([["u0x0", "u0x1"]])
    assert batch["hmm"].tolist() == [full[0][:2].tolist()]  # tagging time: the full HMM's tags
