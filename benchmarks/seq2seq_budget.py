"""What a larger CPU budget reaches: the GRU + additive attention of `benchmarks/seq2seq.py` (same data, vocabulary,
sizes and learning rate) trained for `EPOCHS` epochs instead of one, scored once on test (greedy and beam 5,
single- and multi-reference BLEU). Fixed before the run, nothing tuned on test. Training seconds are on the
shared 2-core machine (other engineers' jobs running), one thread."""

from __future__ import annotations

import time

import torch
from lexiflow.models.bleu import corpus_bleu

from benchmarks.harness import Row
from benchmarks.seq2seq import VOCAB, H, load, ours, references

NAME = "seq2seq_budget"
EPOCHS = 3


def run(quick: bool = False) -> list[Row]:
    torch.set_num_threads(1)
    data = load(quick)
    tr = ours("rnn", epochs=EPOCHS)
    t0 = time.perf_counter()
    tr.fit(*data["train"], valid=data["valid"])
    seconds = time.perf_counter() - t0
    case = f"GRU + additive attention, H={H}, vocab {VOCAB}/side, {EPOCHS} epochs ({seconds / 60:.0f} min, 1 thread)"
    rows = []
    for split in ("valid", "test"):
        src, tgt = data[split]
        single, multi = references(src, tgt)
        for beam in (1, 5):
            hyps = tr.translate(src, beam_width=beam)
            for name, refs in (("single", single), ("multi", multi)):
                rows.append(Row(NAME, case, f"{'dev' if split == 'valid' else 'test'} BLEU ({name}-reference, "
                                            f"{'greedy' if beam == 1 else 'beam 5'})", corpus_bleu(hyps, refs).score,
                                target=">= 30" if split == "test" and name == "single" else ""))
    rows.append(Row(NAME, case, "valid perplexity per epoch", tr.history_[-1]["valid_ppl"],
                    notes=", ".join(f"{r['valid_ppl']:.1f}" for r in tr.history_)))
    return rows
