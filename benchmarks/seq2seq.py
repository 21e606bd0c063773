"""Sequence to sequence on Tatoeba English -> French: BLEU (test, once), training tokens/s, decoding sentences/s.

Data: `../shared/data/tatoeba-eng-fra/` through `models.parallel.read_parallel` (train 64.5k / dev 4.0k /
test 3.8k pairs; all translations of an English sentence are in one split). Word tokenizers, the
`VOCAB` most frequent words per side (rarer words are <unk>), the same for every model. BLEU is
sacreBLEU-equal corpus BLEU (13a) of detokenised output, against the one reference of each pair
("single") and against every translation of the source sentence in that split ("multi", Tatoeba holds
several for many sentences); `test` is scored once per model, after training, with nothing tuned on it.
Nothing was tuned: sizes, learning rates and epochs were fixed before the first run from the CPU
budget (see docs/seq2seq.md); beam α = 1 (the notes' average log-probability).

Rows:
- GRU + additive attention, ours (`Translator("rnn")`) vs a reference written from the PyTorch seq2seq
  tutorial's design (EncoderRNN; AttnDecoderRNN with BahdanauAttention: the previous decoder state
  scores the encoder states, the context is fed into the GRU with the embedding, a Python loop over
  target steps), same data, batches, vocabulary, sizes (emb = hidden = H, 1 layer) and epochs. The two
  train interleaved step for step in one process with one thread (after each of our optimizer steps the
  reference takes one; each clock counts only its own steps), so the machine's load falls on both alike.
  The reference uses Adam at lr 1e-3 (the tutorial's) with padding masked in its attention and loss.
- attention vs none, Transformer vs GRU + attention: same epochs, in a second process.
- beam 5 vs greedy on test; decoding sentences/s (batch 64, one thread).
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import torch
import torch.nn.functional as F
from lexiflow.models.bleu import corpus_bleu
from lexiflow.models.lm.train import IGNORE, TrainConfig
from lexiflow.models.parallel import read_parallel
from lexiflow.models.seq2seq.rnn import RNNSeq2SeqConfig
from lexiflow.models.seq2seq.transformer import TransformerSeq2SeqConfig
from lexiflow.models.seq2seq.translator import (
    Codec,
    Seq2SeqTask,
    TokenizerConfig,
    Translator,
    count_parameters,
    pad_batch,
)
from torch import nn

from benchmarks.harness import SHARED_DATA, Interleaved, Row

NAME = "seq2seq"
DATA = SHARED_DATA / "tatoeba-eng-fra"
VOCAB, H, EPOCHS, BATCH = 6000, 256, 1, 64  # sized for ~1 h of 2 busy shared cores (see the docstring)


def load(quick: bool) -> dict[str, tuple[list[str], list[str]]]:
    corpus = read_parallel([str(DATA)])
    splits = {s: corpus.split(s) for s in ("train", "valid", "test")}
    if quick:
        splits = {s: (a[:2000], b[:2000]) if s == "train" else (a[:200], b[:200]) for s, (a, b) in splits.items()}
    return splits


def references(src: list[str], tgt: list[str]) -> tuple[list[list[str]], list[list[str | None]]]:
    """(single: [tgt]) and (multi: every translation of the same source, as reference streams)."""
    by_source: dict[str, list[str]] = defaultdict(list)
    for s, t in zip(src, tgt, strict=True):
        by_source[s].append(t)
    width = max(len(v) for v in by_source.values())
    multi = [[by_source[s][k] if k < len(by_source[s]) else None for s in src] for k in range(width)]
    return [list(tgt)], multi


def train_config(lr: float, epochs: int, warmup: int = 100) -> TrainConfig:
    return TrainConfig(epochs=epochs, batch_size=BATCH, lr=lr, warmup_steps=warmup, clip_grad_norm=1.0,
                       device="cpu", log_every_s=60)


def ours(kind: str, attention: str = "additive", epochs: int = EPOCHS) -> Translator:
    tok = TokenizerConfig("word", VOCAB)
    if kind == "rnn":
        return Translator("rnn", RNNSeq2SeqConfig(0, 0, emb_dim=H, hidden_dim=H, attention=attention, dropout=0.2),
                          tok, train_config(2e-3, epochs))
    return Translator("transformer", TransformerSeq2SeqConfig(0, 0, d_model=H, n_heads=4, d_ff=2 * H, encoder_layers=2,
                                                              decoder_layers=2, dropout=0.1, norm="pre"),
                      tok, train_config(1e-3, epochs, warmup=200))


# ---------------------------------------------------------------------------------------------
# the reference: the PyTorch seq2seq tutorial's GRU encoder + Bahdanau-attention GRU decoder


class RefEncoder(nn.Module):
    def __init__(self, V: int, hidden: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.embedding = nn.Embedding(V, hidden)
        self.gru = nn.GRU(hidden, hidden, batch_first=True)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.gru(self.dropout(self.embedding(x)))


class RefBahdanau(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.Wa, self.Ua, self.Va = nn.Linear(hidden, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, 1)

    def forward(self, query, keys, mask):
        scores = self.Va(torch.tanh(self.Wa(query) + self.Ua(keys))).squeeze(2).unsqueeze(1)  # (B, 1, S)
        weights = F.softmax(scores.masked_fill(~mask[:, None, :], -1e9), dim=-1)
        return torch.bmm(weights, keys), weights


class RefDecoder(nn.Module):
    def __init__(self, hidden: int, V: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.embedding = nn.Embedding(V, hidden)
        self.attention = RefBahdanau(hidden)
        self.gru = nn.GRU(2 * hidden, hidden, batch_first=True)
        self.out = nn.Linear(hidden, V)
        self.dropout = nn.Dropout(dropout)

    def step(self, tokens, hidden, enc_out, mask):
        embedded = self.dropout(self.embedding(tokens))  # (B, 1, H)
        context, _ = self.attention(hidden.permute(1, 0, 2), enc_out, mask)
        output, hidden = self.gru(torch.cat((embedded, context), dim=2), hidden)
        return self.out(output), hidden

    def forward(self, enc_out, enc_hidden, tgt_in, mask):  # teacher forcing, one step at a time
        hidden, outs = enc_hidden, []
        for t in range(tgt_in.shape[1]):
            out, hidden = self.step(tgt_in[:, t:t + 1], hidden, enc_out, mask)
            outs.append(out)
        return torch.cat(outs, dim=1)


class ReferenceTrainer:
    """Trains the reference on our task's batches, one step per call; tokens counted as ours are."""

    def __init__(self, task: Seq2SeqTask, V_src: int, V_tgt: int, epochs: int) -> None:
        torch.manual_seed(0)
        self.enc, self.dec = RefEncoder(V_src, H), RefDecoder(H, V_tgt)
        self.opt = torch.optim.Adam([*self.enc.parameters(), *self.dec.parameters()], lr=1e-3)
        self.task = task
        self.queue = [b for e in range(epochs) for b in task.epoch_batches(e)]
        self.seconds, self.tokens = 0.0, 0

    @property
    def done(self) -> bool:
        return not self.queue

    def step(self) -> None:
        t0 = time.perf_counter()
        batch = self.queue.pop(0)
        src, mask, tgt_in, tgt_out = self.task.tensors([self.task.src[i] for i in batch],
                                                       [self.task.tgt[i] for i in batch], torch.device("cpu"))
        enc_out, enc_hidden = self.enc(src)
        logits = self.dec(enc_out, enc_hidden, tgt_in, mask)
        loss = F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=IGNORE)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.tokens += int(mask.sum()) + int((tgt_out != IGNORE).sum())
        self.seconds += time.perf_counter() - t0

    @torch.no_grad()
    def translate(self, src_ids: list[np.ndarray], codec: Codec, bos: int, eos: int, pad: int) -> list[str]:
        self.enc.eval()
        self.dec.eval()
        out = [""] * len(src_ids)
        order = sorted(range(len(src_ids)), key=lambda i: len(src_ids[i]))
        for p in range(0, len(order), 64):
            part = order[p:p + 64]
            src = pad_batch([src_ids[i] if len(src_ids[i]) else np.array([0]) for i in part], pad)
            mask = src != pad
            enc_out, hidden = self.enc(src)
            tokens = torch.full((len(part), 1), bos)
            gen = []
            for _ in range(int(src.shape[1] * 1.5 + 5)):
                logits, hidden = self.dec.step(tokens, hidden, enc_out, mask)
                tokens = logits.argmax(-1)
                gen.append(tokens)
            ids = torch.cat(gen, 1).tolist()
            for i, row in zip(part, ids, strict=True):
                out[i] = codec.decode(row[: row.index(eos)] if eos in row else row)
        return out


