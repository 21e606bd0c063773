"""Neural taggers on UD English EWT: the BiLSTM tagger, the ELMo biLM and the BiLSTM+ELMo tagger.

Each model trains on EWT train with early stopping on EWT dev (the only tuning), and is saved under
`CACHE/<name>` (training is minutes to tens of minutes on a shared CPU core), so `python -m
benchmarks tagger` evaluates the saved models on test once. Train them one by one in the background:

    OMP_NUM_THREADS=1 python -m benchmarks._tagger_models bilstm   # BiLSTM, UPOS + XPOS heads (joint)
    OMP_NUM_THREADS=1 python -m benchmarks._tagger_models bilstm-hmm   # variants (VARIANTS), compared on dev
    OMP_NUM_THREADS=1 python -m benchmarks._tagger_models bilm     # biLM on EWT train + WikiText-2 valid
    OMP_NUM_THREADS=1 python -m benchmarks._tagger_models elmo     # BiLSTM + ELMo (needs bilm)
    python -m benchmarks._tagger_models dev bilstm-hmm bilstm-hmm-charlstm   # compare saved variants on dev
    python -m benchmarks._tagger_models finish bilstm   # out of time: save the best epoch so far (checkpoint)

`tagger` trains what is missing itself (same functions). Train tokens/s are wall-clock tokens per
second of the training loop, measured under the shared machine's load.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from pathlib import Path

import torch
from lexiflow.models.conllu import read_conllu
from lexiflow.models.elmo import BiLM, BiLMConfig
from lexiflow.models.lm.train import TrainConfig
from lexiflow.models.neural_tagger import BiLSTMTagger, TaggerConfig

from benchmarks.harness import SHARED_DATA

EWT = SHARED_DATA / "ud-english-ewt"
WIKITEXT = SHARED_DATA / "wikitext-2" / "wiki.valid.tokens"
CACHE = Path(__file__).parent / "results" / "cache" / "tagger"

# Chosen before any test evaluation; dev only stops training (early stopping on dev accuracy) and picks
# between variants. Budget: 12 epochs (~10 min on a quiet core, 45 min at the shared machine's load of ~8;
# the plain `bilstm` in docs/tagger.md is the best epoch, 11, of a 30-epoch schedule stopped for time).
TAGGER_TRAIN = TrainConfig(epochs=12, batch_size=32, lr=2e-3, clip_grad_norm=5.0, patience=5, warmup_steps=100,
                           min_lr_ratio=0.05, log_every_s=30)
ELMO_EPOCHS = 6  # the BiLSTM+ELMo tagger starts after the biLM: the budget left it 6 epochs (same schedule shape)
BILM = BiLMConfig(token_input="char", dim=64, hidden_dim=160, num_layers=2, max_vocab=5000, char_filters=32,
                  char_kernels=(1, 2, 3, 4),
                  train=TrainConfig(epochs=1, batch_size=32, lr=2e-3, clip_grad_norm=5.0, patience=1, warmup_steps=100,
                                    log_every_s=30))


def ewt(split: str, limit: int | None = None) -> list[list[tuple[str, str, str]]]:
    """(word, UPOS, XPOS) per token: UPOS is the tagger's first head, XPOS its second (joint model)."""
    out = []
    for s in read_conllu(EWT / f"en_ewt-ud-{split}.conllu"):
        out.append(list(zip(s.words, s.upos, s.xpos, strict=True)))
        if limit and len(out) >= limit:
            break
    return out


def bilm_corpus(limit: int | None = None) -> list[list[str]]:
    """EWT train words and WikiText-2 valid, cut into sentences at ' . ' (headers dropped)."""
    sents = [[w for w, _, _ in s] for s in ewt("train", limit)]
    lines = WIKITEXT.read_text(encoding="utf-8").splitlines()[: limit or None]
    for line in lines:
        if not line.strip() or line.strip().startswith("="):
            continue
        for part in re.split(r"(?<= \.) ", line.strip()):
            words = part.split()
            if words:
                sents.append(words)
    return sents


# BiLSTM variants compared on dev (the name is the cache folder).
VARIANTS = {"bilstm": {"hmm_features": False}, "elmo": {"hmm_features": False}, "bilstm-hmm": {"hmm_features": True},
            "bilstm-charlstm": {"hmm_features": False, "char_encoder": "lstm"},
            "bilstm-hmm-charlstm": {"hmm_features": True, "char_encoder": "lstm"}}


def tagger_config(folder: Path, limit: int | None, elmo: bool) -> TaggerConfig:
    variant = VARIANTS[folder.name.removeprefix("quick-")]
    cfg = TaggerConfig(elmo=elmo, **variant,
                       train=TrainConfig(**{**TAGGER_TRAIN.__dict__, "checkpoint_dir": str(folder / "scratch")}))
    if elmo:
        cfg.train.epochs = ELMO_EPOCHS
    if limit:
        cfg.train.epochs = 1
    return cfg


