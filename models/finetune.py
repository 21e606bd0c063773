"""Fine-tuning a pretrained Transformer (notes 001 "Fine-tuning", 002 "How to use BERT?"): task heads, and the
four ways to adapt the body.

Heads (one Linear layer on the last layer's states):
    token classification     logits_i = W h_i on every token; a word's label is read at its first sub-token
    sequence classification  logits = W mean_i h_i (encoder: [CLS] is trained by NSP only, which is off), W h_last
                             (decoder-only LM: the last real token, the only one that has seen the whole sentence)

Modes (what trains besides the head):
    full      every weight (Devlin et al. 2019)
    frozen    nothing: the body gives features only
    adapters  Houlsby et al. (2019) bottlenecks h <- h + W_up f(W_down h) after each attention output projection
              and each feed-forward block (with the LayerNorms, as Houlsby trains them); W_up starts at zero, so
              the adapted model starts as the pretrained one
    lora      Hu et al. (2022) on the attention projections (W^Q, W^K, W^V, W^O; the encoder's and the LM's alike),
              with `lora_targets="linear"` the feed-forward layers too, and by default (`"all"`) the token
              embedding as well (a lookup is a linear map of a one-hot input; peft's embedding LoRA):
              h = x W^T + (α / r) x A^T B^T, A (r, d_in) random, B (d_out, r) zero;
              e = E[id] + (α / r) A[id] B, A (V, r_e) zero, B (r_e, d) random (the embedding has its own rank r_e,
              the same scale α / r); `merge_lora` folds W' = W + (α / r) B A (E' = E + (α / r) A B) into plain
              layers for inference (same outputs, no extra cost)

Bodies: `EncoderModel` (models/encoder.py) and the GPT-style `Transformer` LM (models/lm/transformer.py); both
read WordPiece ids with BERT_SPECIALS (the LM reads [CLS] as <s> and [SEP] as </s>). Training goes through
the one loop (`models.lm.train.Trainer`): checkpoints, device, bf16 on CUDA, progress, early stopping on the
dev loss.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from lexiflow.models.attention import MultiHeadAttention
from lexiflow.models.conllu import read_conllu
from lexiflow.models.dropout import Dropout
from lexiflow.models.encoder import CLS_ID, PAD_ID, SEP_ID, EncoderModel, pad_rows
from lexiflow.models.errors import InputError, ParameterError
from lexiflow.models.finetune_config import (  # noqa: F401  (re-exported)
    LORA_BODY_DROPOUTS,
    LR_GRID,
    MODES,
    FineTuneConfig,
)
from lexiflow.models.lm.train import IGNORE, TrainConfig, Trainer, TrainTask, autocast, length_batches, to_device
from lexiflow.models.lm.transformer import Transformer
from torch import nn

logger = logging.getLogger("lexiflow.finetune")

GENRES = ("answers", "email", "newsgroup", "reviews", "weblog")  # EWT sent_id prefixes


# ---------------------------------------------------------------------------------------------
# adapters and LoRA


class Adapter(nn.Module):
    """Houlsby bottleneck: x + W_up GELU(W_down x); W_up = 0 at init, so it starts as the identity."""

    def __init__(self, d: int, bottleneck: int) -> None:
        super().__init__()
        self.down, self.up = nn.Linear(d, bottleneck), nn.Linear(bottleneck, d)
        nn.init.normal_(self.down.weight, std=0.02)
        nn.init.zeros_(self.down.bias)
        nn.init.zeros_(self.up.weight)
        nn.init.zeros_(self.up.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.up(F.gelu(self.down(x)))


class LoRALinear(nn.Module):
    """base(x) + scale (x Aᵀ) Bᵀ with the base Linear frozen; B = 0 at init (the base model exactly)."""

    def __init__(self, base: nn.Linear, rank: int, scale: float) -> None:
        super().__init__()
        self.base, self.scale = base, scale
        self.A = nn.Parameter(torch.empty(rank, base.in_features))
        self.B = nn.Parameter(torch.zeros(base.out_features, rank))
        nn.init.kaiming_uniform_(self.A, a=math.sqrt(5))  # as nn.Linear's weight (Hu et al.'s reference code)
        base.weight.requires_grad_(False)
        if base.bias is not None:
            base.bias.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.A.t() @ self.B.t()) * self.scale

    def merged(self) -> nn.Linear:
        """A plain Linear with W' = W + (α / r) B A."""
        out = nn.Linear(self.base.in_features, self.base.out_features, bias=self.base.bias is not None)
        with torch.no_grad():
            out.weight.copy_(self.base.weight + self.scale * self.B @ self.A)
            if self.base.bias is not None:
                out.bias.copy_(self.base.bias)
        return out.to(self.base.weight.device)


