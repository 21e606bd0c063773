"""Pretraining and fine-tuning with few labels: does an MLM-pretrained encoder (and a GPT-style LM) beat the same
network from scratch on EWT UPOS tagging and EWT genre classification when fine-tuned on 1 %, 10 % and 100 % of EWT
train; how close LoRA, adapters and a frozen body come to full fine-tuning.

Pretraining corpus: every English text reachable offline (`pretraining_sources`), ingested as the pipeline does
(lowercased, sentence-split, deduplicated, hashed train/valid/test split of the documents); its valid split is
the MLM's and the LM's held-out set. EWT dev and test and Tatoeba dev and test are never pretrained on. One
WordPiece vocabulary (learned on the pretraining train text) serves the encoder, the decoder LM and fine-tuning.
The vocabulary size and the model were chosen on held-out masked-LM loss (docs/pretraining.md), not on EWT.
Fine-tuning: a nested seeded share of EWT train (`label_fraction`); early stopping on the loss of the first
DEV_SENTENCES dev sentences; LoRA's learning rate chosen on that dev accuracy; test scored once per
configuration, for the chosen run. CPU figures, one thread per worker.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import torch
from gensim.test.utils import datapath
from lexiflow.models.encoder import BERT_SPECIALS, EncoderConfig, EncoderModel, MaskedLM
from lexiflow.models.finetune import (
    GENRES,
    UPOS_TAGS,
    Classifier,
    FineTuneConfig,
    accuracy,
    ewt_examples,
    finetune,
    label_fraction,
    merge_lora,
    prepare,
)
from lexiflow.models.ingest import IngestOptions, build_corpus, resolve_sources
from lexiflow.models.lm.train import TrainConfig
from lexiflow.models.lm.transformer import Transformer, TransformerConfig, TransformerLM
from lexiflow.models.tokenizers.wordpiece import WordPiece

from benchmarks.harness import RESULTS_DIR, SHARED_DATA, Row

EWT = SHARED_DATA / "ud-english-ewt"
TASKS = {"upos": UPOS_TAGS, "genre": GENRES}
FRACTIONS = (0.01, 0.1, 1.0)
# Budget, sized to what the shared 2-core machine could run in an hour (~450 tokens/s a worker under load; ~6M
# tokens in all, a quarter hour of one free core): MLM steps of MLM_BATCH lines and GPT-style LM steps of 16 x 128
# tokens, each in its own worker while the from-scratch runs fine-tune in a third; per label share the
# fine-tuning epochs (early stopping on dev keeps the best epoch). A bigger machine sets more from the
# environment, e.g. FINETUNE_STEPS=20000,20000 FINETUNE_EPOCHS=40,12,3 python -m benchmarks finetune.
MLM_STEPS, LM_STEPS = (int(n) for n in os.environ.get("FINETUNE_STEPS", "800,150").split(","))
MLM_BATCH = 32
FT_EPOCHS = dict(zip((0.01, 0.1, 1.0), (int(n) for n in os.environ.get("FINETUNE_EPOCHS", "15,4,1").split(",")),
                     strict=True))
PATIENCE = 3
DEV_SENTENCES = 200  # early stopping and the learning-rate choice read this many dev sentences
WORKERS = int(os.environ.get("FINETUNE_WORKERS", "3"))  # processes of one thread each
# Vocabulary and model: chosen on held-out masked-LM loss (docs/pretraining.md). WordPiece's likelihood score
# favours pairs of rare symbols: a pair must occur MIN_PAIR_COUNT times.
VOCAB, MIN_PAIR_COUNT = 8000, 50
SIZE = dict(d_model=128, n_layers=2, n_heads=4, max_len=128)
MLM_LR, MLM_WARMUP = 3e-3, 200
# Fine-tuning learning rates per mode, fixed before the run (a tuple is a grid chosen on dev accuracy): the modes
# that train few weights take larger steps.
LEARNING_RATES = {"full": (1e-3,), "frozen": (1e-2,), "adapters": (3e-3,), "lora": (5e-3,)}
LORA_RANK, LORA_ALPHA, ADAPTER_SIZE = 8, 16.0, 16
# (body, start, mode): encoder and GPT-style decoder side by side
RUNS = (("encoder", "scratch", "full"), ("encoder", "mlm", "full"), ("encoder", "mlm", "frozen"),
        ("encoder", "mlm", "adapters"), ("encoder", "mlm", "lora"), ("decoder", "scratch", "full"),
        ("decoder", "lm", "full"))
# at 100 % the budget runs the target's modes (full, LoRA) and the decoder, not the frozen body and adapters
RUNS_AT = {0.01: RUNS, 0.1: RUNS, 1.0: tuple(r for r in RUNS if r[2] not in ("frozen", "adapters"))}


def pretraining_sources(folder: Path) -> list[Path]:
    """Every English text reachable offline, as files the ingestion reads: gensim's Wikipedia excerpt and lee
    corpora, WikiText-2 valid, EWT train, the English side of Tatoeba train. Copies under `folder` where the
    original's name would put it in a held-out split (wiki.valid.tokens) or its format needs it."""
    wikitext, tatoeba, lee = folder / "wikitext2.txt", folder / "tatoeba-english.txt", folder / "lee.txt"
    wikitext.write_text((SHARED_DATA / "wikitext-2" / "wiki.valid.tokens").read_text(encoding="utf-8"))
    pairs = (SHARED_DATA / "tatoeba-eng-fra" / "train.tsv").read_text(encoding="utf-8").splitlines()
    tatoeba.write_text("\n\n".join(line.split("\t")[0] for line in pairs if line))  # one document per sentence
    lee.write_text(Path(datapath("lee.cor")).read_bytes().decode("latin-1"))  # not UTF-8
    return [*resolve_sources(["builtin:enwiki", "builtin:lee"]), lee, wikitext, tatoeba, EWT / "en_ewt-ud-train.conllu"]


