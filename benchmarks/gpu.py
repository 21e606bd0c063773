"""Training at the hardware's speed: lexiflow's user path against a nanoGPT-style reference, in one process.

The race: `TransformerLM(TransformerConfig(...), TrainConfig(...)).fit(sentences)`, as a user calls it (bf16
autocast by default on CUDA), against `RefGPT` below, ~40 lines after Karpathy's nanoGPT `model.py`/`train.py`
(pre-LN GPT-2 blocks, learned positions, tied output, `F.scaled_dot_product_attention(is_causal=True)`, bf16
autocast, fused AdamW, clip 1.0) of the same size, on the same random tokens, eager, then both with
`torch.compile`. GPT-2 small on CUDA: d_model 768, 12 layers, 12 heads, context 1024, batch 16, vocabulary
32,768 (110 M parameters). Tokens/s: lexiflow's is its second epoch's own figure (the first holds the warm-up
and compilation; the loop's epoch clock waits for the device); the reference times `STEPS` steps after 3
warm-up steps, synchronised at both ends. MFU = (6 N + 12 L T d) tokens/s / the GPU's dense bf16 peak
(PaLM's count, Chowdhery et al. 2022, appendix B; N all parameters, tied ones once).
Targets on an H100/H200: lexiflow >= 0.9x the reference's tokens/s, both eager; >= 35 % MFU compiled.

Beside them, through the same loop: tokens/s of the MLM (BERT-base size), the Transformer translator and the
BiLSTM tagger, and GloVe's seconds per epoch, each on generated data (the GPU machine has no ../shared).
On the CPU every size is tiny, so the benchmark runs anywhere; those rows say so and state no target.
"""

from __future__ import annotations

import logging
import math
import time

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F
from lexiflow.models.encoder import EncoderConfig, MaskedLM
from lexiflow.models.glove import GloVe
from lexiflow.models.lm.train import TrainConfig
from lexiflow.models.lm.transformer import TransformerConfig, TransformerLM, count_parameters
from lexiflow.models.neural_tagger import BiLSTMTagger, TaggerConfig
from lexiflow.models.seq2seq.transformer import TransformerSeq2SeqConfig
from lexiflow.models.seq2seq.translator import TokenizerConfig, Translator
from torch import nn

from benchmarks.harness import Row
from benchmarks.lm_neural import PEAK_BF16_FLOPS

NAME = "gpu"
STEPS = 20  # timed optimizer steps per run (CUDA)


# ---------------------------------------------------------------------------------------------
# the reference: nanoGPT's model and training step, written plainly