class LoRAEmbedding(nn.Module):
    """base(ids) + scale A[row(id)] B with the base Embedding frozen; A = 0 at init (the base model exactly). The
    factors' roles swap against LoRALinear's: a lookup's input is one-hot, so the zero factor is the per-id one.

    `ids`: the ids A has a row for (default: every id). Fine-tuning passes the ids its training data holds: a row
    no training example looks up never gets a gradient, so it would stay zero and only count as trainable."""

    def __init__(self, base: nn.Embedding, rank: int, scale: float, ids: Sequence[int] | None = None) -> None:
        super().__init__()
        self.base, self.scale = base, scale
        n = base.num_embeddings
        adapted = torch.arange(n) if ids is None else torch.as_tensor(sorted(set(ids)), dtype=torch.long)
        if len(adapted) and not 0 <= int(adapted.min()) <= int(adapted.max()) < n:
            raise ParameterError(f"LoRA embedding ids: each must lie in 0..{n - 1}, the embedding's rows")
        row = torch.full((n,), -1, dtype=torch.long)  # id -> its row of A; -1: not adapted
        row[adapted] = torch.arange(len(adapted))
        self.register_buffer("row", row.to(base.weight.device), persistent=False)
        self.A = nn.Parameter(torch.zeros(len(adapted), rank, device=base.weight.device))
        self.B = nn.Parameter(torch.empty(rank, base.embedding_dim, device=base.weight.device))
        nn.init.normal_(self.B, std=0.02)  # BERT's embedding init
        base.weight.requires_grad_(False)

    @property
    def weight(self) -> torch.Tensor:  # what a tied output layer reads (the MLM head): the base matrix
        return self.base.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        row = self.row[ids]
        delta = F.embedding(row.clamp(min=0), self.A) * (row >= 0).unsqueeze(-1).to(self.A.dtype)
        return self.base(ids) + delta @ self.B * self.scale

    def merged(self) -> nn.Embedding:
        """A plain Embedding with E' = E + (α / r) A B on the adapted rows."""
        out = nn.Embedding(self.base.num_embeddings, self.base.embedding_dim)
        with torch.no_grad():
            out.weight.copy_(self.base.weight)
            adapted = self.row >= 0
            out.weight[adapted] += self.scale * self.A[self.row[adapted]] @ self.B
        return out.to(self.base.weight.device)


def _layers(body: nn.Module) -> nn.ModuleList:
    """The body's layers; each has `attn` (a models.attention.MultiHeadAttention) and `ffn`."""
    return body.encoder.layers if isinstance(body, EncoderModel) else body.blocks


def _projections(body: nn.Module, targets: str = "attention") -> list[tuple[nn.Module, str]]:
    """(parent, attribute) of LoRA's targets: each attention projection, with `targets="linear"` each linear layer
    of the feed-forward blocks too, and with "all" the token embedding as well."""
    out = [(layer.attn, name) for layer in _layers(body) for name in ("q_proj", "k_proj", "v_proj", "out_proj")]
    if targets in ("linear", "all"):
        out += [(layer.ffn, name) for layer in _layers(body) for name, m in layer.ffn.named_children()
                if isinstance(m, nn.Linear)]
    if targets == "all":
        out.append((body.embed, "token") if isinstance(body, EncoderModel) else (body, "embedding"))
    return out


def _adapter_sites(body: nn.Module) -> list[tuple[nn.Module, str]]:
    """(parent, attribute) of the modules an adapter follows: each attention output projection and FFN."""
    return [site for layer in _layers(body) for site in ((layer.attn, "out_proj"), (layer, "ffn"))]


def set_dropout(body: nn.Module, p: float) -> None:
    """Every dropout of `body` (its Dropout layers and its attention weights' dropout) drops with probability p."""
    for m in body.modules():
        if isinstance(m, nn.Dropout):
            m.p = p
        elif isinstance(m, MultiHeadAttention):
            m.dropout = p