def pretraining_text(quick: bool) -> tuple[list[str], list[str]]:
    """(train sentences, held-out sentences) of the pretraining corpus, lowercased."""
    with tempfile.TemporaryDirectory() as tmp:
        docs = build_corpus(pretraining_sources(Path(tmp)), IngestOptions(lowercase=True)).documents
    split = {}
    for name in ("train", "valid"):
        texts = docs.filter(docs["split"] == name)["text"].str.split("\n").explode()
        split[name] = [t for t in texts.to_list() if t and len(t.split()) >= 3]
    if quick:
        return split["train"][:3000], split["valid"][:200]
    return split["train"], split["valid"]


def _threads() -> None:
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(name)s %(message)s")


def pretrain_mlm(config: EncoderConfig, train_ids, held_ids, steps: int, quick: bool):
    _threads()
    cfg = TrainConfig(epochs=1000, max_steps=steps, batch_size=MLM_BATCH, lr=MLM_LR,
                      warmup_steps=40 if quick else MLM_WARMUP, clip_grad_norm=1.0, checkpoint_every=0,
                      weight_decay=0.01, log_every_s=60)
    mlm = MaskedLM(config, cfg)
    mlm.fit(train_ids, held_ids, pppl_sentences=20 if quick else 100)
    return mlm


def pretrain_lm(config: TransformerConfig, train_ids, held_ids, steps: int, quick: bool):
    _threads()
    cfg = TrainConfig(epochs=1000, max_steps=steps, batch_size=16, bptt=SIZE["max_len"], lr=MLM_LR,
                      warmup_steps=40 if quick else MLM_WARMUP, clip_grad_norm=1.0, checkpoint_every=0,
                      weight_decay=0.01, log_every_s=60)
    gpt = TransformerLM(config, cfg).fit(train_ids)
    return gpt, gpt.perplexity(held_ids)


