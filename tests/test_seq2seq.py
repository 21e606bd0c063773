"""Seq2seq models, decoding and the Translator: masks, exhaustive search, resume, save/load, bad input."""

import itertools
import math

import numpy as np
import pytest
import torch
from lexiflow.models.errors import InputError, ParameterError
from lexiflow.models.lm.train import StopTraining, TrainConfig
from lexiflow.models.seq2seq.decoding import beam_search, greedy
from lexiflow.models.seq2seq.rnn import RNNSeq2Seq, RNNSeq2SeqConfig
from lexiflow.models.seq2seq.transformer import TransformerSeq2Seq, TransformerSeq2SeqConfig
from lexiflow.models.seq2seq.translator import TokenizerConfig, Translator

BOS, EOS, PAD = 1, 2, 3
MODELS = {
    "gru-none": lambda: RNNSeq2Seq(RNNSeq2SeqConfig(11, 9, emb_dim=6, hidden_dim=8, attention="none")),
    "gru-dot-bi-2layer": lambda: RNNSeq2Seq(RNNSeq2SeqConfig(11, 9, emb_dim=6, hidden_dim=8, attention="dot",
                                                             bidirectional=True, num_layers=2)),
    "lstm-general": lambda: RNNSeq2Seq(RNNSeq2SeqConfig(11, 9, cell="lstm", emb_dim=6, hidden_dim=8,
                                                        attention="general")),
    "lstm-additive-bi": lambda: RNNSeq2Seq(RNNSeq2SeqConfig(11, 9, cell="lstm", emb_dim=6, hidden_dim=8,
                                                            attention="additive", bidirectional=True)),
    "transformer-post": lambda: TransformerSeq2Seq(TransformerSeq2SeqConfig(11, 9, d_model=8, n_heads=2, d_ff=16,
                                                                            encoder_layers=2, decoder_layers=2)),
    "transformer-pre-gelu-learned": lambda: TransformerSeq2Seq(TransformerSeq2SeqConfig(
        11, 9, d_model=8, n_heads=2, d_ff=16, encoder_layers=1, decoder_layers=1, norm="pre", activation="gelu",
        positional="learned", max_len=32)),
}


def _model(name: str):
    torch.manual_seed(0)
    m = MODELS[name]()
    with torch.no_grad():  # sharpen the random model's distributions so decoding choices are not near-ties
        m.out.weight.mul_(8.0)
    return m.eval()


def _batch(seqs):
    t = max(map(len, seqs))
    src = torch.tensor([s + [PAD] * (t - len(s)) for s in seqs])
    return src, src != PAD


SOURCES = [[4, 5, 6, 7, 8], [9, 4], [10, 10, 5, 6]]


@pytest.mark.parametrize("name", list(MODELS))
def test_padded_batch_equals_each_sentence_alone(name):
    m = _model(name)
    src, mask = _batch(SOURCES)
    tgt_in = torch.tensor([[BOS, 4, 5, 6], [BOS, 7, PAD, PAD], [BOS, 8, 4, PAD]])
    logits = m(src, mask, tgt_in)
    kw = dict(max_len_a=1.0, max_len_b=2, pad_id=PAD)
    g = greedy(m, src, mask, BOS, EOS, return_attention=True, **kw)
    b = beam_search(m, src, mask, BOS, EOS, beam_width=3, n_best=2, return_attention=True, **kw)
    for i, s in enumerate(SOURCES):
        one, one_mask = _batch([s])
        n = int((tgt_in[i] != PAD).sum())
        torch.testing.assert_close(logits[i, :n], m(one, one_mask, tgt_in[i:i + 1, :n])[0], atol=1e-5, rtol=1e-4)
        g1 = greedy(m, one, one_mask, BOS, EOS, return_attention=True, **kw)[0]
        assert g[i].tokens == g1.tokens and g[i].log_prob == pytest.approx(g1.log_prob, abs=1e-4)
        b1 = beam_search(m, one, one_mask, BOS, EOS, beam_width=3, n_best=2, return_attention=True, **kw)[0]
        assert [h.tokens for h in b[i]] == [h.tokens for h in b1]
        if g1.attention is not None:  # attention rows: over the real source tokens only, summing to 1
            torch.testing.assert_close(g[i].attention[:, : len(s)], g1.attention, atol=1e-5, rtol=1e-4)
            assert torch.all(g[i].attention[:, len(s):] == 0)
            torch.testing.assert_close(b[i][0].attention.sum(-1), torch.ones(len(b[i][0].tokens)))