def merge_lora(module: nn.Module) -> nn.Module:
    """Replace every LoRALinear in `module` by its merged Linear (in place); returns the module."""
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, (LoRALinear, LoRAEmbedding)):
                setattr(parent, name, child.merged())
    return module


# ---------------------------------------------------------------------------------------------
# the model: body + head


def body_width(body: nn.Module) -> int:
    return body.config.d_model


class Classifier(nn.Module):
    """forward(ids (B, T)) -> logits (B, T, C) for `task="token"`, (B, C) for `task="sequence"`."""

    def __init__(self, body: nn.Module, task: Literal["token", "sequence"], n_labels: int,
                 head_dropout: float = 0.1) -> None:
        super().__init__()
        if not isinstance(body, (EncoderModel, Transformer)):
            raise ParameterError(f"fine-tuning body {type(body).__name__}: use an EncoderModel or a Transformer LM")
        if task not in ("token", "sequence"):
            raise ParameterError(f"task={task!r}: use 'token' or 'sequence'")
        self.body, self.task = body, task
        self.drop = Dropout(head_dropout)
        self.head = nn.Linear(body_width(body), n_labels)

    def hidden(self, ids: torch.Tensor) -> torch.Tensor:
        if isinstance(self.body, EncoderModel):
            return self.body(ids)
        b = self.body  # the LM's forward up to its last LayerNorm (causal: right padding changes nothing)
        pos = b.pos.weight[: ids.shape[1]] if b.config.positional == "learned" else b.pe[: ids.shape[1]]
        h = b.drop(b.embedding(ids) * b.emb_scale + pos)
        for block in b.blocks:
            h = block(h)
        return b.ln_f(h)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.hidden(ids)
        if self.task == "token":
            return self.head(self.drop(h))
        if isinstance(self.body, EncoderModel):  # the mean of the real tokens' states: [CLS] learns only from NSP
            real = (ids != PAD_ID).unsqueeze(-1).to(h.dtype)
            pooled = (h * real).sum(1) / real.sum(1)
        else:
            last = (ids != PAD_ID).sum(1) - 1  # the last real token ([SEP])
            pooled = h[torch.arange(len(ids), device=ids.device), last]
        return self.head(self.drop(pooled))


def prepare(model: Classifier, config: FineTuneConfig, train_ids: Iterable[int] | None = None) -> dict[str, int]:
    """Set `model` up for `config.mode` (adds adapters / LoRA, freezes the body as the mode says);
    returns {"trainable": ..., "total": ...} parameter counts. `train_ids`: the token ids the training data holds,
    the rows LoRA adapts in the token embedding (default: every row)."""
    config.validate()
    body, mode = model.body, config.mode
    if mode != "full":
        body.requires_grad_(False)
    if mode == "adapters":
        d = body_width(body)
        for parent, name in _adapter_sites(body):
            setattr(parent, name, nn.Sequential(getattr(parent, name), Adapter(d, config.adapter_size)))
        for m in body.modules():
            if isinstance(m, (Adapter, nn.LayerNorm)):
                m.requires_grad_(True)
    elif mode == "lora":
        if config.lora_body_dropout is not None:
            set_dropout(body, config.lora_body_dropout)
        ids = None if train_ids is None else sorted(set(train_ids))
        targets = _projections(body, config.lora_targets)
        rank, embedding_rank = lora_ranks(config, [getattr(parent, name) for parent, name in targets],
                                          parameter_counts(model), ids)
        if (rank, embedding_rank) != (config.lora_rank, config.lora_embedding_rank):
            logger.info("LoRA ranks lowered from %d / %d to %d / %d: lora_max_share=%g of this model's weights",
                        config.lora_rank, config.lora_embedding_rank, rank, embedding_rank, config.lora_max_share)
        scale = config.lora_alpha / config.lora_rank  # one scale for every update, whatever its rank
        for parent, name in targets:
            base = getattr(parent, name)
            if isinstance(base, nn.Embedding):
                setattr(parent, name, LoRAEmbedding(base, embedding_rank, scale, ids))
            else:
                setattr(parent, name, LoRALinear(base, rank, scale))
        return {**parameter_counts(model), "lora_rank": rank, "lora_embedding_rank": embedding_rank}
    return parameter_counts(model)