class RefBlock(nn.Module):
    def __init__(self, d: int, h: int) -> None:
        super().__init__()
        self.h, self.ln1, self.ln2 = h, nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        q, k, v = (t.view(B, T, self.h, D // self.h).transpose(1, 2) for t in self.qkv(self.ln1(x)).split(D, 2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, D)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class RefGPT(nn.Module):
    def __init__(self, c: TransformerConfig) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(c.vocab_size, c.d_model), nn.Embedding(c.max_len, c.d_model)
        self.blocks = nn.ModuleList(RefBlock(c.d_model, c.n_heads) for _ in range(c.n_layers))
        self.ln_f, self.head = nn.LayerNorm(c.d_model), nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.head.weight = self.wte.weight
        for name, p in self.named_parameters():  # GPT-2's init: N(0, 0.02), residual outputs scaled, biases 0
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * len(self.blocks)) if name.endswith(("proj.weight",
                                                                                            "out.weight")) else 0.02)
            elif "ln" not in name:
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def reference_tokens_per_s(c: TransformerConfig, batch: int, steps: int, device: torch.device, compile: bool) -> float:
    """nanoGPT's train.py step (bf16 autocast, fused AdamW, clip 1.0) on random tokens already on the device."""
    torch.manual_seed(0)
    model = RefGPT(c).to(device)
    fwd = torch.compile(model) if compile else model
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1, fused=True)
    data = torch.randint(c.vocab_size, (steps + 3, batch, c.max_len + 1), device=device)
    start = 0.0
    for i in range(steps + 3):
        if i == 3:  # warm-up (allocator, kernel choice, compilation) done
            _sync(device)
            start = time.perf_counter()
        x, y = data[i, :, :-1], data[i, :, 1:]
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = fwd(x)
        F.cross_entropy(logits.float().view(-1, c.vocab_size), y.reshape(-1)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    _sync(device)
    return steps * batch * c.max_len / (time.perf_counter() - start)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------------------------------------
# lexiflow's user paths


def lexiflow_tokens_per_s(c: TransformerConfig, batch: int, steps: int, device: torch.device, compile: bool) -> float:
    """`TransformerLM.fit` on random sentences: two epochs of `steps` windows; the second epoch's tokens/s."""
    rng = np.random.default_rng(0)
    tokens = batch * (steps * c.max_len + 1)
    sentences = [rng.integers(4, c.vocab_size, size=c.max_len - 1) for _ in range(tokens // c.max_len + 1)]
    cfg = TrainConfig(epochs=2, batch_size=batch, bptt=c.max_len, lr=6e-4, warmup_steps=2, weight_decay=0.1,
                      clip_grad_norm=1.0, checkpoint_every=0, device=device.type, precision="bf16", compile=compile,
                      log_every_s=30)
    return float(TransformerLM(c, cfg).fit(sentences).metrics_["tokens_per_s"][-1])


def mfu(c: TransformerConfig, tokens_per_s: float, device: torch.device) -> float | None:
    """Model FLOPs utilisation against the GPU's dense bf16 peak; None off a known GPU."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
    peak = next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)
    flops_per_token = 6 * count_parameters(c) + 12 * c.n_layers * c.max_len * c.d_model
    return flops_per_token * tokens_per_s / peak if peak else None


def mlm_tokens_per_s(gpu: bool, device: str) -> tuple[float, str]:
    size = dict(d_model=768, n_layers=12, n_heads=12, d_ff=3072, max_len=128) if gpu else \
        dict(d_model=32, n_layers=1, n_heads=2, d_ff=64, max_len=32)
    vocab, n, batch = (32768, 64 * 30, 64) if gpu else (500, 64, 16)
    rng = np.random.default_rng(0)
    sents = [rng.integers(5, vocab, size=rng.integers(8, size["max_len"] - 1)) for _ in range(n)]
    cfg = TrainConfig(epochs=2, batch_size=batch, lr=1e-4, warmup_steps=10, checkpoint_every=0, device=device,
                      clip_grad_norm=1.0, weight_decay=0.01, log_every_s=30)
    mlm = MaskedLM(EncoderConfig(vocab_size=vocab, dropout=0.1, **size), cfg).fit(sents)
    return mlm.history[-1]["tokens_per_s"], f"encoder {size}, V={vocab}, batch {batch}, {n} sentences"


def seq2seq_tokens_per_s(gpu: bool, device: str) -> tuple[float, str]:
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(8000 if gpu else 200)]
    n, longest = (64 * 40, 48) if gpu else (96, 12)
    src = [" ".join(rng.choice(words, size=rng.integers(4, longest))) for _ in range(n)]
    tgt = [" ".join(reversed(s.split())) for s in src]  # the task is immaterial to throughput
    size = dict(d_model=512, n_heads=8, d_ff=2048, encoder_layers=6, decoder_layers=6, max_len=64) if gpu else \
        dict(d_model=32, n_heads=2, d_ff=64, encoder_layers=1, decoder_layers=1, max_len=16)
    words_tok = TokenizerConfig("word", len(words) + 8)
    tr = Translator("transformer", TransformerSeq2SeqConfig(**size, dropout=0.1), words_tok,
                    TrainConfig(epochs=2, batch_size=64 if gpu else 16, lr=3e-4, warmup_steps=10, device=device,
                                checkpoint_every=0, clip_grad_norm=1.0, log_every_s=30))
    tr.fit(src, tgt)
    return tr.history_[-1]["tokens_per_s"], f"Transformer {size}, {n} pairs of 4-{longest} words"


def tagger_tokens_per_s(gpu: bool, device: str) -> tuple[float, str]:
    rng = np.random.default_rng(0)
    n, vocab = (32 * 60, 20000) if gpu else (64, 300)
    tags = [f"T{i}" for i in range(17)]
    sents = [[(f"w{w}", tags[w % 17]) for w in rng.integers(0, vocab, size=rng.integers(5, 40))] for _ in range(n)]
    size = dict(word_dim=100, hidden_dim=256, num_layers=2) if gpu else dict(word_dim=16, hidden_dim=16, num_layers=1)
    cfg = TaggerConfig(**size, hmm_features=False, train=TrainConfig(epochs=2, batch_size=32, lr=2e-3, device=device,
                                                                   checkpoint_every=0, log_every_s=30))
    tagger = BiLSTMTagger(cfg).fit(sents)
    return tagger.history_[-1]["tokens_per_s"], f"BiLSTM {size}, char CNN, {n} sentences of 5-40 words"


def glove_epoch_seconds(gpu: bool, device: str) -> tuple[float, str]:
    v, density = (100_000, 1e-3) if gpu else (2000, 5e-3)
    counts = sp.random(v, v, density=density, random_state=0, format="csr",
                       data_rvs=lambda k: np.ceil(np.random.default_rng(0).pareto(1.5, k) + 1))
    counts = sp.csr_matrix(counts + counts.T)
    glove = GloVe(dim=300 if gpu else 32, epochs=3, device=device, seed=0).fit(counts)
    return float(np.mean([h["seconds"] for h in glove.history_[1:]])), f"V={v}, {counts.nnz} cells, dim {glove.dim}"


def run(quick: bool = False) -> list[Row]:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    gpu = torch.cuda.is_available()
    device = torch.device("cuda" if gpu else "cpu")
    where = torch.cuda.get_device_name(device) if gpu else "CPU, tiny sizes (the GPU code path; no target)"
    if gpu:
        c = TransformerConfig(32768, d_model=768, n_layers=12, n_heads=12, max_len=1024, dropout=0.0,
                              positional="learned")
        batch, steps = 16, 10 if quick else STEPS
    else:
        c = TransformerConfig(512, d_model=32, n_layers=2, n_heads=4, max_len=32, dropout=0.0, positional="learned")
        batch, steps = 4, 3
    case = (f"GPT-2-style LM d{c.d_model} {c.n_layers}L {c.n_heads}h ctx {c.max_len} batch {batch} "
            f"V={c.vocab_size} ({count_parameters(c) / 1e6:.1f}M params), bf16 autocast, {where}")
    peer = "nanoGPT-style reference, same process"
    rows: list[Row] = []
    for compile in ((False, True) if gpu else (False,)):  # compiling on the CPU: docs/neural_lm.md
        mode = "compiled" if compile else "eager"
        ours = lexiflow_tokens_per_s(c, batch, steps, device, compile)
        ref = reference_tokens_per_s(c, batch, steps, device, compile)
        target, met = (("ratio >= 0.9", ours >= 0.9 * ref) if not compile else ("", None)) if gpu else ("", None)
        rows.append(Row(NAME, f"{case}, {mode}", "train tokens/s", ours, ref, f"{peer} ({mode})", target=target,
                        met=met, notes="ours: TransformerLM.fit's 2nd epoch; reference: 3 warm-up steps excluded"))
        for who, tps in (("lexiflow", ours), ("reference", ref)):
            share = mfu(c, tps, device)
            if share is not None:
                target, met = ("MFU >= 0.35", share >= 0.35) if compile and who == "lexiflow" else ("", None)
                rows.append(Row(NAME, f"{case}, {mode}, {who}", "MFU", share, target=target, met=met,
                                notes="(6N + 12LTd) tokens/s / dense bf16 peak"))
    if not gpu:
        rows.append(Row(NAME, f"{case}, compiled", "train tokens/s", math.nan,
                        notes="GPU part skipped: torch.compile on the CPU is slower than eager (docs/neural_lm.md)"))
    for label, measure, metric in (("MLM pretraining", mlm_tokens_per_s, "train tokens/s"),
                                   ("seq2seq translator", seq2seq_tokens_per_s, "train tokens/s"),
                                   ("BiLSTM tagger", tagger_tokens_per_s, "train tokens/s"),
                                   ("GloVe", glove_epoch_seconds, "seconds per epoch")):
        value, size = measure(gpu, device.type)
        rows.append(Row(NAME, f"{label}, {where}", metric, value, higher_is_better=metric != "seconds per epoch",
                        notes=f"{size}; the loop's 2nd-epoch figure (GloVe: epochs 2-3), generated data"))
    return rows