def _classifier(body_class, body_config, weights, task: str, n_labels: int) -> Classifier:
    torch.manual_seed(0)  # from scratch: the same init for every run of a body
    body = body_class(body_config)
    if weights is not None:
        body.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})
    return Classifier(body, "token" if task == "upos" else "sequence", n_labels)


def fine_tune_job(job: dict) -> dict:
    """One fine-tuning run (in a worker): returns its dev figures and the trained weights (LoRA merged)."""
    _threads()
    model = _classifier(job["body_class"], job["body_config"], job["weights"], job["task"], job["n_labels"])
    cfg = TrainConfig(epochs=job["epochs"], batch_size=32 if job["fraction"] > 0.05 else 8, lr=job["lr"],
                      warmup_steps=min(100, job["warmup"]), clip_grad_norm=1.0, checkpoint_every=0, patience=PATIENCE,
                      log_every_s=60)
    config = FineTuneConfig(mode=job["mode"], lora_rank=LORA_RANK, lora_alpha=LORA_ALPHA, adapter_size=ADAPTER_SIZE)
    m = finetune(model, config, job["train"], job["dev"], cfg)
    logging.getLogger("lexiflow.benchmark").info("%s %s %s %s %g lr %g: dev %.4f, %d epochs", job["task"], *job["run"],
                                                 job["fraction"], job["lr"], m["dev_accuracy"], m["epochs"])
    return {**job, "metrics": m, "state": numpy_state(model), "train": None, "dev": None, "weights": None}


def numpy_state(module: torch.nn.Module) -> dict[str, np.ndarray]:
    """A state dict as numpy arrays: sent between processes as plain bytes (no shared-memory file handles)."""
    return {k: v.detach().cpu().numpy() for k, v in module.state_dict().items()}


def rebuild(job: dict) -> Classifier:
    """The trained classifier of a finished job, in this process (same structure: adapters added, LoRA merged)."""
    model = _classifier(job["body_class"], job["body_config"], None, job["task"], job["n_labels"])
    prepare(model, FineTuneConfig(mode=job["mode"], lora_rank=LORA_RANK, lora_alpha=LORA_ALPHA,
                                  adapter_size=ADAPTER_SIZE))
    if job["mode"] == "lora":
        merge_lora(model)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in job["state"].items()})
    return model.eval()


