"""Neural LMs (FFNN, Elman/LSTM/GRU, Transformer) and their training loop: known answers, oracles, resume."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
from lexiflow.models.device import resolve_device
from lexiflow.models.errors import InputError, ParameterError
from lexiflow.models.lm import neural, registry
from lexiflow.models.lm.checkpoints import Position
from lexiflow.models.lm.distributed import fit_distributed
from lexiflow.models.lm.ffnn import FFNN, FFNNLM, FFNNConfig
from lexiflow.models.lm.rnn import RNN, RNNLM, RNNConfig
from lexiflow.models.lm.train import (
    StopTraining,
    TrainConfig,
    batchify,
    clip_grad_norm,
    epoch_row,
    evaluate,
    lr_at,
    sparse_embedding_grads,
)
from lexiflow.models.lm.transformer import (
    Block,
    CausalSelfAttention,
    Transformer,
    TransformerConfig,
    TransformerLM,
    count_parameters,
    sinusoidal_positions,
)
from safetensors.torch import load_file
from torch import nn

torch.set_num_threads(1)

V = 40
BOS, EOS, PAD = 1, 2, 3


def successor_corpus(n: int, seed: int, step: int = 1) -> list[np.ndarray]:
    """A language where each word is the previous word + step (mod), random start and length 3..8."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        a, length = int(rng.integers(0, V - 4)), int(rng.integers(3, 9))
        out.append(np.array([4 + (a + step * i) % (V - 4) for i in range(length)]))
    return out


TRAIN = successor_corpus(300, seed=1)
VALID = successor_corpus(40, seed=2)


def small_rnn(cell: str = "lstm", **kw) -> RNNConfig:
    return RNNConfig(V, cell=cell, **{"emb_dim": 16, "hidden_dim": 16, "num_layers": 2, "dropout": 0.1,
                                      "tie_weights": False, **kw})


def small_transformer(**kw) -> TransformerConfig:
    return TransformerConfig(V, **{"max_len": 24, "d_model": 16, "n_layers": 1, "n_heads": 2, "dropout": 0.0, **kw})


def quick(**kw) -> TrainConfig:
    # On the CPU whatever the machine: the known answers here are fp32 CPU numbers (device "auto" on a GPU
    # machine trains on CUDA in bf16); tests/test_cuda.py holds the CUDA path to its own precision.
    return TrainConfig(**{"batch_size": 8, "bptt": 12, "lr": 1e-2, "epochs": 1, "warmup_steps": 0,
                          "checkpoint_every": 0, "device": "cpu", **kw})


# ---------------------------------------------------------------------------------------------
# known answers and oracles


def test_sinusoidal_positions_match_vaswani_formula():
    pe = sinusoidal_positions(5, 4)
    assert pe[0].tolist() == [0.0, 1.0, 0.0, 1.0]
    assert pe[3, 0].item() == pytest.approx(math.sin(3))
    assert pe[3, 1].item() == pytest.approx(math.cos(3))
    assert pe[3, 2].item() == pytest.approx(math.sin(3 / 100))  # 10000^(2/4) = 100
    assert pe[3, 3].item() == pytest.approx(math.cos(3 / 100))


@pytest.mark.parametrize("kw", [{}, {"tie_weights": False, "positional": "learned"}, {"norm": "post"}])
def test_transformer_parameter_count_closed_form(kw):
    c = small_transformer(n_layers=2, **kw)
    assert count_parameters(c) == sum(p.numel() for p in Transformer(c).parameters())


def test_post_ln_relu_block_is_the_notes_add_and_norm():
    """Notes 000/002 "Add & Norm": LayerNorm(x + Sublayer(x)) after attention and after the FFN,
    FFN(x) = ReLU(x W1 + b1) W2 + b2 with d_ff = 4d; the stack then has no final LayerNorm."""
    torch.manual_seed(0)
    c = small_transformer(norm="post", ffn_activation="relu")
    block = Block(c).eval()
    x = torch.randn(2, 5, c.d_model)
    ln = torch.nn.functional.layer_norm
    h = ln(x + block.attn(x), (c.d_model,), block.ln1.weight, block.ln1.bias)
    lin1, lin2 = block.ffn[0], block.ffn[2]
    assert lin1.out_features == 4 * c.d_model and isinstance(block.ffn[1], nn.ReLU)
    ffn = torch.relu(h @ lin1.weight.T + lin1.bias) @ lin2.weight.T + lin2.bias
    torch.testing.assert_close(block(x), ln(h + ffn, (c.d_model,), block.ln2.weight, block.ln2.bias))
    assert isinstance(Transformer(c).ln_f, nn.Identity)