# ---------------------------------------------------------------------------------------------


def _bleu_rows(case: str, tr_or_hyps, data, peer=None, peer_name="", target="", notes="") -> list[Row]:
    rows = []
    for split in ("valid", "test"):
        src, tgt = data[split]
        single, multi = references(src, tgt)
        hyps = tr_or_hyps[split] if isinstance(tr_or_hyps, dict) else tr_or_hyps.translate(src)
        for name, refs in (("single", single), ("multi", multi)):
            score = corpus_bleu(hyps, refs).score
            p = peer[split][name] if peer else None
            rows.append(Row(NAME, case, f"{'dev' if split == 'valid' else 'test'} BLEU ({name}-reference, greedy)",
                            score, p, peer_name, target=target if split == "test" and name == "single" else "",
                            met=(score >= p) if p is not None and split == "test" and name == "single" else None,
                            notes=notes))
    return rows


def _tps(tr: Translator, minus: float = 0.0) -> float:
    tokens = sum(r["tokens_per_s"] * r["seconds"] for r in tr.history_)
    return tokens / (sum(r["seconds"] for r in tr.history_) - minus)


def race(data) -> dict:
    """Ours (GRU + additive) and the reference, interleaved step for step in this process."""
    torch.set_num_threads(1)
    src, tgt = data["train"]
    tok = TokenizerConfig("word", VOCAB)
    sc, tc = Codec.fit(tok, src), Codec.fit(tok, tgt)  # what Translator.fit builds (deterministic)
    s_ids, t_ids = sc.encode(src), tc.encode(tgt)
    keep = [i for i in range(len(s_ids)) if len(s_ids[i]) and len(t_ids[i])]
    task = Seq2SeqTask([s_ids[i] for i in keep], [t_ids[i] for i in keep], None, train_config(2e-3, EPOCHS),
                       bos_id=1, eos_id=2, pad_id=3)
    ref = ReferenceTrainer(task, len(sc), len(tc), EPOCHS)
    interleaved = Interleaved(ref)
    tr = ours("rnn").fit(src, tgt, on_step=interleaved)
    interleaved.finish()
    ref_hyps = {s: ref.translate(sc.encode(data[s][0]), tc, 1, 2, 3) for s in ("valid", "test")}
    ref_bleu = {s: {n: corpus_bleu(ref_hyps[s], r).score for n, r in zip(("single", "multi"),
                                                                         references(*data[s]), strict=True)}
                for s in ("valid", "test")}
    return {"ours": tr, "ours_tps": _tps(tr, interleaved.inside), "ref_hyps": ref_hyps, "ref_bleu": ref_bleu,
            "ref_tps": ref.tokens / ref.seconds,
            "params": (count_parameters(tr.module_),
                       count_parameters(ref.enc) + count_parameters(ref.dec))}


