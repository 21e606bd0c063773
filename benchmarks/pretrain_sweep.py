"""The masked-LM recipe's sweep: peak learning rate, step budget and initialisation, chosen on the held-out
[MASK] loss of the finetune benchmark's corpus (its valid split; EWT dev and test are never read).

Each run pretrains the finetune benchmark's encoder (`benchmarks.finetune.pretrain_mlm`: the same batches,
masks and schedule) in a process of one thread; the table gives the held-out loss over all chosen positions, the
[MASK] perplexity beside the unigram one, and tokens/s. The winner becomes PretrainParams' defaults, which the
benchmark and the pipeline read (one set of numbers).

Options: lrs=3e-4,1e-3,2e-3,3e-3  steps=1000  inits=bert,torch  workers=2  (comma-separated grids; every
combination runs), or runs=bert:3e-4:4000,torch:1e-3:4000 (init:lr:steps, those runs only).
"""

from __future__ import annotations

import itertools
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

from lexiflow.models.encoder import EncoderConfig

from benchmarks.finetune import RECIPE, SIZE, pretrain_mlm, pretraining_data
from benchmarks.harness import Row


def sweep_job(config: EncoderConfig, train_ids, held_ids, lr: float, steps: int, quick: bool) -> dict:
    mlm = pretrain_mlm(config, train_ids, held_ids, lr=lr, steps=steps, quick=quick)
    return {"init": config.init, "lr": lr, "steps": steps, **mlm.metrics}


def run(quick: bool = False, lrs: str = "3e-4,1e-3,2e-3,3e-3", steps: str = "1000", inits: str = "bert,torch",
        workers: str = "2", runs: str = "") -> list[Row]:
    tok, train_ids, held_ids = pretraining_data(quick)
    grid = [(init, float(lr), int(n)) for init, lr, n in (r.split(":") for r in runs.split(","))] if runs else \
        list(itertools.product(inits.split(","), map(float, lrs.split(",")), map(int, steps.split(","))))
    with ProcessPoolExecutor(int(workers), mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(sweep_job, EncoderConfig(vocab_size=len(tok), d_ff=RECIPE.d_ff, init=init, **SIZE),
                               train_ids, held_ids, lr, 40 if quick else n, quick) for init, lr, n in grid]
        done = [f.result() for f in futures]
    best = min(done, key=lambda m: m["masked_lm_loss"])
    rows = []
    for m in done:
        case = f"init {m['init']}, lr {m['lr']:g}, {m['steps']} steps of {RECIPE.batch_size} lines"
        notes = (f"held-out [MASK] perplexity {m['mask_perplexity']:.1f} against unigram "
                 f"{m['unigram_perplexity']:.1f}; "
                 f"[MASK] accuracy {m['mask_accuracy']:.3f}; {m['tokens_per_s']:.0f} tokens/s (1 thread)")
        rows.append(Row("pretrain_sweep", case, "held-out masked-LM loss", m["masked_lm_loss"], higher_is_better=False,
                        target="lowest", met=m is best, notes=notes))
        rows.append(Row("pretrain_sweep", case, "[MASK] perplexity / unigram", m["mask_perplexity"],
                        m["unigram_perplexity"], "held-out unigram", higher_is_better=False))
    return rows
