"""Neural LMs on WikiText-2 (validation file): held-out perplexity and training throughput.

Data: `../shared/data/wikitext-2/wiki.valid.tokens`, non-empty lines as sentences, the first 90% of
lines to train, the last 10% held out; the vocabulary is every training word (held-out words it
lacks map to <unk>, like WikiText's own <unk>). Perplexity is the streamed evaluation (`carry=True`:
state carried across lines, 10 rows), counting every word and every end of line — the same tokens
the reference counts (it writes `w1 .. wn <eos>` per line, we write `<s> w1 .. wn </s>`, `<s>` never
counted).

The LSTM 2x200 row races our `RNNLM` against a plain reference PyTorch LSTM LM written here in the
pytorch/examples word_language_model recipe (embedding -> nn.LSTM -> linear, SGD lr 20, clip 0.25,
dropout 0.2, bptt 35, batch 20), same data, same epochs, torch threads = 2 for both.
Targets: our held-out perplexity <= the reference's, our training tokens/s >= 1x the reference's.

FFNN / Elman RNN / GRU / Transformer rows train at smaller stated budgets for fewer epochs.
The GPU rows (Transformer >= 100M parameters, bf16, tokens/s and MFU) run only where CUDA is
present; elsewhere the same code path runs on CPU at a tiny size (bf16 autocast) and the GPU rows
record that no GPU was available.
"""

from __future__ import annotations

import math
import os
import time
from collections import Counter

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.harness import SHARED_DATA, Row
from models.lm.ffnn import FFNNLM, FFNNConfig
from models.lm.neural import NeuralLM
from models.lm.rnn import RNNLM, RNNConfig
from models.lm.train import TrainConfig
from models.lm.transformer import TransformerConfig, TransformerLM, count_parameters

NAME = "lm_neural"
WIKI = SHARED_DATA / "wikitext-2" / "wiki.valid.tokens"
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]
PEAK_BF16_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12}  # dense bf16 tensor-core peaks


def load_wikitext(limit_lines: int | None = None) -> tuple[list[np.ndarray], list[np.ndarray], int]:
    """(train sentences, held-out sentences, vocab size): first 90% / last 10% of the non-empty lines."""
    lines = [ln.split() for ln in WIKI.read_text(encoding="utf-8").splitlines() if ln.strip()]
    if limit_lines:
        lines = lines[:limit_lines]
    cut = int(0.9 * len(lines))
    counts = Counter(w for ln in lines[:cut] for w in ln)
    vocab = {w: i for i, w in enumerate(SPECIALS)}
    for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        vocab.setdefault(w, len(vocab))
    encode = [np.array([vocab.get(w, 0) for w in ln], dtype=np.int64) for ln in lines]
    return encode[:cut], encode[cut:], len(vocab)


# ---------------------------------------------------------------------------------------------
# the reference: pytorch/examples word_language_model (LSTM), written plainly


class RefLSTM(nn.Module):
    def __init__(self, ntoken: int, ninp: int, nhid: int, nlayers: int, dropout: float) -> None:
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)
        self.nlayers, self.nhid = nlayers, nhid

    def forward(self, x, hidden):
        output, hidden = self.rnn(self.drop(self.encoder(x)), hidden)
        return self.decoder(self.drop(output)), hidden

    def init_hidden(self, bsz):
        w = next(self.parameters())
        return (w.new_zeros(self.nlayers, bsz, self.nhid), w.new_zeros(self.nlayers, bsz, self.nhid))


def _ref_batchify(data: torch.Tensor, bsz: int) -> torch.Tensor:
    nbatch = data.size(0) // bsz
    return data[: nbatch * bsz].view(bsz, -1).t().contiguous()  # (T, B)