def run(quick: bool = False) -> list[Row]:
    _threads()
    log = logging.getLogger("lexiflow.benchmark")
    t0 = time.perf_counter()
    train_text, held_text = pretraining_text(quick)
    n_words = sum(len(t.split()) for t in train_text)
    tok = WordPiece(vocab_size=2000 if quick else VOCAB, min_frequency=5 if quick else MIN_PAIR_COUNT,
                    special_tokens=BERT_SPECIALS).fit(train_text)

    def enc(texts: list[str]) -> list[np.ndarray]:  # long lines (WikiText paragraphs) in pieces that fit
        out = [np.asarray(tok.encode(t), dtype=np.int64) for t in texts]
        step = SIZE["max_len"] - 2
        return [ids[i:i + step] for ids in out for i in range(0, len(ids), step)]

    train_ids, held_ids = enc(train_text), enc(held_text)[:200 if quick else 2000]
    n_tokens = sum(map(len, train_ids))
    log.info("pretraining corpus: %d lines, %d words, %d WordPiece tokens (%.0fs)", len(train_ids), n_words, n_tokens,
             time.perf_counter() - t0)
    steps, lm_steps = (40, 40) if quick else (MLM_STEPS, LM_STEPS)
    limit = 600 if quick else None
    data = {task: {split: ewt_examples(EWT / f"en_ewt-ud-{split}.conllu", tok, task, labels,
                                       max_len=SIZE["max_len"])[:limit] for split in ("train", "dev", "test")}
            for task, labels in TASKS.items()}
    configs = {"encoder": (EncoderModel, EncoderConfig(vocab_size=tok.vocab_size, d_ff=4 * SIZE["d_model"], **SIZE)),
               "decoder": (Transformer, TransformerConfig(vocab_size=tok.vocab_size, dropout=0.1, **SIZE))}

    # a seeded sample of dev: the file runs genre by genre, so its first sentences are one genre
    dev = {task: label_fraction(data[task]["dev"], DEV_SENTENCES / len(data[task]["dev"]), seed=1) for task in TASKS}

    def jobs(body: str, start: str, weights) -> list[dict]:
        out = []
        for task, labels in TASKS.items():
            for fraction in FRACTIONS:
                train = label_fraction(data[task]["train"], fraction)
                for run_key in (r for r in RUNS_AT[fraction] if r[:2] == (body, start)):
                    out += [dict(task=task, fraction=fraction, run=run_key, mode=run_key[2], lr=lr,
                                 n_labels=len(labels), body_class=configs[body][0], body_config=configs[body][1],
                                 weights=weights, train=train, dev=dev[task],
                                 epochs=1 if quick else FT_EPOCHS[fraction], warmup=len(train) // 8)
                            for lr in LEARNING_RATES[run_key[2]]]
        return out

    with ProcessPoolExecutor(WORKERS, mp_context=get_context("spawn")) as pool:  # scratch runs while pretraining
        mlm_future = pool.submit(pretrain_mlm, configs["encoder"][1], train_ids, held_ids, steps, quick)
        lm_future = pool.submit(pretrain_lm, configs["decoder"][1], train_ids, held_ids, lm_steps, quick)
        futures = [pool.submit(fine_tune_job, j) for j in [*jobs("encoder", "scratch", None),
                                                              *jobs("decoder", "scratch", None)]]
        gpt, gpt_ppl = lm_future.result()
        futures += [pool.submit(fine_tune_job, j) for j in jobs("decoder", "lm", numpy_state(gpt.module_))]
        mlm = mlm_future.result()
        futures += [pool.submit(fine_tune_job, j) for j in jobs("encoder", "mlm", numpy_state(mlm.model))]
        done = [f.result() for f in futures]
    rows = pretraining_rows(mlm, gpt_ppl, steps, lm_steps, n_words, n_tokens, len(tok))
    best: dict[tuple, dict] = {}
    for job in done:  # the learning rate chosen on dev accuracy (where a mode has several)
        key = (job["task"], job["fraction"], job["run"])
        if key not in best or job["metrics"]["dev_accuracy"] > best[key]["metrics"]["dev_accuracy"]:
            best[key] = job
    results = {key: accuracy(rebuild(job), data[key[0]]["test"]) for key, job in best.items()}  # test, once
    rows += curve_rows(best, results)
    plot_curves(results, RESULTS_DIR / ("finetune-curves-quick.png" if quick else "finetune-curves.png"))
    log.info("done in %.0fs", time.perf_counter() - t0)
    return rows


def pretraining_rows(mlm: MaskedLM, gpt_ppl: float, steps: int, lm_steps: int, n_words: int, n_tokens: int,
                     vocab: int) -> list[Row]:
    m = mlm.metrics
    case = (f"MLM pretraining, {steps} steps of {MLM_BATCH} lines, corpus {n_words} words = {n_tokens} WordPiece "
            f"tokens ({vocab})")
    notes = (f"encoder d={SIZE['d_model']}, {SIZE['n_layers']} layers, {mlm.n_parameters} parameters; held-out = the "
             f"ingest valid split; {m['mask_tokens']} [MASK], {m['random_tokens']} random, {m['unchanged_tokens']} "
             "unchanged positions")
    rows = [Row("finetune", case, "[MASK] perplexity", m["mask_perplexity"], m["unigram_perplexity"],
                "held-out unigram", higher_is_better=False, target="ratio <= 0.8", met=m["mask_perplexity"] <= 0.8 *
                m["unigram_perplexity"], notes=notes),
            Row("finetune", case, "pseudo-perplexity", m["pseudo_perplexity"], m["unigram_pseudo_perplexity"],
                "held-out unigram", higher_is_better=False, notes="first 100 held-out lines, every token")]
    rows += [Row("finetune", case, f"{kind} {what}", m[f"{kind}_{what}"], higher_is_better=what == "accuracy",
                 notes="held-out chosen positions by what the input shows")
             for kind in ("mask", "random", "unchanged") for what in ("accuracy", "perplexity")]
    rows.append(Row("finetune", case, "pretraining tokens/s", m["tokens_per_s"], notes="1 thread, shared machine"))
    rows.append(Row("finetune", f"GPT-style LM pretraining, {lm_steps} steps of 16 x {SIZE['max_len']} tokens",
                    "held-out ppl", gpt_ppl, higher_is_better=False, notes="same WordPiece vocabulary and size"))
    return rows


def curve_rows(best: dict[tuple, dict], results: dict[tuple, float]) -> list[Row]:
    rows = []
    for (task, fraction, run_key), job in best.items():
        m = job["metrics"]
        body, start, mode = run_key
        case = (f"EWT {task} test, {fraction:.0%} of train ({m['epochs']} epochs), {body} "
                f"{'from scratch' if start == 'scratch' else 'pretrained'}, {mode}")
        rows.append(Row("finetune", case, "accuracy", results[(task, fraction, run_key)],
                        notes=f"dev {m['dev_accuracy']:.4f}; trainable {m['trainable']} of {m['total']} "
                              f"({100 * m['trainable_share']:.2f} %); lr {job['lr']:g}"))
    for task in TASKS:
        for fraction in FRACTIONS:
            r = {k[2]: v for k, v in results.items() if k[:2] == (task, fraction)}
            at = f"EWT {task} test, {fraction:.0%} of train"
            pairs = [("pretrained vs from scratch (encoder, full)", ("encoder", "mlm", "full"),
                      ("encoder", "scratch", "full"), "same encoder from scratch",
                      "ours > peer" if fraction < 1 else ""),
                     ("LoRA vs full (encoder)", ("encoder", "mlm", "lora"), ("encoder", "mlm", "full"),
                      "full fine-tuning", ">= peer - 0.01" if fraction > 0.05 else ""),
                     ("pretrained vs from scratch (GPT-style decoder, full)", ("decoder", "lm", "full"),
                      ("decoder", "scratch", "full"), "same decoder from scratch", "")]
            for what, ours, peer, peer_name, target in pairs:
                if ours not in r or peer not in r:  # a run the budget did not reach
                    continue
                met = {"ours > peer": r[ours] > r[peer], ">= peer - 0.01": r[ours] >= r[peer] - 0.01}.get(target)
                rows.append(Row("finetune", f"{at}: {what}", "accuracy", r[ours], r[peer], peer_name, target=target,
                                met=met))
    return rows


def plot_curves(results: dict[tuple, float], path: Path) -> Path:
    """Test accuracy against the share of EWT train, one panel per task; encoder solid, decoder dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(TASKS), figsize=(6 * len(TASKS), 4.5), dpi=100)
    for ax, task in zip(axes, TASKS, strict=True):
        for run_key in RUNS:
            body, start, mode = run_key
            ys = [results.get((task, f, run_key), float("nan")) for f in FRACTIONS]  # NaN: a point not run
            label = f"{body}, {'scratch' if start == 'scratch' else start.upper()}, {mode}"
            ax.plot([100 * f for f in FRACTIONS], ys, marker="o", linestyle="-" if body == "encoder" else "--",
                    label=label)
        ax.set_xscale("log")
        ax.set_xticks([100 * f for f in FRACTIONS], [f"{f:.0%}" for f in FRACTIONS])
        ax.set_xlabel("share of EWT train fine-tuned on")
        ax.set_ylabel("test accuracy")
        ax.set_title(f"EWT {task}")
        ax.grid(alpha=0.3)
    axes[-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
    return path