def job(name: str, quick: bool) -> dict:
    """One of our models trained alone (a spawned process: one thread)."""
    torch.set_num_threads(1)
    data = load(quick)
    tr = ours(*name.split(":"))
    t0 = time.perf_counter()
    tr.fit(*data["train"])
    seconds = time.perf_counter() - t0
    out = {"tps": _tps(tr), "seconds": seconds, "params": count_parameters(tr.module_), "hyps": {}, "beam": {}}
    for split in ("valid", "test"):
        t0 = time.perf_counter()
        out["hyps"][split] = tr.translate(data[split][0])
        out[f"greedy_sps_{split}"] = len(data[split][0]) / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    out["beam"]["test"] = tr.translate(data["test"][0], beam_width=5)
    out["beam_sps"] = len(data["test"][0]) / (time.perf_counter() - t0)
    return out


def run(quick: bool = False) -> list[Row]:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    data = load(quick)
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        others = {n: pool.submit(job, n, quick) for n in ("rnn:none", "transformer")}
        r = race(data)
        results = {n: f.result() for n, f in others.items()}
    rows: list[Row] = []
    budget = f"{EPOCHS} epoch(s) of {len(data['train'][0])} pairs, batch {BATCH}, vocab {VOCAB}/side, H={H}"
    tr = r["ours"]
    ours_hyps = {s: tr.translate(data[s][0]) for s in ("valid", "test")}
    rows += _bleu_rows(f"GRU + additive attention, ours ({r['params'][0] / 1e6:.1f}M params) vs tutorial reference "
                       f"({r['params'][1] / 1e6:.1f}M); {budget}", ours_hyps, data, r["ref_bleu"],
                       "PyTorch seq2seq tutorial design (GRU + Bahdanau)", target=">= reference")
    rows.append(Row(NAME, "GRU + additive attention, training", "train tokens/s (src + tgt)", r["ours_tps"],
                    r["ref_tps"], "PyTorch seq2seq tutorial design", target="ratio >= 1",
                    met=r["ours_tps"] >= r["ref_tps"], notes="interleaved step for step, one thread, shared CPU"))
    none = results["rnn:none"]
    rows += _bleu_rows(f"GRU without attention (c = final encoder state), {budget}", none["hyps"], data)
    t = results["transformer"]
    rows += _bleu_rows(f"Transformer 2+2 layers d={H} pre-norm ({t['params'] / 1e6:.1f}M params), {budget}",
                       t["hyps"], data)
    single_test = {"attention": corpus_bleu(ours_hyps["test"], [data["test"][1]]).score,
                   "none": corpus_bleu(none["hyps"]["test"], [data["test"][1]]).score}
    rows.append(Row(NAME, "attention vs none (GRU, same budget)", "test BLEU difference (single-reference)",
                    single_test["attention"] - single_test["none"], target="> 0 by a clear margin",
                    met=single_test["attention"] - single_test["none"] > 2.0))
    for name, res in (("Transformer", t), ("GRU without attention", none)):
        rows.append(Row(NAME, f"{name}: beam 5 vs greedy", "test BLEU (single-reference)",
                        corpus_bleu(res["beam"]["test"], [data["test"][1]]).score,
                        corpus_bleu(res["hyps"]["test"], [data["test"][1]]).score, "greedy"))
        rows.append(Row(NAME, f"{name}: decoding, batch 64, one thread", "test sentences/s (beam 5 vs greedy)",
                        res["beam_sps"], res["greedy_sps_test"], "greedy"))
        rows.append(Row(NAME, f"{name}: training", "train tokens/s (src + tgt)", res["tps"],
                        notes="alone in a second process, one thread, shared CPU"))
    t0 = time.perf_counter()
    beam = tr.translate(data["test"][0], beam_width=5)
    beam_sps = len(beam) / (time.perf_counter() - t0)
    rows.append(Row(NAME, "GRU + additive: beam 5 vs greedy", "test BLEU (single-reference)",
                    corpus_bleu(beam, [data["test"][1]]).score, corpus_bleu(ours_hyps["test"], [data["test"][1]]).score,
                    "greedy"))
    rows.append(Row(NAME, "GRU + additive: decoding, batch 64, one thread", "test sentences/s (beam 5)", beam_sps))
    best = max(r_.ours for r_ in rows if r_.metric.startswith("test BLEU (single"))
    rows.append(Row(NAME, f"best test BLEU (single-reference) at this CPU budget ({budget})", "test BLEU", best,
                    target=">= 30", met=best >= 30))
    return rows