def test_logit_lens_reads_every_layer_and_ends_with_the_output():
    """Notes 002 "Transformers as Updated Residual Streams": the unembedding applied after each layer."""
    torch.manual_seed(0)
    for norm in ("pre", "post"):
        m = Transformer(small_transformer(n_layers=3, norm=norm)).eval()
        x = torch.randint(4, V, (2, 9))
        lens = m.logit_lens(x)
        assert lens.shape == (4, 2, 9, V)
        torch.testing.assert_close(lens[-1], m(x)[0])
        # layer 0 is the embedding read out directly
        torch.testing.assert_close(lens[0], m.lm_head(m.ln_f(m._embed(x))))


def test_logit_lens_table_last_layer_is_the_models_perplexity():
    lm = TransformerLM(small_transformer(n_layers=2), quick(epochs=3)).fit(TRAIN)
    sentences = [s for s in TRAIN if len(s) + 1 <= lm._window][:40]
    table = lm.logit_lens_table(sentences)
    assert [row["layer"] for row in table] == [0, 1, 2]
    assert table[-1]["perplexity"] == pytest.approx(lm.perplexity(sentences), rel=1e-4)
    assert all(0 <= row["accuracy"] <= 1 for row in table)


def test_attention_matches_torch_multihead_attention_with_causal_mask():
    torch.manual_seed(0)
    c = small_transformer(dropout=0.0)
    ours = CausalSelfAttention(c).eval()
    peer = nn.MultiheadAttention(c.d_model, c.n_heads, batch_first=True).eval()
    with torch.no_grad():
        peer.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
        peer.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
        peer.out_proj.weight.copy_(ours.out_proj.weight)
        peer.out_proj.bias.copy_(ours.out_proj.bias)
    x = torch.randn(3, 7, c.d_model)
    mask = torch.triu(torch.ones(7, 7, dtype=torch.bool), diagonal=1)  # True = not allowed to attend
    expected, _ = peer(x, x, x, attn_mask=mask, need_weights=False)
    torch.testing.assert_close(ours(x), expected, atol=1e-5, rtol=1e-5)


def test_ffnn_is_bengio_formula_and_context_stops_at_sentence_start():
    torch.manual_seed(0)
    m = FFNN(FFNNConfig(V, context_size=3, emb_dim=4, hidden_dim=5)).eval()
    x = torch.tensor([[7, 2, 1, 9]])  # ... w </s> <s> w'
    logits, (tail,) = m(x, (torch.tensor([[5, 6]]),))
    assert tail.tolist() == [[1, 9]]
    C, H, U = m.embedding.weight, m.hidden, m.output
    # position 1 (after </s>): context (6, 7, 2); position 3 (after w'): (<s>, <s>, 9) since </s>, 7 precede <s>
    for t, ctx in ((1, [6, 7, 2]), (3, [1, 1, 9])):
        expected = U(torch.tanh(H(torch.cat([C[i] for i in ctx]))))
        torch.testing.assert_close(logits[0, t], expected)


def test_ffnn_notes_variant_sigmoid_without_biases():
    """Notes 003 "Forward Pass and Loss Function in Equations": e = [E x_{t-3}; E x_{t-2}; E x_{t-1}],
    h = σ(W e), z = U h, ŷ = softmax(z): ffnn_activation="sigmoid", ffnn_bias=False."""
    torch.manual_seed(0)
    m = FFNN(FFNNConfig(V, context_size=3, emb_dim=4, hidden_dim=5, ffnn_activation="sigmoid",
                        ffnn_bias=False)).eval()
    assert m.hidden.bias is None and m.output.bias is None
    logits, _ = m(torch.tensor([[7, 2, 8]]), (torch.tensor([[5, 6]]),))
    E, W, U = m.embedding.weight, m.hidden.weight, m.output.weight
    e = torch.cat([E[5], E[6], E[7]])  # the context of position 0
    torch.testing.assert_close(logits[0, 0], U @ torch.sigmoid(W @ e))
    n_params = sum(p.numel() for p in m.parameters())
    assert n_params == V * 4 + 5 * 12 + V * 5  # E, W, U: no biases