def lora_ranks(config: FineTuneConfig, targets: Sequence[nn.Module], counts: dict[str, int],
               ids: Sequence[int] | None) -> tuple[int, int]:
    """The configured (r, r_e), or both lowered together (r_e in proportion) until LoRA's weights and what already
    trains (`counts`, the head) are at most `lora_max_share` of the model: a small vocabulary makes a small model."""
    per_rank = sum(m.in_features + m.out_features for m in targets if isinstance(m, nn.Linear))
    per_embedding_rank = sum((m.num_embeddings if ids is None else len(ids)) + m.embedding_dim for m in targets
                             if isinstance(m, nn.Embedding))
    r, r_e = config.lora_rank, config.lora_embedding_rank
    for rank in range(r, 0, -1):
        embedding_rank = max(1, round(r_e * rank / r))
        added = rank * per_rank + embedding_rank * per_embedding_rank
        if (counts["trainable"] + added) / (counts["total"] + added) <= config.lora_max_share:
            return rank, embedding_rank
    logger.warning("LoRA at rank 1 trains more than lora_max_share=%g of this model's weights", config.lora_max_share)
    return 1, 1


def training_ids(examples: Iterable[Example]) -> set[int]:
    """The token ids `examples` hold: the embedding rows fine-tuning can move."""
    return {i for ex in examples for i in ex.ids}


def parameter_counts(model: nn.Module) -> dict[str, int]:
    params = {id(p): p for p in model.parameters()}.values()
    return {"trainable": sum(p.numel() for p in params if p.requires_grad), "total": sum(p.numel() for p in params)}


# ---------------------------------------------------------------------------------------------
# data: EWT sentences as WordPiece examples


@dataclass
class Example:
    ids: list[int]  # [CLS] sub-tokens [SEP]
    labels: list[int] | int  # token task: per id (IGNORE off first sub-tokens); sequence task: the class
    n_words: int = 0  # words of the sentence (truncated ones count as errors)


def examples(sentences: Iterable[tuple[list[str], list[str], str]], tokenizer, task: Literal["upos", "genre"],
             labels: Sequence[str], max_len: int, where: str = "sentences", lowercase: bool = True) -> list[Example]:
    """Examples from (words, UPOS tags, sent_id) triples: UPOS per word (label at its first sub-token) or the
    genre (the sent_id prefix). An unknown tag or genre is an InputError naming `where` and the sentence."""
    index = {t: i for i, t in enumerate(labels)}
    out = []
    for n, (words, upos, sent_id) in enumerate(sentences, start=1):
        pieces = tokenizer.encode_words([w.lower() for w in words] if lowercase else list(words))
        ids, tags = [CLS_ID], [IGNORE]
        for word_ids, tag in zip(pieces, upos, strict=True):
            word_ids = word_ids or [tokenizer.unk_id]
            if len(ids) + len(word_ids) > max_len - 1:
                break
            if task == "upos" and tag not in index:
                raise InputError(f"{where}: sentence {n} ({sent_id}): UPOS tag {tag!r} is not one of the "
                                 f"{len(labels)} labels")
            ids += word_ids
            tags += [index.get(tag, IGNORE)] + [IGNORE] * (len(word_ids) - 1)
        ids.append(SEP_ID)
        tags.append(IGNORE)
        if task == "upos":
            out.append(Example(ids, tags, len(words)))
            continue
        genre = sent_id.split("-", 1)[0]
        if genre not in index:
            raise InputError(f"{where}: sentence {n}: sent_id {sent_id!r} does not start with a genre "
                             f"({', '.join(labels)})")
        out.append(Example(ids, index[genre], len(words)))
    if not out:
        raise InputError(f"{where}: no sentences")
    return out


def ewt_examples(path: str | Path, tokenizer, task: Literal["upos", "genre"], labels: Sequence[str],
                 max_len: int, lowercase: bool = True) -> list[Example]:
    """`examples` of a CoNLL-U file."""
    return examples(((s.words, s.upos, s.sent_id) for s in read_conllu(path)), tokenizer, task, labels, max_len,
                    str(path), lowercase)


def label_fraction(examples: Sequence[Example], fraction: float, seed: int = 0) -> list[Example]:
    """A seeded random share of `examples` (at least one): the first round(fraction n) of one permutation, so a
    smaller share is a subset of a larger one and a learning curve adds labels without swapping them."""
    if not 0 < fraction <= 1:
        raise ParameterError(f"finetune.train_fraction={fraction}: use a share in (0, 1]")
    order = np.random.default_rng(seed).permutation(len(examples))
    return [examples[i] for i in sorted(order[:max(1, round(fraction * len(examples)))])]


