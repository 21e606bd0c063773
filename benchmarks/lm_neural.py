"""Neural LMs on WikiText-2 (validation file): held-out perplexity and training throughput.

Data: `../shared/data/wikitext-2/wiki.valid.tokens`, non-empty lines as sentences, the first 90% of
lines to train, the last 10% held out; the vocabulary is every training word (held-out words it
lacks map to <unk>, like WikiText's own <unk>). Perplexity is the streamed evaluation (`carry=True`:
state carried across lines, 10 rows), counting every word and every end of line — the same tokens
the reference counts (it writes `w1 .. wn <eos>` per line, we write `<s> w1 .. wn </s>`, `<s>` never
counted).

The LSTM 2x200 row races our `RNNLM` against a plain reference PyTorch LSTM LM written here in the
pytorch/examples word_language_model recipe (embedding -> nn.LSTM -> linear, SGD lr 20, clip 0.25,
dropout 0.2, bptt 35, batch 20, untied): the same architecture, initialisation, data and epochs; ours
adds only its cosine learning-rate decay. Fairness: the two train interleaved step for step in one
process with one torch thread (after each of our optimizer steps the reference takes one; each clock
counts only its own steps), so whatever load the shared machine has falls on both alike (on two busy
cores, two OpenMP threads spin-wait and run ~3x slower than one). Tokens/s is training tokens over
training seconds (evaluation excluded) for both. The other architectures train meanwhile in a second
process.
Targets: our held-out perplexity <= the reference's, our training tokens/s >= 1x the reference's.

KN3 / KN5 (modified Kneser-Ney, `models.lm.ngram`) are scored on the same split and token counts.
FFNN / Elman RNN / GRU / Transformer rows train at smaller stated budgets for fewer epochs
(`LSTM_EPOCHS`, `SMALL_EPOCHS`), two at a time.
The GPU rows (Transformer >= 100M parameters, bf16, tokens/s and MFU) run only where CUDA is
present; elsewhere the same code path runs on CPU at a tiny size (bf16 autocast) and the GPU rows
record that no GPU was available.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import torch
import torch.nn.functional as F
from lexiflow.models.lm.ffnn import FFNNLM, FFNNConfig
from lexiflow.models.lm.neural import NeuralLM
from lexiflow.models.lm.ngram import NgramLM
from lexiflow.models.lm.rnn import RNNLM, RNNConfig
from lexiflow.models.lm.train import TrainConfig
from lexiflow.models.lm.transformer import TransformerConfig, TransformerLM, count_parameters
from torch import nn

from benchmarks.harness import SHARED_DATA, Interleaved, Row

NAME = "lm_neural"
WIKI = SHARED_DATA / "wikitext-2" / "wiki.valid.tokens"
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]
LSTM_EPOCHS, SMALL_EPOCHS = 2, 1  # sized so the whole run takes ~20 min on 2 busy cores
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


class ReferenceTrainer:
    """The word_language_model training loop (`main.py`'s `train()`), one bptt batch per `step()` call so it
    can run interleaved with ours: detach the hidden state, forward, loss, backward, clip 0.25, p -= lr * grad."""

    def __init__(self, train: list[np.ndarray], vocab: int, epochs: int, eos: int = 2, seed: int = 0,
                 lr: float = 20.0, bptt: int = 35, clip: float = 0.25) -> None:
        torch.manual_seed(seed)
        self.eos, self.vocab, self.epochs, self.lr, self.bptt, self.clip = eos, vocab, epochs, lr, bptt, clip
        self.data = _ref_batchify(self.stream(train), 20)
        self.model = RefLSTM(vocab, 200, 200, 2, 0.2)
        self.criterion = nn.CrossEntropyLoss()
        self.batches = list(range(0, self.data.size(0) - 1, bptt))
        self.epoch, self.batch, self.tokens, self.seconds = 0, 0, 0, 0.0
        self.hidden = self.model.init_hidden(20)

    def stream(self, sents: list[np.ndarray]) -> torch.Tensor:
        return torch.from_numpy(np.concatenate([np.append(s, self.eos) for s in sents]))

    def get_batch(self, source: torch.Tensor, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        seq_len = min(self.bptt, len(source) - 1 - i)
        return source[i : i + seq_len], source[i + 1 : i + 1 + seq_len].reshape(-1)

    @property
    def done(self) -> bool:
        return self.epoch >= self.epochs

    def step(self) -> None:
        t0 = time.perf_counter()
        model = self.model
        model.train()
        if self.batch == 0:
            self.hidden = model.init_hidden(20)
        data, targets = self.get_batch(self.data, self.batches[self.batch])
        self.hidden = tuple(h.detach() for h in self.hidden)
        model.zero_grad()
        output, self.hidden = model(data, self.hidden)
        loss = self.criterion(output.view(-1, self.vocab), targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), self.clip)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-self.lr)
        loss.item()  # the recipe accumulates total_loss += loss.item()
        self.tokens += data.numel()
        self.batch += 1
        if self.batch == len(self.batches):
            self.epoch, self.batch = self.epoch + 1, 0
        self.seconds += time.perf_counter() - t0

    @torch.no_grad()
    def perplexity(self, test: list[np.ndarray]) -> float:
        self.model.eval()
        test_data = _ref_batchify(self.stream(test), 10)
        total, count = 0.0, 0
        hidden = self.model.init_hidden(10)
        for i in range(0, test_data.size(0) - 1, self.bptt):
            data, targets = self.get_batch(test_data, i)
            output, hidden = self.model(data, hidden)
            total += F.cross_entropy(output.view(-1, self.vocab), targets, reduction="sum").item()
            count += targets.numel()
        return math.exp(total / count)


def lstm_race(train: list[np.ndarray], test: list[np.ndarray], vocab: int, epochs: int) -> dict[str, dict]:
    """Ours and the reference trained step for step, interleaved in one process and thread: after each of
    our optimizer steps (`on_step`) the reference takes one. Each side's clock counts only its own steps,
    so any load on the machine falls on both alike. Ours: loop seconds (metrics) minus the reference's."""
    ref = ReferenceTrainer(train, vocab, epochs)
    race = Interleaved(ref)
    ours = our_lstm(vocab, epochs).fit(train, on_step=race)
    race.finish()  # ours has ~1% more windows (its <s> tokens); this does not run in practice
    m = ours.metrics_
    our_tokens = float(m["tokens_per_s"].dot(m["seconds"]))
    our_seconds = float(m["seconds"].sum()) - race.inside
    return {"ours": {"ppl": ours.perplexity(test, carry=True), "tps": our_tokens / our_seconds,
                     "params": ours.n_parameters},
            "reference": {"ppl": ref.perplexity(test), "tps": ref.tokens / ref.seconds,
                          "params": sum(p.numel() for p in ref.model.parameters())}}


# ---------------------------------------------------------------------------------------------
# ours, and the jobs the benchmark runs (module-level functions: spawned processes import them)


def _fit(lm: NeuralLM, train: list[np.ndarray], test: list[np.ndarray]) -> tuple[float, float, int]:
    lm.fit(train)
    m = lm.metrics_
    tps = float(m["tokens_per_s"].dot(m["seconds"]) / m["seconds"].sum())  # all epochs: tokens / seconds
    return lm.perplexity(test, carry=True), tps, lm.n_parameters


def our_lstm(vocab: int, epochs: int) -> RNNLM:
    """LSTM 2x200, emb 200, untied: the reference's architecture; SGD lr 20, clip 0.25, dropout 0.2, bptt 35,
    batch 20 as the recipe, plus our cosine decay (to 5% of lr) instead of a constant learning rate."""
    return RNNLM(RNNConfig(vocab, cell="lstm", emb_dim=200, hidden_dim=200, num_layers=2, dropout=0.2,
                           tie_weights=False),
                 TrainConfig(epochs=epochs, batch_size=20, bptt=35, optimizer="sgd", lr=20.0, schedule="cosine",
                             min_lr_ratio=0.05, clip_grad_norm=0.25, device="cpu", seed=0, log_every_s=60.0))


D_SMALL = 128
OTHERS: dict[str, str] = {
    "ffnn": "FFNN 5-gram (4 x emb 128 -> tanh 256)",
    "rnn": "Elman RNN 1x128 tied",
    "gru": "GRU 1x128 tied",
    "transformer": "Transformer 2L d128 4h ctx 64 tied",
}


def other_model(name: str, vocab: int, epochs: int) -> NeuralLM:
    """The smaller architectures at their stated budgets (AdamW, cosine)."""
    d = D_SMALL
    common = dict(epochs=epochs, batch_size=20, bptt=35, device="cpu", log_every_s=60.0)
    if name == "ffnn":
        return FFNNLM(FFNNConfig(vocab, context_size=4, emb_dim=d, hidden_dim=256, dropout=0.2),
                      TrainConfig(lr=2e-3, weight_decay=0.01, **common))
    if name in ("rnn", "gru"):
        return RNNLM(RNNConfig(vocab, cell=name, emb_dim=d, hidden_dim=d, num_layers=1, dropout=0.2,
                               tie_weights=True), TrainConfig(lr=2e-3 if name == "rnn" else 3e-3, **common))
    return TransformerLM(TransformerConfig(vocab, max_len=64, d_model=d, n_layers=2, n_heads=4, dropout=0.1),
                         TrainConfig(**{**common, "bptt": 64}, lr=3e-3, warmup_steps=10, weight_decay=0.01))


def job(name: str, epochs: int, limit_lines: int | None, threads: int) -> dict:
    """Train one model on the benchmark split; held-out perplexity, training tokens/s, parameters, seconds."""
    torch.set_num_threads(threads)
    train, test, vocab = load_wikitext(limit_lines)
    start = time.perf_counter()
    if name == "lstm_race":
        return {**lstm_race(train, test, vocab, epochs), "seconds": time.perf_counter() - start}
    ppl, tps, n = _fit(other_model(name, vocab, epochs), train, test)
    return {"ppl": ppl, "tps": tps, "params": n, "seconds": time.perf_counter() - start}


def run_jobs(jobs: list[tuple[str, int]], limit_lines: int | None, threads: int, parallel: bool
             ) -> dict[str, dict]:
    """Run (name, epochs) jobs; parallel: two at a time in spawned processes (the LSTM race in one, the other
    architectures one after another in the second)."""
    if not parallel:
        return {name: job(name, epochs, limit_lines, threads) for name, epochs in jobs}
    with ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {name: pool.submit(job, name, epochs, limit_lines, threads) for name, epochs in jobs}
        return {name: f.result() for name, f in futures.items()}


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
    threads = 1  # ours and the reference alike; on 2 busy cores, 2 OpenMP threads spin-wait (3x slower)
    torch.set_num_threads(threads)
    limit = 40 if quick else None
    train, test, vocab = load_wikitext(limit_lines=limit)
    n_train = sum(len(s) + 1 for s in train)
    lstm_epochs, small_epochs = (1, 1) if quick else (LSTM_EPOCHS, SMALL_EPOCHS)
    load = os.getloadavg()[0]
    data_note = f"WikiText-2 valid: {len(train)} train lines ({n_train} tokens), {len(test)} held-out lines, V={vocab}"
    rows: list[Row] = []

    # -- KN3 / KN5 on the same split (modified Kneser-Ney, per-sentence context, words + </s> counted) ---------
    for order in (3, 5):
        kn = NgramLM(order=order, vocab_size=vocab).fit(train)
        rows.append(Row(NAME, f"KN{order} modified Kneser-Ney (count tables, no parameters trained)",
                        "held-out perplexity", kn.perplexity(test), higher_is_better=False,
                        notes=f"{data_note}; context restarts at each line (n-gram), neural rows carry it"))

    # -- LSTM 2x200 vs the reference recipe, trained at the same time; then the others, two at a time ---------
    jobs = [("lstm_race", lstm_epochs)] + [(name, small_epochs) for name in OTHERS]
    start = time.perf_counter()
    results = run_jobs(jobs, limit, threads, parallel=not quick)
    wall = time.perf_counter() - start
    ref, ours = results["lstm_race"]["reference"], results["lstm_race"]["ours"]
    case = (f"LSTM 2x200 emb 200 untied ({ours['params'] / 1e6:.2f}M params, reference {ref['params'] / 1e6:.2f}M), "
            f"bptt 35, batch 20, {lstm_epochs} epoch(s)")
    note = (f"{data_note}; both SGD lr 20, clip 0.25, dropout 0.2, same init; ours cosine to lr 1, reference constant"
            f" lr; trained interleaved step for step in one process, {threads} torch thread; load avg at start "
            f"{load:.1f}; all {len(jobs)} neural jobs {wall / 60:.1f} min wall")
    rows.append(Row(NAME, case, "held-out perplexity", ours["ppl"], ref["ppl"], "reference nn.LSTM word_language_model",
                    higher_is_better=False, target="ratio <= 1", met=ours["ppl"] <= ref["ppl"], notes=note))
    rows.append(Row(NAME, case, "train tokens/s", ours["tps"], ref["tps"], "reference nn.LSTM word_language_model",
                    target="ratio >= 1", met=ours["tps"] >= ref["tps"], notes=note))

    # -- the other architectures at stated budgets --------------------------------------------
    for name, label in OTHERS.items():
        r = results[name]
        rows.append(Row(NAME, f"{label}, {r['params'] / 1e6:.2f}M params, {small_epochs} epoch(s)",
                        "held-out perplexity", r["ppl"], ref["ppl"], f"reference LSTM 2x200 ({lstm_epochs} epochs)",
                        higher_is_better=False,
                        notes=f"{data_note}; AdamW cosine; {r['tps']:.0f} train tokens/s ({threads} thread, "
                              f"alongside another job)"))

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
