"""LoRA's sweep: which layers it adapts, its rank, α, learning rate and epochs, against full fine-tuning, on EWT
dev UPOS accuracy (the finetune benchmark's seeded 500-sentence sample; EWT test is never read).

One body for every run: the finetune benchmark's encoder pretrained once with the recipe (PretrainParams'
defaults, MLM seed 0), kept in a scratch folder between runs. Each run fine-tunes it through the pipeline's code
(`models.finetune.prepare` and the one training loop) in a process of one thread. `full` trains every weight;
`frozen-embedding` trains every weight but the token embedding: how much of full fine-tuning's lead the embedding
is. The winner becomes FineTuneConfig's defaults (docs/pretraining.md).

Options: runs=TARGETS:RANK:ALPHA:LR:FRACTION:EPOCHS[:SEED],... (SEED: the fine-tuning seed, 0 unless given;
TARGETS: attention, linear, all, full, frozen-embedding or embedding-only (the token embedding and the head); RANK
and ALPHA are ignored by the last three; a LoRA target with "+norms", e.g. all+norms, also trains the LayerNorms
and the biases, with "+embfull" the whole token embedding; any target with "+nodrop" trains the body without
dropout (FineTuneConfig's LoRA default; without it, the body keeps its 0.1); RANK r/r_e gives the embedding its own
rank), workers=2.
"""

from __future__ import annotations

import dataclasses
import tempfile
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import torch
from lexiflow.models.encoder import EncoderConfig, EncoderModel
from lexiflow.models.finetune import (
    Classifier,
    ClassifyTask,
    FineTuneConfig,
    accuracy,
    parameter_counts,
    prepare,
    training_ids,
)
from lexiflow.models.lm.train import TrainConfig, Trainer

from benchmarks.finetune import (
    DEV_SENTENCES,
    EWT,
    PATIENCE,
    RECIPE,
    SIZE,
    TASKS,
    _threads,
    ewt_examples,
    label_fraction,
    numpy_state,
    pretrain_mlm,
    pretraining_data,
)
from benchmarks.harness import Row

DEFAULT_RUNS = ("full:0:0:1e-3:1.0:4,frozen-embedding:0:0:1e-3:1.0:4,all:8/7:64:3e-3:1.0:4,"
                "all+nodrop:8/7:64:3e-3:1.0:4,all+nodrop:8/7:64:3e-3:0.1:10")


def pretrained_body(quick: bool) -> tuple[EncoderConfig, dict]:
    """The recipe's MLM body (seed 0) and its config, pretrained once per setting and kept in /tmp."""
    tok, train_ids, held_ids = pretraining_data(quick)
    config = EncoderConfig(vocab_size=len(tok), d_ff=RECIPE.d_ff, dropout=RECIPE.dropout, **SIZE)
    steps = 40 if quick else RECIPE.max_steps
    path = Path(tempfile.gettempdir()) / f"lexiflow-bench-mlm-{len(tok)}-{steps}-{RECIPE.lr:g}-{config.init}.pt"
    if not path.exists():
        state = numpy_state(pretrain_mlm(config, train_ids, held_ids, lr=RECIPE.lr, steps=steps, quick=quick).model)
        torch.save(state, path.with_suffix(".tmp"))
        path.with_suffix(".tmp").replace(path)  # complete or absent
    return config, torch.load(path, weights_only=False)


def sweep_job(spec: str, quick: bool) -> dict:
    _threads()
    targets, rank, alpha, lr, fraction, epochs, seed = (spec + ":0").split(":")[:7]
    config, state = pretrained_body(quick)
    tok = pretraining_data(quick)[0]
    labels = TASKS["upos"]
    data = {split: ewt_examples(EWT / f"en_ewt-ud-{split}.conllu", tok, "upos", labels, max_len=SIZE["max_len"])
            [:600 if quick else None] for split in ("train", "dev")}
    dev = label_fraction(data["dev"], min(1.0, DEV_SENTENCES / len(data["dev"])), seed=1)
    train = label_fraction(data["train"], float(fraction))
    no_dropout = "+nodrop" in targets  # the body without dropout (the head keeps its own)
    targets = targets.replace("+nodrop", "")
    torch.manual_seed(int(seed))
    body = EncoderModel(dataclasses.replace(config, dropout=0.0) if no_dropout else config)
    body.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
    model = Classifier(body, "token", len(labels))
    norms = targets.endswith("+norms")
    targets = targets.removesuffix("+norms")
    emb_full = targets.endswith("+embfull")  # diagnostic: the token embedding trains in full
    targets = targets.removesuffix("+embfull")
    if targets in ("attention", "linear", "all"):
        linear_rank, _, embedding_rank = rank.partition("/")  # RANK: r, or r/r_e for the embedding's own rank
        prepare(model, FineTuneConfig(mode="lora", lora_rank=int(linear_rank), lora_alpha=float(alpha),
                                      lora_embedding_rank=int(embedding_rank or linear_rank), lora_targets=targets,
                                      lora_body_dropout=0.0 if no_dropout else config.dropout),
                training_ids(train))
        if norms:
            for m in body.modules():
                if isinstance(m, torch.nn.LayerNorm):
                    m.requires_grad_(True)
                if isinstance(m, torch.nn.Linear) and m.bias is not None:
                    m.bias.requires_grad_(True)
        if emb_full:  # with "all", its LoRA factors train too
            body.embed.token.requires_grad_(True)
    elif targets == "embedding-only":  # diagnostic: the token embedding and the head train, nothing else
        body.requires_grad_(False)
        body.embed.token.requires_grad_(True)
    elif targets == "frozen-embedding":
        body.embed.token.requires_grad_(False)
    cfg = TrainConfig(epochs=1 if quick else int(epochs), batch_size=32, lr=float(lr),
                      warmup_steps=min(100, len(train) // 8), clip_grad_norm=1.0, checkpoint_every=0,
                      patience=PATIENCE, log_every_s=600, seed=int(seed))
    counts = parameter_counts(model)
    history = Trainer(model, ClassifyTask(train, dev, cfg), cfg, name=f"lora_sweep.{targets}").run()
    return {"spec": spec, "dev": accuracy(model, dev), "epochs": len(history),
            "share": counts["trainable"] / counts["total"], "dev_loss": min(h["valid_loss"] for h in history)}


def run(quick: bool = False, runs: str = DEFAULT_RUNS, workers: str = "2") -> list[Row]:
    pretrained_body(quick)  # once, before the workers read it
    specs = runs.split(",")
    with ProcessPoolExecutor(int(workers), mp_context=get_context("spawn")) as pool:
        done = list(pool.map(sweep_job, specs, [quick] * len(specs)))
    rows = []
    for m in done:
        targets, rank, alpha, lr, fraction, _, *seed = m["spec"].split(":")
        what = targets if targets in ("full", "frozen-embedding", "embedding-only") else \
            f"LoRA {targets}, r {rank}, α {alpha}"
        rows.append(Row("lora_sweep", f"{what}, lr {lr}, {float(fraction):.0%} of EWT train" +
                        "".join(f", seed {s}" for s in seed),
                        "EWT dev UPOS accuracy", m["dev"],
                        notes=f"{100 * m['share']:.2f} % trainable; {m['epochs']} epochs; best dev loss "
                              f"{m['dev_loss']:.4f}"))
    return rows