@pytest.mark.parametrize("carry", [False, True])
def test_perplexity_counts_words_and_eos_but_never_bos(carry):
    # A zero decoder matrix turns the LSTM into a fixed unigram model p = softmax(bias): perplexity by hand.
    lm = RNNLM(small_rnn(), quick(max_steps=1, eval_batch_size=1)).fit(TRAIN)
    p = np.random.default_rng(0).dirichlet(np.ones(V))
    with torch.no_grad():
        lm.module_.decoder.weight.zero_()
        lm.module_.decoder.bias.copy_(torch.from_numpy(np.log(p)))
    sents = [np.array([5, 6]), np.array([7])]
    targets = [5, 6, EOS, 7, EOS]  # every word and </s>; the <s> after the first </s> is not counted
    expected = math.exp(-np.mean(np.log(p[targets])))
    assert lm.perplexity(sents, carry=carry) == pytest.approx(expected, rel=1e-5)
    assert lm.score(sents, carry=carry)[1] == 5


def test_a_diverged_model_has_infinite_perplexity_not_an_overflow_error():
    # mean NLL > 709.8 nats: exp overflows a float (a model trained with too high a neural.lr got there)
    lm = RNNLM(small_rnn(), quick(max_steps=1)).fit(TRAIN)
    with torch.no_grad():
        lm.module_.decoder.weight.zero_()
        lm.module_.decoder.bias.fill_(0.0)[4] = 1e4  # every token but id 4 costs ~1e4 nats
    assert lm.perplexity([np.array([5, 6])]) == math.inf
    # The history row of a diverged epoch, built explicitly (training there with a huge learning rate
    # gives inf or NaN losses depending on the CPU's arithmetic): a finite mean NLL of 1e4 nats.
    nll, count = evaluate(lm.module_, batchify(np.array([4, 5, 6, 7]), 1), 4, torch.device("cpu"), "fp32", 1, 3)
    row = epoch_row(Position(epoch_loss=3e4, epoch_count=3), nll / count)
    assert row["train_loss"] == 1e4 and row["valid_loss"] > 1000
    assert row["train_ppl"] == row["valid_ppl"] == math.inf  # not exp(700) = 1.0e304


@pytest.mark.parametrize("cell", ["rnn", "lstm", "gru"])
def test_state_carried_across_windows_equals_one_pass(cell):
    torch.manual_seed(0)
    m = RNN(small_rnn(cell)).eval()
    x = torch.randint(4, V, (2, 20))
    full, _ = m(x)
    state, parts = None, []
    for i in range(0, 20, 6):  # bptt windows of 6, 6, 6, 2 with the state carried
        out, state = m(x[:, i : i + 6], state)
        parts.append(out)
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-6, rtol=1e-5)


def test_ffnn_tail_state_makes_windows_equal_one_pass():
    torch.manual_seed(0)
    m = FFNN(FFNNConfig(V, context_size=4, emb_dim=4, hidden_dim=8)).eval()
    x = torch.randint(1, V, (2, 15))
    full, _ = m(x)
    state, parts = None, []
    for i in range(0, 15, 4):
        out, state = m(x[:, i : i + 4], state)
        parts.append(out)
    torch.testing.assert_close(torch.cat(parts, 1), full)


def test_transformer_is_causal():
    torch.manual_seed(0)
    lm = TransformerLM(small_transformer(), quick(max_steps=2, bptt=24)).fit(TRAIN)
    a, b = torch.tensor([[1, 5, 6, 7, 8, 9]]), torch.tensor([[1, 5, 6, 30, 31, 4]])
    la, _ = lm.module_(a)
    lb, _ = lm.module_(b)
    torch.testing.assert_close(la[:, :3], lb[:, :3])
    assert not torch.allclose(la[:, 3:], lb[:, 3:])