def reference_lstm(train: list[np.ndarray], test: list[np.ndarray], vocab: int, epochs: int, eos: int = 2,
                   seed: int = 0) -> tuple[float, float]:
    """Train the word_language_model recipe; return (held-out perplexity, training tokens/s)."""
    torch.manual_seed(seed)
    stream = lambda sents: torch.from_numpy(np.concatenate([np.append(s, eos) for s in sents]))  # noqa: E731
    train_data, test_data = _ref_batchify(stream(train), 20), _ref_batchify(stream(test), 10)
    model = RefLSTM(vocab, 200, 200, 2, 0.2)
    criterion = nn.CrossEntropyLoss()
    lr, bptt, clip = 20.0, 35, 0.25

    def get_batch(source, i):
        seq_len = min(bptt, len(source) - 1 - i)
        return source[i : i + seq_len], source[i + 1 : i + 1 + seq_len].reshape(-1)

    seconds, tokens = 0.0, 0
    for _ in range(epochs):
        model.train()
        hidden = model.init_hidden(20)
        t0 = time.perf_counter()
        for i in range(0, train_data.size(0) - 1, bptt):
            data, targets = get_batch(train_data, i)
            hidden = tuple(h.detach() for h in hidden)
            model.zero_grad()
            output, hidden = model(data, hidden)
            loss = criterion(output.view(-1, vocab), targets)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-lr)
            loss.item()  # the recipe accumulates total_loss += loss.item()
            tokens += data.numel()
        seconds += time.perf_counter() - t0
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        hidden = model.init_hidden(10)
        for i in range(0, test_data.size(0) - 1, bptt):
            data, targets = get_batch(test_data, i)
            output, hidden = model(data, hidden)
            total += F.cross_entropy(output.view(-1, vocab), targets, reduction="sum").item()
            count += targets.numel()
    return math.exp(total / count), tokens / seconds


# ---------------------------------------------------------------------------------------------
# ours


def _fit(lm: NeuralLM, train: list[np.ndarray], test: list[np.ndarray]) -> tuple[float, float, int]:
    lm.fit(train)
    m = lm.metrics_
    tps = float(m["tokens_per_s"].dot(m["seconds"]) / m["seconds"].sum())  # all epochs: tokens / seconds
    return lm.perplexity(test, carry=True), tps, lm.n_parameters


def gpu_transformer_throughput(config: TransformerConfig, device: str, steps: int, batch: int,
                               precision: str = "bf16") -> tuple[float, float | None, int]:
    """Train `steps` steps of the Transformer through our loop on random tokens; (tokens/s, MFU, params).

    The first 2 steps (allocator, kernel selection) are not timed. MFU = (6 N + 12 L T d) tokens/s / peak
    dense bf16 FLOP/s (PaLM, Chowdhery et al. 2022, appendix B; N counts all parameters, tied ones once);
    None where the device's peak is unknown.
    """
    rng = np.random.default_rng(0)
    sents = [rng.integers(4, config.vocab_size, size=config.max_len - 1) for _ in range((steps + 3) * batch)]
    cfg = TrainConfig(max_steps=steps + 2, batch_size=batch, bptt=config.max_len, lr=3e-4, warmup_steps=2,
                      device=device, precision=precision, clip_grad_norm=1.0, weight_decay=0.1)
    stamps: dict[int, float] = {}

    def clock(step: int, loss: float) -> None:  # loss.item() already synchronised the device
        if step in (2, steps + 2):
            stamps[step] = time.perf_counter()

    lm = TransformerLM(config, cfg).fit(sents, on_step=clock)
    tps = steps * batch * config.max_len / (stamps[steps + 2] - stamps[2])  # the 2 warm-up steps excluded
    n = lm.n_parameters
    flops_per_token = 6 * n + 12 * config.n_layers * config.max_len * config.d_model
    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() and device != "cpu" else ""
    peak = next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)
    return tps, (flops_per_token * tps / peak if peak else None), n


