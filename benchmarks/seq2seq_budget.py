"""Which CPU budget reaches BLEU 30 on Tatoeba English -> French: the Transformer's learning curve.

The same data, vocabulary and Transformer as `python -m benchmarks seq2seq` (2+2 layers, d=256,
pre-norm, lr 1e-3, batch 64), trained for up to `EPOCHS` epochs on one thread with early stopping on
dev loss (patience 2). After every epoch the model translates dev greedily: the row is dev BLEU
against the training minutes so far (the dev translation time is not counted). Dev picks the budget;
test is translated once, after training, greedy and beam 5 (α = 1), with the weights of the best dev
loss. Nothing is tuned on test.
"""

from __future__ import annotations

import os
import time

import torch
from lexiflow.models.bleu import corpus_bleu

from benchmarks.harness import Row
from benchmarks.seq2seq import BATCH, VOCAB, H, load, ours, references

NAME = "seq2seq_budget"
EPOCHS = 6


def run(quick: bool = False) -> list[Row]:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    data = load(quick)
    epochs = 2 if quick else EPOCHS
    tr = ours("transformer", epochs=epochs)
    tr.train.patience = 2
    tr.train.device = "auto"  # CUDA when present: this command measures a GPU too
    src, tgt = data["train"]
    per_epoch = -(-len(src) // BATCH)  # batches of BATCH pairs (a few empty pairs are dropped: within one batch)
    dev_src, dev_tgt = data["valid"]
    dev_refs = references(dev_src, dev_tgt)
    curve: list[tuple[int, float, float, float]] = []  # epoch, training minutes, dev BLEU single, multi
    clock = {"start": time.perf_counter(), "eval": 0.0}

    def after_step(step: int, _loss: float) -> None:
        if step % per_epoch:
            return
        t0 = time.perf_counter()
        tr.device_ = next(tr.module_.parameters()).device  # set by fit once training ends
        hyps = tr.translate(dev_src)
        tr.module_.train()
        single, multi = (corpus_bleu(hyps, refs).score for refs in dev_refs)
        minutes = (t0 - clock["start"] - clock["eval"]) / 60
        curve.append((step // per_epoch, minutes, single, multi))
        clock["eval"] += time.perf_counter() - t0
        print(f"epoch {step // per_epoch}: {minutes:.1f} min, dev BLEU {single:.2f} / {multi:.2f}", flush=True)

    tr.fit(src, tgt, valid=(dev_src, dev_tgt), on_step=after_step)
    budget = f"Transformer 2+2 d={H}, batch {BATCH}, vocab {VOCAB}/side, one thread"
    rows = [Row(NAME, f"{budget}: after {e} epoch(s), {m:.1f} CPU-minutes", "dev BLEU (single / multi-reference, "
                "greedy)", s, notes=f"multi-reference {mu:.2f}") for e, m, s, mu in curve]
    best_epoch = min(tr.history_, key=lambda r: r["valid_loss"])["epoch"]
    test_src, test_tgt = data["test"]
    for beam in (1, 5):
        score = corpus_bleu(tr.translate(test_src, beam_width=beam), [test_tgt]).score
        rows.append(Row(NAME, f"{budget}: best dev loss at epoch {best_epoch} of {len(tr.history_)} "
                        f"({curve[-1][1]:.1f} CPU-minutes in all)", f"test BLEU (single-reference, "
                        f"{'greedy' if beam == 1 else 'beam 5'})", score, target=">= 30", met=score >= 30))
    return rows