@pytest.mark.parametrize("make", [
    lambda: FFNNLM(FFNNConfig(V, emb_dim=8, hidden_dim=16), quick(max_steps=3)),
    lambda: RNNLM(small_rnn("gru"), quick(max_steps=3)),
    lambda: TransformerLM(small_transformer(), quick(max_steps=3, bptt=24)),
])
def test_log_probs_batch_equals_single_contexts_and_full_forward(make):
    lm = make().fit(TRAIN)
    contexts = [[BOS], [BOS, 5, 6, 7], [BOS, 9, 10]]
    batch = lm.log_probs_batch(contexts)
    assert batch.shape == (3, V)
    np.testing.assert_allclose(np.exp(batch).sum(1), 1.0, rtol=1e-5)
    for ctx, row in zip(contexts, batch, strict=True):
        np.testing.assert_allclose(lm.log_probs(ctx), row, atol=1e-5)
        logits, _ = lm.module_(torch.tensor([ctx]))
        np.testing.assert_allclose(torch.log_softmax(logits[0, -1], -1).detach().numpy(), row, atol=1e-5)
    # per-sentence perplexity is the product of the log_probs chain
    sent = np.array([5, 6, 7])
    seq = [BOS, 5, 6, 7, EOS]
    nll = -sum(lm.log_probs(seq[:i])[seq[i]] for i in range(1, len(seq)))
    assert lm.perplexity([sent]) == pytest.approx(math.exp(nll / 4), rel=1e-4)


def test_transformer_uses_only_the_positions_it_was_trained_on():
    # Trained on windows of bptt=4 < max_len: positions 4.. never learned anything, so a longer context
    # is cut to its last 4 tokens (it used to run through untrained positions, disagreeing with perplexity).
    lm = TransformerLM(small_transformer(), quick(max_steps=3, bptt=4)).fit(TRAIN)
    assert lm.module_.max_context > 4
    context = [BOS, 5, 6, 7, 8, 9, 10]
    np.testing.assert_allclose(lm.log_probs(context), lm.log_probs(context[-4:]), atol=1e-6)


