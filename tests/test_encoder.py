"""The BERT-style encoder and its MLM pretraining (models/encoder.py) on tiny models."""

import math

import numpy as np
import pytest
import torch
from lexiflow.models.encoder import (
    CLS_ID,
    PAD_ID,
    SEP_ID,
    EncoderConfig,
    EncoderModel,
    MaskedLM,
    MLMTask,
    log_prior,
    masked_lm_scores,
    position_kinds,
    with_specials,
)
from lexiflow.models.errors import InputError
from lexiflow.models.lm.train import StopTraining, TrainConfig


def tiny(**kw):
    return EncoderConfig(vocab_size=30, d_model=16, n_layers=2, n_heads=2, d_ff=32, max_len=16, dropout=0.0, **kw)


def test_padding_never_changes_a_sentences_outputs():
    torch.manual_seed(0)
    model = EncoderModel(tiny()).eval()
    a = torch.tensor([[CLS_ID, 7, 8, 9, SEP_ID]])
    batch = torch.tensor([[CLS_ID, 7, 8, 9, SEP_ID, PAD_ID, PAD_ID], [CLS_ID, 5, 6, 7, 8, 9, SEP_ID]])
    with torch.no_grad():
        alone, padded = model(a), model(batch)
    torch.testing.assert_close(padded[0, :5], alone[0], atol=1e-6, rtol=1e-5)


def test_without_nsp_the_input_is_token_plus_position_only():
    # no segment vector without sentence pairs: the encoder's input is E[token] + P[position], nothing more
    torch.manual_seed(0)
    model = EncoderModel(tiny()).eval()
    ids = torch.tensor([[CLS_ID, 7, 8, 9, SEP_ID]])
    with torch.no_grad():
        expected = model.encoder(model.embed.token(ids) + model.embed.pos.weight[:5], ids != PAD_ID)
        torch.testing.assert_close(model(ids), expected, rtol=0, atol=0)
        torch.testing.assert_close(model(ids, torch.zeros_like(ids)), expected, rtol=0, atol=0)
    assert not any("segment" in name for name, _ in model.named_parameters())
    with_nsp = EncoderModel(tiny(nsp=True)).eval()  # with NSP, segment A's vector is added
    with torch.no_grad():
        x = with_nsp.embed.token(ids) + with_nsp.embed.pos.weight[:5] + with_nsp.segment.weight[0]
        torch.testing.assert_close(with_nsp(ids), with_nsp.encoder(x, ids != PAD_ID), rtol=0, atol=0)


def test_with_specials_builds_cls_sep_and_segments():
    ids, seg = with_specials(np.array([7, 8]), 16, np.array([9]))
    assert ids == [CLS_ID, 7, 8, SEP_ID, 9, SEP_ID] and seg == [0, 0, 0, 0, 1, 1]
    ids, seg = with_specials(np.arange(5, 25), 8)  # cut to fit max_len
    assert len(ids) == 8 and ids[0] == CLS_ID and ids[-1] == SEP_ID and seg == [0] * 8


def corpus(n, seed):
    """Sentences of a 'language' that counts up (mod 25) from a random start: a masked token is predictable from
    either neighbour, so the encoder can recover it and a unigram guess cannot."""
    rng = np.random.default_rng(seed)
    return [(rng.integers(25) + np.arange(8)) % 25 + 5 for _ in range(n)]


def test_mlm_learns_to_recover_masked_tokens_and_saves(tmp_path):
    # a tiny model from BERT's small init takes a larger step than the recipe's (3e-3: accuracy .13 here)
    cfg = TrainConfig(epochs=30, batch_size=32, lr=1e-2, warmup_steps=10, checkpoint_every=0, log_every_s=1e9,
                      clip_grad_norm=1.0)
    mlm = MaskedLM(tiny(mask_probability=0.15), cfg).fit(corpus(256, 0), corpus(64, 1), pppl_sentences=16)
    m = mlm.metrics
    assert m["mask_accuracy"] > 0.4  # chance: 1/25
    assert m["mask_perplexity"] < m["unigram_perplexity"] / 3  # the counting language is uniform: unigram ~25
    assert m["pseudo_perplexity"] < 12 < 20 < m["unigram_pseudo_perplexity"]
    mlm.save(tmp_path)
    again = MaskedLM.load(tmp_path)
    ids = torch.tensor([[CLS_ID, 5, 6, 7, 8, 9, 10, 11, 12, SEP_ID]])
    with torch.no_grad():
        torch.testing.assert_close(again.model(ids), mlm.model(ids))
    assert again.metrics["mask_accuracy"] == mlm.metrics["mask_accuracy"]


class Copier(torch.nn.Module):
    """An 'encoder' whose MLM predicts the input token at each position with certainty (logit 30 against 0)."""

    def __init__(self, vocab_size):
        super().__init__()
        self.vocab_size = vocab_size

    def forward(self, ids, segments=None):
        return 30.0 * torch.nn.functional.one_hot(ids, self.vocab_size).float()

    def mlm_logits(self, hidden):
        return hidden