def train_bilstm(folder: Path, limit: int | None = None, elmo: Path | None = None) -> BiLSTMTagger:
    bilm = BiLM.load(elmo) if elmo is not None else None
    tagger = BiLSTMTagger(tagger_config(folder, limit, elmo is not None))
    tagger.fit(ewt("train", limit), dev=ewt("dev", limit and limit // 4), bilm=bilm)
    tagger.save(folder)
    return tagger


def finish(name: str) -> BiLSTMTagger:
    """Save the best epoch so far of a tagger training still running (`bilstm` or `elmo`): the budget's end."""
    folder = CACHE / name
    bilm = BiLM.load(CACHE / "bilm") if name == "elmo" else None
    tagger = BiLSTMTagger.from_checkpoint(tagger_config(folder, None, name == "elmo"), ewt("train"), bilm=bilm)
    tagger.save(folder)
    return tagger


def train_bilm(folder: Path, limit: int | None = None) -> BiLM:
    cfg = BiLMConfig(**{**BILM.__dict__, "train": TrainConfig(**{**BILM.train.__dict__,
                                                                  "checkpoint_dir": str(folder / "scratch")})})
    if limit:
        cfg.train.epochs = 1
    dev = [[w for w, _, _ in s] for s in ewt("dev", limit and limit // 4)]
    bilm = BiLM(cfg).fit(bilm_corpus(limit), dev=dev)
    bilm.save(folder)
    return bilm


def trained(name: str, limit: int | None = None) -> bool:
    """Whether the model `name` is saved in the cache (quick runs: the scratch cache, trained on demand)."""
    return bool(limit) or (CACHE / name / ("bilm.json" if name == "bilm" else "config.json")).exists()


def _training(folder: Path) -> bool:
    """Whether a training of this model checkpointed in the last 20 minutes (one is running in the background)."""
    stamp = folder / "scratch" / "checkpoint" / "trainer.json"
    return stamp.exists() and time.time() - stamp.stat().st_mtime < 1200


def cached(name: str, limit: int | None = None):
    """The saved model `name` (bilstm, bilm, elmo), trained first when missing; quick runs use a scratch cache."""
    folder = CACHE / (f"quick-{name}" if limit else name)
    if name == "bilm":
        return BiLM.load(folder) if (folder / "bilm.json").exists() else train_bilm(folder, limit)
    while not limit and not (folder / "config.json").exists() and _training(folder):
        logging.getLogger("benchmarks.tagger").info("waiting for %s, training in the background", folder)
        time.sleep(20)
    if (folder / "config.json").exists():
        return BiLSTMTagger.load(folder)
    elmo = None
    if name == "elmo":
        cached("bilm", limit)
        elmo = CACHE / ("quick-bilm" if limit else "bilm")
    return train_bilstm(folder, limit, elmo=elmo)


def dev_report(names: list[str]) -> None:
    """Dev accuracy (overall / known / unknown words) of saved taggers, and on unknown words how often the
    stacked model or its own HMM is right: the bound of any combination of the two (variant choice: dev only)."""
    from lexiflow.models.tagging_metrics import accuracy_report

    dev = ewt("dev")
    words = [[w for w, _, _ in s] for s in dev]
    vocab = {w for s in ewt("train") for w, _, _ in s}
    for name in names:
        model = BiLSTMTagger.load(CACHE / name)
        for head, col in enumerate(("upos", "xpos")):
            gold = [[t[head + 1] for t in s] for s in dev]
            pred = model.tag_many(words, head=head)
            r = accuracy_report(words, gold, pred, vocab)
            print(f"{name} {col}: dev {r['accuracy']:.4f}, known {r['known_accuracy']:.4f}, "
                  f"unknown {r['unknown_accuracy']:.4f}")
            if head == 0 and model.hmm_ is not None:
                hmm = model.hmm_.tag_many(words)
                unknown = [(g, p, h) for ws, gs, ps, hs in zip(words, gold, pred, hmm, strict=True)
                           for w, g, p, h in zip(ws, gs, ps, hs, strict=True) if w not in vocab]
                hmm_right = sum(g == h for g, _, h in unknown) / len(unknown)
                either = sum(g in (p, h) for g, p, h in unknown) / len(unknown)
                print(f"  unknown words ({len(unknown)}): its HMM {hmm_right:.4f}, either right {either:.4f}")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(1)
    if sys.argv[1] == "finish":
        finish(sys.argv[2])
    elif sys.argv[1] == "dev":
        dev_report(sys.argv[2:])
    else:
        cached(sys.argv[1])