def test_lr_schedule_warmup_then_cosine():
    cfg = TrainConfig(lr=1.0, warmup_steps=4, min_lr_ratio=0.1)
    assert [lr_at(s, cfg, 104) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_at(54, cfg, 104) == pytest.approx(0.55)  # halfway: (1 + 0.1) / 2
    assert lr_at(104, cfg, 104) == pytest.approx(0.1)
    assert lr_at(50, TrainConfig(lr=0.3, schedule="constant"), 100) == 0.3


def test_device_auto_picks_cuda_when_present(monkeypatch):
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto").type == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ParameterError, match=r"neural.device='cuda', but torch sees no CUDA GPU .*training.remote"):
        resolve_device("cuda", "neural.device")
    with pytest.raises(ParameterError, match="glove.device='gpu': not a torch device"):
        resolve_device("gpu", "glove.device")


# ---------------------------------------------------------------------------------------------
# learning, determinism, resume


@pytest.mark.parametrize("make", [
    lambda: FFNNLM(FFNNConfig(V, context_size=2, emb_dim=16, hidden_dim=32), quick(epochs=4, lr=2e-2, batch_size=4)),
    lambda: RNNLM(RNNConfig(V, cell="rnn", emb_dim=32, hidden_dim=32, num_layers=1, dropout=0.0),
                  quick(epochs=4, lr=2e-2, batch_size=4)),
    lambda: RNNLM(RNNConfig(V, cell="lstm", emb_dim=32, hidden_dim=32, num_layers=1, dropout=0.0, tie_weights=True),
                  quick(epochs=4, lr=3e-2, batch_size=4)),
    lambda: RNNLM(RNNConfig(V, cell="gru", emb_dim=32, hidden_dim=32, num_layers=1, dropout=0.0),
                  quick(epochs=4, lr=3e-2, batch_size=4)),
    lambda: TransformerLM(small_transformer(positional="learned"), quick(epochs=4, lr=1e-2, bptt=24, batch_size=4)),
    lambda: TransformerLM(small_transformer(), quick(epochs=4, lr=1e-2, bptt=24, batch_size=4)),
])
def test_learns_the_successor_language(make):
    # Unigram perplexity here is ~30; knowing "next = previous + 1" leaves only the random start and the
    # length (~ (ln 36 + 5 ln 1.4) / 6.5 nats/token, ppl ~ 2.4). Every model must get far below unigram.
    lm = make().fit(TRAIN, VALID)
    first, last = lm.metrics_["valid_ppl"][0], lm.metrics_["valid_ppl"][-1]
    assert last < first
    assert lm.perplexity(VALID) < 6.0


def test_same_seed_same_model_other_seed_other_model():
    a = RNNLM(small_rnn(), quick(max_steps=6, seed=3)).fit(TRAIN)
    b = RNNLM(small_rnn(), quick(max_steps=6, seed=3)).fit(TRAIN)
    c = RNNLM(small_rnn(), quick(max_steps=6, seed=4)).fit(TRAIN)
    np.testing.assert_array_equal(a.log_probs([BOS, 5]), b.log_probs([BOS, 5]))
    assert not np.allclose(a.log_probs([BOS, 5]), c.log_probs([BOS, 5]))


def test_sparse_embedding_gradients_train_like_dense_ones():
    # Plain SGD with clipping (the word_language_model recipe): the embedding's gradient holds only the
    # rows a batch used, and training follows the dense run step for step.
    seen = {}

    def fit(sparse):
        lm = RNNLM(small_rnn(dropout=0.0), quick(optimizer="sgd", lr=2.0, clip_grad_norm=0.25, max_steps=8,
                                                 sparse_grads=sparse))
        lm.fit(TRAIN, on_step=lambda step, loss: seen.setdefault(sparse, lm.module_.embedding.weight.grad.layout))
        return lm

    sparse, dense = fit(True), fit(False)
    assert seen == {True: torch.sparse_coo, False: torch.strided}
    for (name, a), b in zip(sparse.module_.state_dict().items(), dense.module_.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
    assert not sparse.module_.embedding.sparse and sparse.module_.embedding.weight.grad is None
    assert not torch.equal(dense.module_.embedding.weight, RNNLM(small_rnn(), quick())._build().embedding.weight)


@pytest.mark.parametrize("change, sparse", [({}, True), ({"optimizer": "adamw"}, False), ({"momentum": 0.9}, False),
                                            ({"weight_decay": 0.1}, False), ({"sparse_grads": False}, False),
                                            ({"tie": True}, False), ({"freeze": True}, False)])
def test_sparse_embedding_gradients_only_where_plain_sgd_applies_them(change, sparse):
    change = dict(change)
    module = RNN(small_rnn(emb_dim=16, hidden_dim=16, tie_weights=change.pop("tie", False)))
    module.embedding.weight.requires_grad_(not change.pop("freeze", False))
    cfg = quick(**{"optimizer": "sgd", **change})
    assert sparse_embedding_grads(module, cfg, world=1) is sparse
    assert not sparse_embedding_grads(module, cfg, world=2)


def test_clip_grad_norm_counts_a_sparse_gradient_by_its_rows():
    # row 1 twice (coalesced: one row [3, 4]), row 2 zero, and a dense [0, 12]: norm 13; clipped to 1.3 = x 0.1
    a, b = nn.Parameter(torch.zeros(3, 2)), nn.Parameter(torch.zeros(2))
    a.grad = torch.sparse_coo_tensor([[1, 1, 2]], torch.tensor([[1.0, 4.0], [2.0, 0.0], [0.0, 0.0]]), (3, 2))
    b.grad = torch.tensor([0.0, 12.0])
    assert float(clip_grad_norm([a, b], 1.3)) == pytest.approx(13.0)
    torch.testing.assert_close(a.grad.to_dense(), torch.tensor([[0.0, 0.0], [0.3, 0.4], [0.0, 0.0]]))
    torch.testing.assert_close(b.grad, torch.tensor([0.0, 1.2]))


def test_resume_after_kill_ends_like_an_uninterrupted_run(tmp_path):
    # LSTM with dropout (so the RNG state matters), 2 epochs, AdamW + warmup + cosine, checkpoints every 5 steps.
    cfg = dict(epochs=2, warmup_steps=3, checkpoint_every=5, lr=1e-2)
    whole = RNNLM(small_rnn(), quick(**cfg, checkpoint_dir=str(tmp_path / "a"))).fit(TRAIN, VALID)
    steps = int(whole.metrics_["step"][-1])
    assert steps > 20

    def kill(step: int, loss: float) -> None:
        if step == 17:  # 2 steps after the checkpoint at 15, in epoch 2
            raise StopTraining

    with pytest.raises(StopTraining):
        RNNLM(small_rnn(), quick(**cfg, checkpoint_dir=str(tmp_path / "b"))).fit(TRAIN, VALID, on_step=kill)
    trainer = json.loads((tmp_path / "b" / "checkpoint" / "trainer.json").read_text())
    assert trainer["position"]["step"] == 15
    resumed = RNNLM(small_rnn(), quick(**cfg, checkpoint_dir=str(tmp_path / "b"))).fit(TRAIN, VALID)
    for col in ("step", "train_loss", "valid_loss"):
        np.testing.assert_allclose(resumed.metrics_[col].to_numpy(), whole.metrics_[col].to_numpy(), rtol=1e-5)
    np.testing.assert_allclose(resumed.log_probs([BOS, 5, 6]), whole.log_probs([BOS, 5, 6]), atol=1e-5)


def test_resumed_progress_counts_done_work_in_the_total_not_in_the_rate(monkeypatch):
    from lexiflow.models import progress

    clock = iter([100.0, 102.0, 102.0])  # start; the update; the rate: 2 s of this run
    monkeypatch.setattr(progress.time, "perf_counter", lambda: next(clock))
    bar = progress.Progress("lm.train", total=100, unit="tokens", done=60)  # 60 tokens trained before the kill
    bar.update(10)
    assert bar.done == 70 and bar.rate == 5.0  # 10 tokens in 2 s; was (60 + 10) / 2


def test_early_stopping_keeps_the_best_epoch():
    # Train on "+1" sentences, validate on "-1" sentences: valid loss worsens once the +1 rule is learnt.
    valid = successor_corpus(40, seed=3, step=-1)
    lm = RNNLM(small_rnn(), quick(epochs=8, lr=2e-2, patience=2)).fit(TRAIN, valid)
    losses = lm.metrics_["valid_loss"].to_list()
    assert len(losses) < 8
    best = int(np.argmin(losses))
    assert len(losses) == best + 1 + 2  # stopped after `patience` epochs without improvement
    nll, count = lm.score(valid, carry=True)
    assert nll / count == pytest.approx(losses[best], rel=1e-6)


def test_bf16_autocast_code_path_trains_on_cpu():
    lm = TransformerLM(small_transformer(), quick(epochs=3, bptt=24, precision="bf16")).fit(TRAIN, VALID)
    ppl = lm.metrics_["valid_ppl"].to_list()
    assert ppl[-1] < ppl[0] < V


# ---------------------------------------------------------------------------------------------
# weight tying x pretrained init x freezing


@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("pretrained", [False, True])
@pytest.mark.parametrize("freeze", [False, True])
def test_tying_pretrained_freezing_grid(tie, pretrained, freeze):
    d = 16
    emb = None
    if pretrained:
        emb = np.random.default_rng(5).normal(size=(V, d)).astype(np.float32)
        emb[7] = np.nan  # word 7 missing from the embeddings artifact: stays randomly initialised
    config = small_rnn(tie_weights=tie, freeze_embeddings=freeze)
    torch.manual_seed(0)
    random_init = RNN(config)  # the init the estimator draws with seed 0
    lm = RNNLM(config, quick(max_steps=5, seed=0), embeddings=emb).fit(TRAIN)
    m = lm.module_
    w = m.embedding.weight.detach().numpy()
    assert (m.decoder.weight is m.embedding.weight) == tie
    assert m.embedding.weight.requires_grad == (not freeze)
    start = random_init.embedding.weight.detach().numpy().copy()
    if pretrained:
        rows = np.arange(V) != 7
        start[rows] = emb[rows]
    if freeze:
        np.testing.assert_array_equal(w, start)
    else:
        assert np.abs(w - start).max() > 1e-4
        if pretrained:  # training moved the pretrained rows only slightly (5 steps)
            assert np.abs(w[10] - emb[10]).max() < 0.2
    assert lm.n_parameters == sum(p.numel() for p in m.parameters())
    if tie:
        assert lm.n_parameters == sum(p.numel() for p in RNN(config).parameters())


# ---------------------------------------------------------------------------------------------
# the lm artifact


@pytest.mark.parametrize("make", [
    lambda: FFNNLM(FFNNConfig(V, emb_dim=8, hidden_dim=16), quick(epochs=2)),
    lambda: RNNLM(small_rnn(tie_weights=True), quick(epochs=2)),
    lambda: TransformerLM(small_transformer(positional="learned"), quick(epochs=2, bptt=24)),
])
def test_save_load_round_trip(tmp_path, make):
    lm = make().fit(TRAIN, VALID)
    lm.save(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "config.json", "loss_curve.png", "metrics.parquet", "model.safetensors"]
    assert (tmp_path / "loss_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert set(load_file(str(tmp_path / "model.safetensors"))) == {n for n, _ in lm.module_.named_parameters()}
    metrics = pl.read_parquet(tmp_path / "metrics.parquet")
    assert metrics.columns == list(neural.METRIC_COLUMNS)
    assert metrics.height == 2 and metrics["valid_ppl"].null_count() == 0
    back = registry.load(tmp_path)  # dispatches on the config's kind
    assert type(back) is type(lm) and back.config == lm.config and back.train == lm.train
    ctx = [BOS, 5, 6]
    np.testing.assert_array_equal(back.log_probs(ctx), lm.log_probs(ctx))
    assert back.perplexity(VALID) == pytest.approx(lm.perplexity(VALID), rel=1e-9)
    assert back.metrics_.equals(lm.metrics_)
    if lm.config.tie_weights:
        head = back.module_.decoder if isinstance(back, RNNLM) else back.module_.lm_head
        assert head.weight is back.module_.embedding.weight


# ---------------------------------------------------------------------------------------------
# user errors


def test_user_errors_name_the_parameter(tmp_path):
    with pytest.raises(ParameterError, match="hidden_dim == emb_dim"):
        RNNLM(RNNConfig(V, emb_dim=8, hidden_dim=16, tie_weights=True)).fit(TRAIN)
    with pytest.raises(ParameterError, match="embeddings has shape"):
        RNNLM(small_rnn(), quick(max_steps=1), embeddings=np.zeros((V, 3))).fit(TRAIN)
    with pytest.raises(ParameterError, match="tie_weights"):
        FFNNLM(FFNNConfig(V, tie_weights=True)).fit(TRAIN)
    with pytest.raises(ParameterError, match="optimizer"):
        RNNLM(small_rnn(), quick(optimizer="adam")).fit(TRAIN)
    with pytest.raises(InputError, match="outside"):
        RNNLM(small_rnn(), quick()).fit([np.array([5, V + 1])])
    with pytest.raises(InputError, match="sentence 1 holds float64"):  # 4.7 used to train as id 4
        RNNLM(small_rnn(), quick()).fit([np.array([5, 6]), np.array([4.7, 5.0])])
    for bad in ({"eval_batch_size": 0}, {"min_lr_ratio": -5.0}, {"device": "gpu"}):
        with pytest.raises(ParameterError, match=f"TrainConfig.{next(iter(bad))}="):
            RNNLM(small_rnn(), quick(**bad)).fit(TRAIN)
    with pytest.raises(InputError, match="empty"):
        RNNLM(small_rnn(), quick()).fit([])
    with pytest.raises(ParameterError, match="not fitted"):
        RNNLM(small_rnn()).log_probs([BOS])
    RNNLM(small_rnn(), quick(max_steps=1)).fit(TRAIN).save(tmp_path)
    with pytest.raises(InputError, match="kind 'rnn'"):
        TransformerLM.load(tmp_path)
    (tmp_path / "metrics.parquet").unlink()  # an artifact damaged outside lexiflow: named, not a raw error
    with pytest.raises(InputError, match="damaged lm artifact.*metrics.parquet"):
        RNNLM.load(tmp_path)
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(InputError, match="damaged lm artifact.*JSONDecodeError"):
        RNNLM.load(tmp_path)


# ---------------------------------------------------------------------------------------------
# data parallel: torchrun, 2 processes, gloo on CPU


def test_two_rank_ddp_follows_the_one_process_loss_curve(tmp_path):
    # Same global batch (8 rows): each of 2 ranks trains 4 rows, DDP averages the gradients. Dropout off (the
    # ranks draw their own masks); clipping, warmup + cosine and AdamW on, checkpoints gathered from both ranks.
    def make() -> RNNLM:
        return RNNLM(small_rnn(dropout=0.0), quick(epochs=1, warmup_steps=3, lr=1e-2, checkpoint_every=5,
                                                    checkpoint_dir=str(tmp_path / "ckpt")))

    steps: list[list[float]] = []
    one = RNNLM(small_rnn(dropout=0.0), quick(epochs=1, warmup_steps=3, lr=1e-2)).fit(
        TRAIN, VALID, on_step=lambda step, loss: steps.append([step, loss]))
    two = fit_distributed(make(), TRAIN, VALID, world_size=2, workdir=tmp_path / "ddp")
    curve = json.loads((tmp_path / "ddp" / "steps.json").read_text())
    assert len(curve) == len(steps) > 15
    np.testing.assert_allclose(np.array(curve), np.array(steps), rtol=1e-4)
    for col in ("step", "train_loss", "valid_loss"):
        np.testing.assert_allclose(two.metrics_[col].to_numpy(), one.metrics_[col].to_numpy(), rtol=1e-4)
    np.testing.assert_allclose(two.log_probs([BOS, 5, 6]), one.log_probs([BOS, 5, 6]), atol=1e-4)
    # The checkpoint holds both ranks' carried rows (the whole batch) and each rank's RNG state.
    state = load_file(str(tmp_path / "ckpt" / "checkpoint" / "state.safetensors"))
    assert state["carry.0"].shape == (2, 8, 16) and {"rng.cpu.rank0", "rng.cpu.rank1"} <= set(state)


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            if text in cmdline.read_bytes().decode(errors="replace"):
                pids.append(int(cmdline.parent.name))
    return pids


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the ranks in /proc")
def test_ranks_stop_when_the_process_that_launched_them_is_killed(tmp_path):
    # SIGKILL of the stage process (OOM killer, a cancelled flow run) releases its build lock; ranks left
    # running would go on writing the checkpoint folder beside the rerun that the lock now lets in.
    ckpt, job = tmp_path / "ckpt", tmp_path / "job"
    launch = (f"from tests.test_lm_neural import *\n"
              f"train = quick(epochs=1000, checkpoint_every=5, checkpoint_dir={str(ckpt)!r})\n"
              f"fit_distributed(RNNLM(small_rnn(), train), TRAIN, None, world_size=2, workdir={str(job)!r})\n")
    stage = subprocess.Popen([sys.executable, "-c", launch], cwd=Path(__file__).parents[1],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not (ckpt / "checkpoint" / "trainer.json").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(set(_processes_mentioning(str(job))) - {stage.pid}) == 3  # torchrun and its two ranks
        stage.kill()
        stage.wait()
        deadline = time.monotonic() + 15
        while _processes_mentioning(str(job)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _processes_mentioning(str(job)) == []
    finally:
        stage.kill()
        for pid in _processes_mentioning(str(job)):  # only what this test started
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_ddp_parameter_errors():
    with pytest.raises(ParameterError, match="divisible by world_size=3"):
        fit_distributed(RNNLM(small_rnn(), quick()), TRAIN, None, world_size=3, workdir="unused")
