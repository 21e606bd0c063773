"""The training loop at the hardware's speed and through bad steps (models/lm/train.py), on the CPU: no read of
the device per step, a non-finite step skipped on the device, bf16 autocast training, the log naming its metric,
the Transformer LM on the shared attention. tests/test_cuda.py checks the same on a GPU."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch
from lexiflow.models import attention
from lexiflow.models.attention import MultiHeadAttention
from lexiflow.models.encoder import MaskedLM
from lexiflow.models.errors import ParameterError
from lexiflow.models.lm.rnn import RNN
from lexiflow.models.lm.stream import to_stream
from lexiflow.models.lm.train import LMStreamTask, TrainConfig, Trainer, TrainTask, epoch_summary
from lexiflow.models.lm.transformer import Transformer, TransformerLM
from lexiflow.models.neural_tagger import BiLSTMTagger

from tests.test_encoder import corpus
from tests.test_encoder import tiny as tiny_encoder
from tests.test_lm_neural import BOS, EOS, PAD, TRAIN, VALID, V, quick, small_rnn, small_transformer
from tests.test_neural_tagger import TRAIN as TAGGED
from tests.test_neural_tagger import tiny

torch.set_num_threads(1)

# What reads a tensor's values back to the host: on CUDA each waits for every queued kernel.
READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")


def count_reads(monkeypatch) -> list[str]:
    calls: list[str] = []
    for name in READS:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _name=name, _original=original, **kwargs):
            calls.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return calls


def lm_trainer(**kw) -> tuple[Trainer, list]:
    cfg = quick(**{"bptt": 12, "log_every_s": 1e9, **kw})
    torch.manual_seed(0)
    task = LMStreamTask(to_stream(TRAIN, BOS, EOS, V), None, cfg, bos_id=BOS, pad_id=PAD, window=12)
    return Trainer(Transformer(small_transformer()), task, cfg), task.epoch_batches(0)


def test_a_training_step_reads_nothing_back_from_the_device(monkeypatch):
    trainer, batches = lm_trainer(max_nonfinite_steps=5, clip_grad_norm=1.0)
    trainer.step(batches[0])  # step 1
    reads = count_reads(monkeypatch)
    for batch in batches[1:4]:  # steps 2-4: loss, count and skip decision stay on the device
        trainer.step(batch)
    assert reads == []
    trainer.step(batches[4])  # step 5: every max_nonfinite_steps steps, one read of the sums (and the log)
    assert reads == ["tolist"]
    monkeypatch.undo()
    trainer.end_epoch()
    row = trainer.history[-1]
    assert row["step"] == 5 and row["skipped_steps"] == 0 and math.isfinite(row["train_loss"])


def test_the_loss_read_back_at_the_epoch_end_is_the_mean_of_the_steps_losses():
    seen: list[float] = []
    lm = TransformerLM(small_transformer(), quick(max_steps=6)).fit(TRAIN, on_step=lambda step, loss: seen.append(loss))
    assert len(seen) == 6
    # each step's mean weighs by its predicted tokens; batches of one stream have nearly equal counts
    assert lm.metrics_["train_loss"][0] == pytest.approx(np.mean(seen), rel=1e-2)


class PlantedTask(TrainTask):
    """A stream LM task whose loss (or, with `grad`, only its gradient) is NaN at the steps in `bad`."""

    def __init__(self, inner: LMStreamTask, bad: set[int], grad: bool = False) -> None:
        self.inner, self.bad, self.grad, self.calls = inner, bad, grad, 0
        self.tokens_per_step = inner.tokens_per_step

    def epoch_batches(self, epoch):
        return self.inner.epoch_batches(epoch)

    def loss(self, fwd, batch, state, device):
        self.calls += 1
        nll, n, n_input, state = self.inner.loss(fwd, batch, state, device)
        if self.calls in self.bad:
            nll = _nan_grad(nll) if self.grad else nll * math.nan
        return nll, n, n_input, state


def _nan_grad(x: torch.Tensor) -> torch.Tensor:
    """x, whose gradient is NaN: a finite loss with a non-finite gradient."""
    y = x.clone()
    y.register_hook(lambda g: torch.full_like(g, math.nan))
    return y


def snapshot(trainer: Trainer) -> dict[str, torch.Tensor]:
    state = {f"w.{k}": v.detach().clone() for k, v in trainer.module.state_dict().items()}
    for i, st in enumerate(trainer.opt.state.values()):
        state |= {f"opt.{i}.{k}": v.detach().clone() for k, v in st.items() if torch.is_tensor(v)}
    return state


@pytest.mark.parametrize("optimizer", [dict(), dict(optimizer="sgd", momentum=0.9),
                                       dict(optimizer="sgd", lr=0.5, clip_grad_norm=None)])
@pytest.mark.parametrize("grad", [False, True])
def test_a_non_finite_step_changes_nothing_and_is_counted(caplog, optimizer, grad):
    trainer, batches = lm_trainer(**optimizer)
    if "clip_grad_norm" in optimizer:  # plain SGD: the RNN LM's embedding takes sparse gradients, not the fused kernel
        torch.manual_seed(0)
        trainer = Trainer(RNN(small_rnn()), trainer.task, trainer.cfg)
        assert trainer.sparse
    trainer.task = PlantedTask(trainer.task, bad={3}, grad=grad)
    for batch in batches[:2]:
        trainer.step(batch)
    before = snapshot(trainer)
    with caplog.at_level(logging.WARNING, logger="lexiflow.lm.train"):
        trainer.step(batches[2])  # NaN: skipped on the device
        after = snapshot(trainer)
        trainer.step(batches[3])
        row = trainer.end_epoch()
    assert before.keys() == after.keys()
    for key in before:
        torch.testing.assert_close(after[key], before[key], rtol=0, atol=0, msg=key)
    assert any(not torch.equal(snapshot(trainer)[k], before[k]) for k in before if k.startswith("w."))  # step 4 trained
    assert row["skipped_steps"] == 1 and row["step"] == 4 and math.isfinite(row["train_loss"])
    assert "1 optimizer step(s) up to step 4 skipped" in caplog.text


def test_only_max_nonfinite_steps_in_a_row_stop_the_run_with_one_line():
    trainer, batches = lm_trainer(max_nonfinite_steps=3, epochs=3)
    trainer.task = PlantedTask(trainer.task, bad={2, 3, 5, 6, 8, 9, 10})  # runs of 2, 2, then 3
    with pytest.raises(ParameterError) as err:
        trainer.run()
    message = str(err.value)
    assert "\n" not in message and "3 steps in a row" in message and "max_nonfinite_steps=3" in message
    assert trainer.pos.step in (10, 11, 12)  # read back every 3 steps: at most 2 steps after the run reached 3


def test_bf16_autocast_trains_the_masked_lm_on_the_cpu():
    """test_encoder's MLM bar, in bf16 autocast: the encoder's padded batches (masked attention) on the GPU's path.
    (Its rate, as test_encoder's: a tiny model from BERT's small init takes a larger step than the recipe's.)"""
    cfg = TrainConfig(epochs=30, batch_size=32, lr=1e-2, warmup_steps=10, checkpoint_every=0, log_every_s=1e9,
                      clip_grad_norm=1.0, device="cpu", precision="bf16")
    mlm = MaskedLM(tiny_encoder(mask_probability=0.15), cfg).fit(corpus(256, 0), corpus(64, 1), pppl_sentences=16)
    # bf16 rounds differently on CPUs with native bf16 (AVX512-BF16: accuracy 0.36, [MASK] perplexity 6.3; fp32 0.62
    # and 4.1) and without (above 0.4): the bar is learning, well clear of chance, on any x86-64 CPU
    m = mlm.metrics
    assert m["mask_accuracy"] > 0.25  # chance: 1/25
    assert m["mask_perplexity"] < m["unigram_perplexity"] / 3  # test_encoder's bar: the counting language's unigram ~25
    assert sum(h["skipped_steps"] for h in mlm.history) == 0


def test_masked_attention_never_runs_cudnns_kernel(monkeypatch):
    """The cause of the bf16 MLM divergence: cuDNN's fused attention (torch's default on H100/H200 since 2.11, bf16
    only) returns NaN query gradients under some masks. Masked attention runs every other fused kernel; unmasked
    causal attention (the LM) keeps the default choice, flash."""
    seen: list[bool] = []
    sdpa = attention.F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append(torch.backends.cuda.cudnn_sdp_enabled())
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", spy)
    mha = MultiHeadAttention(16, 2).eval()
    x = torch.randn(2, 5, 16)
    pad = torch.tensor([[True] * 5, [True, True, True, False, False]])
    masked = mha(x, mask=pad)[0]
    causal = mha(x, causal=True)[0]
    assert seen == [False, True] and torch.backends.cuda.cudnn_sdp_enabled()
    # the is_causal kernel is the masked one's function
    mask = torch.ones(5, 5, dtype=torch.bool).tril()[None, None]  # (1, 1, T_q, T_k)
    torch.testing.assert_close(causal, mha(x, mask=mask)[0])
    torch.testing.assert_close(masked[1, :3], mha(x[1:, :3])[0][0], atol=1e-6, rtol=1e-5)


def test_the_transformer_lm_attends_through_the_shared_attention_and_loads_older_weights():
    torch.manual_seed(0)
    model = Transformer(small_transformer(n_layers=2)).eval()
    assert all(isinstance(block.attn, MultiHeadAttention) for block in model.blocks)
    x = torch.randint(4, V, (2, 9))
    expected = model(x)[0]
    # weights written before: one fused qkv projection and `proj` per block
    old = {}
    for k, v in model.state_dict().items():
        if ".attn.k_proj." in k or ".attn.v_proj." in k:
            continue
        if ".attn.q_proj." in k:
            parts = [model.state_dict()[k.replace("q_proj", name)] for name in ("q_proj", "k_proj", "v_proj")]
            old[k.replace("q_proj", "qkv")] = torch.cat(parts)
        else:
            old[k.replace(".attn.out_proj.", ".attn.proj.")] = v
    torch.manual_seed(1)
    back = Transformer(small_transformer(n_layers=2)).eval()
    back.load_state_dict(old)
    torch.testing.assert_close(back(x)[0], expected)


def test_the_epoch_log_names_its_metric(caplog):
    row = {"train_loss": 1.0, "train_ppl": math.e, "valid_loss": 0.25, "valid_ppl": math.exp(0.25)}
    assert epoch_summary(row, "ppl") == "train ppl 2.72, valid ppl 1.28"
    assert epoch_summary(row, "error") == "train loss 1.0000, valid error 0.2500"
    assert epoch_summary(row, "loss") == "train loss 1.0000, valid loss 0.2500"
    assert epoch_summary({**row, "valid_loss": None}, "loss") == "train loss 1.0000"
    with caplog.at_level(logging.INFO, logger="lexiflow.lm.train"):
        TransformerLM(small_transformer(), quick(max_steps=3)).fit(TRAIN, VALID)
        BiLSTMTagger(tiny()).fit(TAGGED[:20], dev=TAGGED[20:30])
    epochs = [r.getMessage() for r in caplog.records if r.getMessage().startswith("epoch ")]
    assert "valid ppl" in epochs[0] and "valid error" in epochs[-1] and "ppl" not in epochs[-1]