@torch.no_grad()
def _exhaustive(m, src, max_len, alpha):
    """Every hypothesis (tokens other than <s>, </s>, <pad>, then </s>, at most max_len in all), scored from
    teacher-forced log-probabilities."""
    V = m.config.tgt_vocab_size
    words = [t for t in range(V) if t not in (BOS, EOS, PAD)]
    mask = torch.ones_like(src, dtype=torch.bool)
    out = []
    for n in range(max_len):
        for body in itertools.product(words, repeat=n):
            y = list(body) + [EOS]
            logp = torch.log_softmax(m(src, mask, torch.tensor([[BOS] + y[:-1]])).float(), -1)[0]
            lp = float(sum(logp[t, tok] for t, tok in enumerate(y)))
            out.append((lp / len(y) ** alpha, y))
    return sorted(out, key=lambda x: -x[0])


@pytest.mark.parametrize("name", ["gru-none", "lstm-additive-bi", "transformer-post"])
@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_beam_as_wide_as_the_search_space_equals_exhaustive_search(name, alpha):
    m = _model(name)
    with torch.no_grad():
        m.out.weight.div_(4.0)  # flatter: the best sequence is not simply the greedy one
    src = torch.tensor([[4, 5, 6]])
    exact = _exhaustive(m, src, max_len=4, alpha=alpha)  # 6 words: 1 + 6 + 36 + 216 = 259 hypotheses
    # the widest step holds 216 live prefixes; candidates per step at most 36 x 7 = 252 before the last step
    hyps = beam_search(m, src, torch.ones_like(src, dtype=torch.bool), BOS, EOS, pad_id=PAD, beam_width=260,
                       alpha=alpha, n_best=5, max_len_a=0.0, max_len_b=4)[0]
    assert [h.tokens for h in hyps] == [y for _, y in exact[:5]]
    assert [h.score for h in hyps] == pytest.approx([s for s, _ in exact[:5]], abs=1e-4)
    # and greedy is beam search of width 1
    g = greedy(m, src, torch.ones_like(src, dtype=torch.bool), BOS, EOS, pad_id=PAD, max_len_a=0.0, max_len_b=4)[0]
    b1 = beam_search(m, src, torch.ones_like(src, dtype=torch.bool), BOS, EOS, pad_id=PAD, beam_width=1, alpha=0.0,
                     max_len_a=0.0, max_len_b=4)[0][0]
    assert g.tokens == b1.tokens


def test_length_normalisation_alpha_one_is_the_average_log_probability():
    m = _model("gru-none")
    src = torch.tensor([[4, 5, 6]])
    h = beam_search(m, src, torch.ones_like(src, dtype=torch.bool), BOS, EOS, pad_id=PAD, beam_width=4, alpha=1.0,
                    n_best=3, max_len_a=0.0, max_len_b=5)[0]
    for x in h:
        assert x.score == pytest.approx(x.log_prob / len(x.tokens))
        assert x.tokens[-1] == EOS and len(x.tokens) <= 5
    assert h[0].score >= h[1].score >= h[2].score
    with pytest.raises(ParameterError, match="n_best=5"):
        beam_search(m, src, torch.ones_like(src, dtype=torch.bool), BOS, EOS, beam_width=4, n_best=5)


# ---- the Translator on real pairs ----------------------------------------------------------------


@pytest.fixture(scope="module")
def pairs(shared_data):
    lines = (shared_data / "tatoeba-eng-fra" / "train.tsv").read_text(encoding="utf-8").splitlines()[:300]
    src, tgt = zip(*(line.split("\t") for line in lines), strict=True)
    return list(src), list(tgt)


