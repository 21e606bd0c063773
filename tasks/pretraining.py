"""Pretraining and fine-tuning stages: the `encoder` (a WordPiece vocabulary and a BERT-style encoder pretrained
by masked-LM on the corpus' train split, held-out figures on its valid split) and one `finetuned` artifact per
(task, mode) on the tagged corpus (UPOS tagging, genre classification from EWT-style sent_ids), trained on its
train split, stopped early on valid, scored on test."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import polars as pl
from lexiflow.models import ingest
from lexiflow.models.config import from_section
from lexiflow.models.errors import InputError
from lexiflow.models.tokenizers.wordpiece import WordPiece
from lexiflow.storage import ArtifactRef, ArtifactWriter
from lexiflow.storage.formats import read_table
from lexiflow.tasks.params import FineTuneParams, PretrainParams
from lexiflow.tasks.stage import stage

# The model modules import torch or gensim: the functions that use them import them (a cached run imports none).



def labels(task: str) -> tuple[str, ...]:
    """A fine-tuning task's label set."""
    from lexiflow.models import finetune as ft

    return {"upos": ft.UPOS_TAGS, "genre": ft.GENRES}[task]

# the encoder's held-out figures each finetuned manifest repeats: did the MLM learn more than token frequencies
ENCODER_FIGURES = ("mask_accuracy", "mask_perplexity", "unigram_perplexity")


def _sentences(documents: pl.DataFrame, split: str) -> list[str]:
    texts = documents.filter(pl.col("split") == split)["text"].str.split("\n").explode()
    return [t for t in texts.to_list() if t]


def _pieces(tokenizer: WordPiece, texts: list[str], max_len: int) -> list[np.ndarray]:
    """Each text's ids, long ones cut into pieces that fit [CLS] .. [SEP] in max_len."""
    step = max_len - 2
    ids = tokenizer.encode_batch(texts).to_list()
    return [np.asarray(s[i:i + step], dtype=np.int64) for s in ids for i in range(0, len(s), step)]


@stage("encoder")
def pretrain(out: ArtifactWriter, corpus: ArtifactRef, params: PretrainParams) -> None:
    from lexiflow.models import encoder as enc
    from lexiflow.models.lm.train import TrainConfig

    documents = read_table(corpus, "documents.parquet")
    train_text, held_text = _sentences(documents, "train"), _sentences(documents, "valid")
    if not train_text:
        raise ingest.no_train_split(f"corpus {corpus.version}", dict(documents.group_by("split").len().iter_rows()))
    tokenizer = from_section(WordPiece, params, special_tokens=enc.BERT_SPECIALS).fit(train_text)
    config = from_section(enc.EncoderConfig, params, vocab_size=len(tokenizer))
    schedule = from_section(TrainConfig, params, checkpoint_dir=str(out.scratch), clip_grad_norm=1.0)
    mlm = enc.MaskedLM(config, schedule, tokenizer=tokenizer)
    held = _pieces(tokenizer, held_text, config.max_len) or None
    mlm.fit(_pieces(tokenizer, train_text, config.max_len), held, pppl_sentences=params.pppl_sentences)
    mlm.save(out.folder)
    out.write_parquet("metrics.parquet", pl.DataFrame(mlm.history))
    out.metrics.update({**mlm.metrics, "train_sentences": len(train_text), "held_out_sentences": len(held_text)})


def _examples(table: pl.DataFrame, split: str, tokenizer: WordPiece, task: str, max_len: int, where: str):
    from lexiflow.models import finetune as ft

    rows = table.filter(pl.col("split") == split).select("words", "upos", "sent_id").iter_rows()
    return ft.examples(rows, tokenizer, task, labels(task), max_len, f"{where} ({split})") \
        if (table["split"] == split).any() else []


@stage("finetuned")
def finetune(out: ArtifactWriter, encoder: ArtifactRef, tagged: ArtifactRef, task: str, mode: str,
             params: FineTuneParams) -> None:
    """`mode` is one of ft.MODES or "scratch" (full fine-tuning of the same encoder randomly initialised)."""
    import torch
    from lexiflow.loaders import load
    from lexiflow.models import encoder as enc
    from lexiflow.models import finetune as ft
    from lexiflow.models.lm.train import TrainConfig, module_tensors
    from safetensors.torch import save_file

    mlm = load(encoder.store, "encoder", encoder.version)
    if mlm.tokenizer is None:
        raise InputError(f"encoder {encoder.version} holds no tokenizer files: rebuild it with the pretrain stage")
    table = read_table(tagged, "sentences.parquet")
    where = f"tagged corpus {tagged.version}"
    data = {s: _examples(table, s, mlm.tokenizer, task, mlm.config.max_len, where) for s in ("train", "valid", "test")}
    if not data["train"]:
        raise ingest.no_train_split(where, dict(table.group_by("split").len().iter_rows()))
    data["train"] = ft.label_fraction(data["train"], params.train_fraction, params.seed)
    config = from_section(ft.FineTuneConfig, params, mode="full" if mode == "scratch" else mode)
    def train(lr: float, dropout: float | None) -> tuple:
        """One fine-tuning run, resumable in its own scratch folder: (dev accuracy, lr, dropout, model, metrics)."""
        torch.manual_seed(params.seed)
        body = enc.EncoderModel(mlm.config)
        if mode != "scratch":
            body.load_state_dict(mlm.model.state_dict())
        model = ft.Classifier(body, "token" if task == "upos" else "sequence", len(labels(task)), params.head_dropout)
        folder = f"lr-{lr:g}" + ("" if dropout is None else f"-dropout-{dropout:g}")
        schedule = from_section(TrainConfig, params, lr=lr, checkpoint_dir=str(out.scratch / folder),
                                clip_grad_norm=1.0)
        metrics = ft.finetune(model, replace(config, lora_body_dropout=dropout), data["train"],
                              data["valid"] or None, schedule)
        return metrics.get("dev_accuracy", 0.0), lr, dropout, model, metrics

    # every rate of the grid trains; the best on valid is kept (the first best, in the grid's order); LoRA then
    # tries the body without dropout at that rate
    grid = params.lrs or ft.LR_GRID[config.mode]
    lrs = grid if data["valid"] else grid[len(grid) // 2:][:1]  # nothing to choose on: the grid's middle rate
    tried = [train(lr, None) for lr in lrs]
    if config.mode == "lora" and data["valid"]:
        best_lr = max(tried, key=lambda t: t[0])[1]
        tried += [train(best_lr, dropout) for dropout in ft.LORA_BODY_DROPOUTS[1:]]
    _, lr, dropout, model, metrics = max(tried, key=lambda t: t[0])
    model.to("cpu")
    save_file(module_tensors(model), str(out.path("classifier.safetensors")))  # LoRA merged: plain weights
    held_out = "test" if data["test"] else "valid" if data["valid"] else None
    out.write_text("config.json", json.dumps({"task": task, "mode": mode, "labels": list(labels(task)),
                                              "encoder": encoder.version}, indent=2))
    out.metrics.update({"task": task, "mode": mode, **metrics, "lr": lr,
                        "body_dropout": mlm.config.dropout if dropout is None else dropout,
                        **{f"dev_accuracy_lr_{t[1]:g}" + ("" if t[2] is None else f"_body_dropout_{t[2]:g}"): t[0]
                           for t in tried}, "evaluated_on": held_out,
                        "train_fraction": params.train_fraction, "train_sentences": len(data["train"]),
                        "accuracy": ft.accuracy(model, data[held_out]) if held_out else None,
                        **{f"encoder_{k}": mlm.metrics.get(k) for k in ENCODER_FIGURES}})