UPOS_TAGS = ("ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART", "PRON", "PROPN", "PUNCT",
             "SCONJ", "SYM", "VERB", "X")


class ClassifyTask(TrainTask):
    """Cross-entropy of the head on length-bucketed batches; the dev loss drives early stopping."""

    def __init__(self, train: list[Example], dev: list[Example] | None, cfg: TrainConfig) -> None:
        self.train, self.dev, self.cfg = train, dev, cfg
        self.lengths = np.array([len(e.ids) for e in train])
        self.tokens_per_step = float(self.lengths.sum()) / max(1, -(-len(train) // cfg.batch_size))

    def epoch_batches(self, epoch: int) -> list[np.ndarray]:
        return length_batches(self.lengths, self.cfg.batch_size, self.cfg.seed, epoch)

    @staticmethod
    def tensors(examples: list[Example], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        return tuple(to_device(t, device) for t in ClassifyTask.host_tensors(examples))

    @staticmethod
    def host_tensors(examples: list[Example]) -> tuple[torch.Tensor, torch.Tensor]:
        ids = pad_rows([e.ids for e in examples], PAD_ID)
        if isinstance(examples[0].labels, int):
            return ids, torch.tensor([e.labels for e in examples])
        return ids, pad_rows([e.labels for e in examples], IGNORE)

    @staticmethod
    def nll(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        flat = logits.float().reshape(-1, logits.shape[-1])
        return F.cross_entropy(flat, y.reshape(-1), ignore_index=IGNORE, reduction="sum")

    def loss(self, fwd, batch, state, device):
        ids, y = self.host_tensors([self.train[i] for i in batch])
        n, n_input = int((y != IGNORE).sum()), int((ids != PAD_ID).sum())  # counted on the host: no wait for the device
        return self.nll(fwd(to_device(ids, device)), to_device(y, device)), n, n_input, None

    @torch.no_grad()
    def evaluate(self, module, device, precision):
        if not self.dev:
            return None
        was = module.training
        module.eval()
        total, count = 0.0, 0
        for i in range(0, len(self.dev), 64):
            ids, y = self.tensors(self.dev[i:i + 64], device)
            with autocast(device, precision):
                nll = self.nll(module(ids), y)
            total, count = total + float(nll), count + int((y != IGNORE).sum())
        module.train(was)
        return total, count


@torch.no_grad()
def accuracy(model: Classifier, examples: list[Example], device: torch.device | str | None = None) -> float:
    """Word accuracy (token task: the first sub-token's label; words cut by max_len count as wrong) or
    sentence accuracy (sequence task), computed where the model is unless `device` says otherwise."""
    device = device if device is not None else next(model.parameters()).device
    model.eval()
    correct = total = 0
    for i in range(0, len(examples), 64):
        batch = examples[i:i + 64]
        ids, y = ClassifyTask.tensors(batch, torch.device(device))
        pred = model(ids).argmax(-1)
        if model.task == "token":
            correct += int(((pred == y) & (y != IGNORE)).sum())
            total += sum(e.n_words for e in batch)
        else:
            correct += int((pred == y).sum())
            total += len(batch)
    return correct / max(total, 1)


def finetune(model: Classifier, config: FineTuneConfig, train: list[Example], dev: list[Example] | None,
             cfg: TrainConfig) -> dict:
    """Prepare `model` for the mode, train it through the one loop, merge LoRA; returns the metrics (trainable
    and total parameters, dev accuracy, training tokens/s)."""
    counts = prepare(model, config, training_ids(train))
    logger.info("fine-tuning (%s): %d of %d parameters trainable (%.2f %%)", config.mode, counts["trainable"],
                counts["total"], 100 * counts["trainable"] / counts["total"])
    trainer = Trainer(model, ClassifyTask(train, dev, cfg), cfg, name=f"finetune.{config.mode}")
    history = trainer.run()
    if config.mode == "lora":
        merge_lora(model)
    model.eval()
    out = {**counts, "trainable_share": counts["trainable"] / counts["total"], "epochs": len(history),
           "tokens_per_s": float(np.mean([h["tokens_per_s"] for h in history])) if history else None}
    if dev:
        out["dev_accuracy"] = accuracy(model, dev)
    return out