def _translator(tmp_path=None, **train):
    cfg = TrainConfig(epochs=2, batch_size=32, lr=3e-3, clip_grad_norm=1.0, device="cpu", **train)
    return Translator("rnn", RNNSeq2SeqConfig(0, 0, emb_dim=16, hidden_dim=16, attention="additive", dropout=0.1),
                      TokenizerConfig("word", 500), cfg)


def test_resume_after_a_kill_gives_the_uninterrupted_model(pairs, tmp_path):
    src, tgt = pairs
    straight = _translator().fit(src, tgt)

    def kill_at_step_7(step, loss):
        if step == 7:
            raise StopTraining

    ckpt = str(tmp_path / "ckpt")
    with pytest.raises(StopTraining):
        _translator(checkpoint_dir=ckpt, checkpoint_every=5).fit(src, tgt, on_step=kill_at_step_7)
    resumed = _translator(checkpoint_dir=ckpt, checkpoint_every=5).fit(src, tgt)
    for (name, a), (_, b) in zip(straight.module_.state_dict().items(), resumed.module_.state_dict().items(),
                                 strict=True):
        assert torch.equal(a, b), name
    assert [r["train_loss"] for r in straight.history_] == [r["train_loss"] for r in resumed.history_]


def test_save_load_translate_and_attention(pairs, tmp_path):
    src, tgt = pairs
    tr = _translator().fit(src, tgt, valid=(src[:40], tgt[:40]))
    assert tr.history_[-1]["valid_loss"] < tr.history_[0]["train_loss"]
    tr.save(tmp_path / "m")
    back = Translator.load(tmp_path / "m", device="cpu")
    assert back.translate(src[:20], beam_width=3) == tr.translate(src[:20], beam_width=3)
    assert src[0] == "Run!"
    out = tr.translate(["Run!", ""], return_attention=True)
    assert out[0].source_tokens == ["Run", "!"]
    assert out[0].attention.shape == (len(out[0].target_tokens) + 1, 2)
    np.testing.assert_allclose(out[0].attention.sum(1), 1.0, rtol=1e-5)
    nbest = tr.translate(["Run!"], beam_width=4, n_best=3)[0]
    assert len(nbest) == 3 and nbest[0].score >= nbest[1].score >= nbest[2].score
    assert all(math.isfinite(h.score) for h in nbest)


def test_translator_bad_input():
    with pytest.raises(InputError, match="2 source and 1 target"):
        _translator().fit(["a", "b"], ["x"])
    with pytest.raises(ParameterError, match="seq2seq model='lstm'"):
        Translator("lstm")
    with pytest.raises(ParameterError, match="not trained"):
        Translator().translate(["a"])
    with pytest.raises(ParameterError, match="attention='cosine'"):
        RNNSeq2Seq(RNNSeq2SeqConfig(10, 10, attention="cosine"))


@pytest.mark.parametrize("kind, tokens", [
    ("transformer", TokenizerConfig("bpe", 300, joint_vocabulary=True, min_count=2)),
    ("rnn", TokenizerConfig("wordpiece", 300, joint_vocabulary=False, min_count=2)),
])
def test_subword_tokenizers_joint_or_separate_round_trip(pairs, tmp_path, kind, tokens):
    src, tgt = pairs
    config = (TransformerSeq2SeqConfig(0, 0, d_model=16, n_heads=2, d_ff=32, encoder_layers=1, decoder_layers=1)
              if kind == "transformer" else RNNSeq2SeqConfig(0, 0, emb_dim=16, hidden_dim=16))
    tr = Translator(kind, config, tokens, TrainConfig(epochs=1, batch_size=32, device="cpu")).fit(src, tgt)
    assert (tr.src_codec_ is tr.tgt_codec_) == tokens.joint_vocabulary
    assert tr.config.src_vocab_size == len(tr.src_codec_) <= 300
    tr.save(tmp_path / "m")
    back = Translator.load(tmp_path / "m", device="cpu")
    assert back.translate(src[:10], beam_width=2) == tr.translate(src[:10], beam_width=2)
    assert back.src_codec_.encode(["Run!"])[0].tolist() == tr.src_codec_.encode(["Run!"])[0].tolist()