def run(quick: bool = False) -> list[Row]:
    torch.set_num_threads(2)  # ours and the reference alike
    train, test, vocab = load_wikitext(limit_lines=40 if quick else None)
    n_train = sum(len(s) + 1 for s in train)
    lstm_epochs, small_epochs = (1, 1) if quick else (2, 1)
    load = os.getloadavg()[0]
    data_note = f"WikiText-2 valid: {len(train)} train lines ({n_train} tokens), {len(test)} held-out lines, V={vocab}"
    rows: list[Row] = []

    # -- LSTM 2x200 vs the reference recipe --------------------------------------------------
    ref_ppl, ref_tps = reference_lstm(train, test, vocab, lstm_epochs)
    ours = RNNLM(RNNConfig(vocab, cell="lstm", emb_dim=200, hidden_dim=200, num_layers=2, dropout=0.2,
                           tie_weights=True),
                 TrainConfig(epochs=lstm_epochs, batch_size=20, bptt=35, optimizer="sgd", lr=20.0,
                             schedule="cosine", min_lr_ratio=0.05, clip_grad_norm=0.25, device="cpu", seed=0))
    ppl, tps, n = _fit(ours, train, test)
    case = f"LSTM 2x200 emb 200 tied ({n / 1e6:.2f}M params), bptt 35, batch 20, {lstm_epochs} epochs"
    note = f"{data_note}; ours SGD lr 20 cosine, tied; torch threads 2; load avg {load:.1f}"
    rows.append(Row(NAME, case, "held-out perplexity", ppl, ref_ppl, "reference nn.LSTM word_language_model",
                    higher_is_better=False, target="ratio <= 1", met=ppl <= ref_ppl, notes=note))
    rows.append(Row(NAME, case, "train tokens/s", tps, ref_tps, "reference nn.LSTM word_language_model",
                    target="ratio >= 1", met=tps >= ref_tps, notes=note))

    # -- the other architectures at stated budgets ------------------------------------------
    d = 128
    others: list[tuple[str, NeuralLM]] = [
        ("FFNN 5-gram (4 x emb 128 -> tanh 256)", FFNNLM(FFNNConfig(vocab, context_size=4, emb_dim=d, hidden_dim=256,
                                                                    dropout=0.2),
                                                         TrainConfig(epochs=small_epochs, batch_size=20, bptt=35,
                                                                     lr=2e-3, weight_decay=0.01, device="cpu"))),
        ("Elman RNN 1x128 tied", RNNLM(RNNConfig(vocab, cell="rnn", emb_dim=d, hidden_dim=d, num_layers=1,
                                                 dropout=0.2, tie_weights=True),
                                       TrainConfig(epochs=small_epochs, batch_size=20, bptt=35, lr=2e-3,
                                                   device="cpu"))),
        ("GRU 1x128 tied", RNNLM(RNNConfig(vocab, cell="gru", emb_dim=d, hidden_dim=d, num_layers=1, dropout=0.2,
                                           tie_weights=True),
                                 TrainConfig(epochs=small_epochs, batch_size=20, bptt=35, lr=3e-3, device="cpu"))),
        ("Transformer 2L d128 4h ctx 64 tied", TransformerLM(
            TransformerConfig(vocab, max_len=64, d_model=d, n_layers=2, n_heads=4, dropout=0.1),
            TrainConfig(epochs=small_epochs, batch_size=20, bptt=64, lr=3e-3, warmup_steps=10, weight_decay=0.01,
                        device="cpu"))),
    ]
    for label, lm in others:
        ppl, tps, n = _fit(lm, train, test)
        case = f"{label}, {n / 1e6:.2f}M params, {small_epochs} epoch(s)"
        rows.append(Row(NAME, case, "held-out perplexity", ppl, ref_ppl,
                        f"reference LSTM 2x200 ({lstm_epochs} epochs)", higher_is_better=False,
                        notes=f"{data_note}; AdamW cosine; {tps:.0f} train tokens/s"))

    # -- GPU rows: Transformer >= 100M params in bf16 -----------------------------------------
    if torch.cuda.is_available():
        big = TransformerConfig(50304, max_len=1024, d_model=768, n_layers=12, n_heads=12, dropout=0.0,
                                positional="learned")
        tps, mfu, n = gpu_transformer_throughput(big, "cuda", steps=10 if quick else 30, batch=8)
        case = f"Transformer 12L d768 ctx 1024 ({n / 1e6:.0f}M params), bf16, {torch.cuda.get_device_name(0)}"
        rows.append(Row(NAME, case, "train tokens/s", tps, notes="random tokens; our training loop"))
        rows.append(Row(NAME, case, "MFU", mfu if mfu is not None else float("nan"),
                        notes="(6N + 12LTd) * tokens/s / peak dense bf16"))
    else:
        tiny = TransformerConfig(512, max_len=32, d_model=32, n_layers=2, n_heads=4, dropout=0.0)
        tps, _, n = gpu_transformer_throughput(tiny, "cpu", steps=5, batch=4)
        n_big = count_parameters(TransformerConfig(50304, max_len=1024, d_model=768, n_layers=12, n_heads=12,
                                                   positional="learned"))
        rows.append(Row(NAME, f"Transformer tiny ({n} params), bf16 autocast on CPU: the GPU code path",
                        "train tokens/s", tps, notes="code-path check only, not a GPU figure"))
        for metric in ("train tokens/s", "MFU"):
            rows.append(Row(NAME, f"Transformer 12L d768 ctx 1024 ({n_big / 1e6:.0f}M params), bf16 on GPU", metric,
                            float("nan"), notes="not measured: no GPU was available in this session"))
    return rows