def test_a_model_that_copies_its_input_scores_only_where_the_input_is_unchanged():
    valid = corpus(200, 2)
    task = MLMTask(valid, valid, tiny(), TrainConfig(eval_batch_size=10))
    prior = log_prior(valid, 30)
    m = masked_lm_scores(Copier(30), task, torch.device("cpu"), prior)
    n = m["mask_tokens"] + m["random_tokens"] + m["unchanged_tokens"]
    # 1,600 ordinary tokens, 15 % chosen, 80 / 10 / 10 (4 binomial standard deviations)
    assert abs(n - 240) < 60 and abs(m["mask_tokens"] / n - 0.8) < 0.12 and m["unchanged_tokens"] > 5
    assert m["unchanged_accuracy"] == 1.0 and m["unchanged_perplexity"] < 1.001  # the answer is in the input
    assert m["mask_accuracy"] == 0.0 and m["random_accuracy"] == 0.0  # it predicts [MASK] or the wrong token
    # the true token gets logit 0 against one logit 30: loss = log(29 + e^30) ~ 30 nats, whatever the token
    assert m["mask_perplexity"] == pytest.approx(math.exp(math.log(29 + math.exp(30))), rel=1e-3)
    # the unigram baseline by hand: the tokens 5..29 are near-uniform here, so about 25 (add-one smoothing: > 25)
    labels = torch.cat([lab[kinds["mask"]] for inputs, _, lab, _ in task.valid_batches()
                        for kinds in [position_kinds(inputs, lab)]])
    assert m["unigram_perplexity"] == pytest.approx(math.exp(-float(prior[labels].double().mean())))
    assert 22 < m["unigram_perplexity"] < 30


def test_resumed_pretraining_equals_uninterrupted(tmp_path):
    def run(ckpt, stop_at=None):
        def on_step(step, loss):
            if step == stop_at:
                raise StopTraining
        cfg = TrainConfig(epochs=2, batch_size=16, checkpoint_every=3, checkpoint_dir=str(ckpt), log_every_s=1e9)
        return MaskedLM(tiny(nsp=True), cfg).fit(corpus(64, 0), corpus(16, 1), pppl_sentences=2, on_step=on_step)

    whole = run(tmp_path / "a")
    with pytest.raises(StopTraining):
        run(tmp_path / "b", stop_at=5)
    resumed = run(tmp_path / "b")
    for (k, v), w in zip(whole.model.state_dict().items(), resumed.model.state_dict().values(), strict=True):
        torch.testing.assert_close(v, w, msg=k)
    assert whole.metrics["mask_accuracy"] == resumed.metrics["mask_accuracy"]


def test_ids_outside_the_vocabulary_fail_before_training():
    with pytest.raises(InputError, match="outside"):
        MaskedLM(tiny()).fit([np.array([5, 99])])


def test_encoder_artifact_loads_through_the_loaders(tmp_path):
    from lexiflow.loaders import load
    from lexiflow.storage.store import ArtifactStore

    mlm = MaskedLM(tiny(), TrainConfig(epochs=1, batch_size=16, checkpoint_every=0, log_every_s=1e9))
    mlm.fit(corpus(32, 0), corpus(8, 1), pppl_sentences=2)
    store = ArtifactStore(str(tmp_path))
    with store.writer("encoder", "0123456789abcdef") as out:
        mlm.save(out.folder)
        out.metrics.update(mlm.metrics)
    loaded = load(store, "encoder")
    ids = torch.tensor([[CLS_ID, 5, 6, 7, SEP_ID]])
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(ids), mlm.model(ids))


def test_the_mlm_output_bias_starts_at_the_log_unigram_prior():
    # by hand: ids 5, 5, 6 in a 7-token vocabulary, add-one -> counts (1, 1, 1, 1, 1, 3, 2) / 10
    prior = log_prior([np.array([5, 5]), np.array([6])], 7)
    torch.testing.assert_close(prior, torch.log(torch.tensor([1, 1, 1, 1, 1, 3, 2]) / 10.0))
    seen = {}
    cfg = TrainConfig(epochs=1, max_steps=1, batch_size=8, lr=1e-3, checkpoint_every=0, log_every_s=1e9)
    mlm = MaskedLM(tiny(), cfg)
    train = [np.array([5, 5, 5, 5, 5, 5, 6, 7])] * 8  # id 5: 49 of the 94 smoothed counts
    mlm.fit(train, on_step=lambda step, loss: seen.setdefault("loss", loss))
    # the first step's loss (before any update) is the masked tokens' unigram cross-entropy, ~-log(49/94)
    # for 5 and -log(9/94) for 6 and 7; a zero bias would give the uniform log 30 = 3.4
    assert seen["loss"] < 1.6
    assert torch.allclose(mlm.model.mlm_bias, log_prior(train, 30), atol=2e-3)  # one step of 1e-3 moved it


def test_bert_init_draws_weights_from_n_0_002_with_zero_biases_and_torch_init_keeps_layer_defaults():
    torch.manual_seed(0)
    bert = EncoderModel(EncoderConfig(vocab_size=2000, d_model=128, n_layers=2, n_heads=4, d_ff=512))
    torch.manual_seed(0)
    plain = EncoderModel(EncoderConfig(vocab_size=2000, d_model=128, n_layers=2, n_heads=4, d_ff=512, init="torch"))
    linears = [(name, m) for name, m in bert.named_modules() if isinstance(m, (torch.nn.Linear, torch.nn.Embedding))]
    assert len(linears) == 2 + 2 * 6 + 1  # token and position embeddings, 2 x (Q, K, V, O, FFN in, FFN out), MLM dense
    for name, m in linears:
        m.requires_grad_(False)
        assert abs(float(m.weight.std()) - 0.02) < 0.002, name  # thousands of draws: within 10 %
        assert abs(float(m.weight.mean())) < 0.002, name
        if isinstance(m, torch.nn.Linear):
            assert not m.bias.any(), name
    # torch's own: the FFN's first layer is uniform with bound 1/sqrt(d_in) = 0.088, s.d. 0.051; its bias is not zero
    ffn = dict(plain.named_modules())["encoder.layers.0.ffn.0"]
    assert abs(float(ffn.weight.detach().std()) - 128 ** -0.5 / 3 ** 0.5) < 0.003
    assert ffn.bias.abs().max() > 0
