"""A BERT-style Transformer encoder and its masked-LM pretraining (Devlin et al. 2019; notes 000, 002, 004).

    input:    [CLS] sentence A [SEP] (sentence B [SEP])       WordPiece ids, specials BERT_SPECIALS
    x       = E[token] + P[position] (+ S[segment] with NSP)  learned positions, segment 0 for A, 1 for B
    h       = Encoder(x, padding mask)                        models/transformer_blocks.py, unmasked attention
    MLM     = softmax(LN(GELU(W h_i)) E^T + b) at the chosen positions (models/mlm.py; output tied to E)
    NSP     = softmax(W_nsp tanh(W_p h_[CLS])) IsNext / NotNext (optional, off by default)

NSP is off by default: RoBERTa's ablations (Liu et al. 2019, in the notes) find it does not help, and with
short single-sentence inputs (EWT, WikiText lines) the budget is better spent on masked tokens.
Training goes through the one loop (`models.lm.train.Trainer`): checkpoints and resume, device, bf16
autocast on CUDA, progress with rate and ETA, early stopping on the held-out masked-LM loss. Masks are drawn
per batch from a generator seeded by (seed, epoch, batch), so every epoch sees new masks (dynamic masking)
and a resumed run draws the masks an uninterrupted run would. Held-out figures, on fixed masks: accuracy and
perplexity at the [MASK] positions, and apart at the random and the unchanged ones (where the answer is in the
input, so copying scores), beside the unigram perplexity of the same tokens; and the pseudo-perplexity (Salazar
et al. 2020) exp(-1/N Σ_i log P(w_i | w_\\i)), each token masked on its own, beside its unigram perplexity.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from lexiflow.models.encoder_config import CLS_ID, MASK_ID, PAD_ID, SEP_ID, EncoderConfig
from lexiflow.models.errors import InputError, ParameterError
from lexiflow.models.lm.train import (
    IGNORE,
    TrainConfig,
    Trainer,
    TrainTask,
    autocast,
    length_batches,
    load_module_tensors,
    module_tensors,
    to_device,
)
from lexiflow.models.mlm import mask_tokens
from lexiflow.models.transformer_blocks import Embeddings, Encoder
from safetensors.torch import load_file, save_file
from torch import nn

logger = logging.getLogger("lexiflow.encoder")

# WordPiece special tokens at ids 0..4: the tokenizers' roles (unk 0, bos 1, eos 2, pad 3) are BERT's
# [UNK], [CLS], [SEP], [PAD]; [MASK] is 4. A decoder-only LM trained with the same tokenizer reads
# [CLS] as <s> and [SEP] as </s>.
BERT_SPECIALS = ("[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]")




class EncoderModel(nn.Module):
    """forward(ids (B, T), segments (B, T) or None) -> hidden states (B, T, D); [PAD] keys are masked."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        config.validate()
        self.config = c = config
        self.embed = Embeddings(c.vocab_size, c.d_model, c.max_len, "learned", c.dropout)
        if c.nsp:  # segments only mean something with sentence pairs; without NSP a fixed vector is noise
            self.segment = nn.Embedding(2, c.d_model)
            nn.init.normal_(self.segment.weight, std=0.02)
        self.encoder = Encoder(c.blocks(), c.n_layers)
        self.mlm_dense = nn.Sequential(nn.Linear(c.d_model, c.d_model), nn.GELU(), nn.LayerNorm(c.d_model))
        self.mlm_bias = nn.Parameter(torch.zeros(c.vocab_size))
        if c.nsp:
            self.pooler = nn.Sequential(nn.Linear(c.d_model, c.d_model), nn.Tanh())
            self.nsp_head = nn.Linear(c.d_model, 2)
        if c.init == "bert":
            bert_init(self)

    def forward(self, ids: torch.Tensor, segments: torch.Tensor | None = None) -> torch.Tensor:
        x = self.embed(ids)
        if self.config.nsp:
            x = x + (self.segment.weight[0] if segments is None else self.segment(segments))
        return self.encoder(x, ids != PAD_ID)

    def mlm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., D) -> (..., V), the output matrix tied to the token embedding."""
        return self.mlm_dense(hidden) @ self.embed.token.weight.t() + self.mlm_bias

    def nsp_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.nsp_head(self.pooler(hidden[:, 0]))


def bert_init(module: nn.Module) -> None:
    """BERT's initialisation (Devlin et al. 2019; HF `BertPreTrainedModel._init_weights`): every linear and
    embedding weight N(0, 0.02), biases zero, LayerNorms the identity."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)
        if isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


# ---------------------------------------------------------------------------------------------
# data


def with_specials(sentence: np.ndarray, max_len: int, second: np.ndarray | None = None) -> tuple[list[int], list[int]]:
    """([CLS] a [SEP] (b [SEP]) ids, segment ids), a and b cut so the whole fits in max_len."""
    a = [int(i) for i in sentence]
    b = [] if second is None else [int(i) for i in second]
    budget = max_len - 2 - (1 if second is not None else 0)
    while len(a) + len(b) > budget:  # trim the longer one, as BERT does
        (a if len(a) >= len(b) else b).pop()
    ids = [CLS_ID, *a, SEP_ID] + ([*b, SEP_ID] if second is not None else [])
    return ids, [0] * (len(a) + 2) + [1] * (len(ids) - len(a) - 2)


def pad_rows(rows: Sequence[Sequence[int]], value: int) -> torch.Tensor:
    t = max(len(r) for r in rows)
    out = torch.full((len(rows), t), value, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.as_tensor(r, dtype=torch.long)
    return out


def check_sentences(sentences: Sequence[np.ndarray], vocab_size: int, what: str) -> list[np.ndarray]:
    out = [np.asarray(s, dtype=np.int64) for s in sentences if len(s)]
    if not out:
        raise InputError(f"{what} is empty: give at least one non-empty sentence of token ids")
    hi = max(int(s.max()) for s in out)
    lo = min(int(s.min()) for s in out)
    if lo < 0 or hi >= vocab_size:
        raise InputError(f"{what} holds token id {lo if lo < 0 else hi} outside [0, {vocab_size}): encode with "
                         "the WordPiece vocabulary the encoder was configured for")
    return out


class MLMTask(TrainTask):
    """Masked-LM (+ NSP) loss on length-bucketed batches of single sentences (or sentence pairs with NSP)."""

    def __init__(self, train: list[np.ndarray], valid: list[np.ndarray] | None, config: EncoderConfig,
                 cfg: TrainConfig) -> None:
        self.train, self.valid, self.config, self.cfg = train, valid, config, cfg
        self.lengths = np.array([min(len(s) + 2, config.max_len) for s in train])
        n_batches = max(1, -(-len(train) // cfg.batch_size))
        self.tokens_per_step = float(self.lengths.sum()) * (2 if config.nsp else 1) / n_batches

    def epoch_batches(self, epoch: int) -> list[tuple[int, int, np.ndarray]]:
        return [(epoch, b, idx) for b, idx in enumerate(length_batches(self.lengths, self.cfg.batch_size, self.cfg.seed,
                                                                        epoch))]

    def inputs(self, sentences: list[np.ndarray], idx: np.ndarray, seed: Sequence[int]):
        """ids, segments, MLM inputs and labels, NSP labels (None without NSP) of one batch."""
        c = self.config
        nsp = None
        if c.nsp:  # B is the next sentence of the corpus half the time, a random one otherwise
            rng = np.random.default_rng(list(seed))
            is_next = rng.random(len(idx)) < 0.5
            nxt = [int(i) + 1 if ok and int(i) + 1 < len(sentences) else int(rng.integers(len(sentences)))
                   for i, ok in zip(idx, is_next, strict=True)]
            pairs = [with_specials(sentences[int(i)], c.max_len, sentences[j]) for i, j in zip(idx, nxt, strict=True)]
            nsp = torch.tensor([int(ok and int(i) + 1 < len(sentences)) for i, ok in zip(idx, is_next, strict=True)])
        else:
            pairs = [with_specials(sentences[int(i)], c.max_len) for i in idx]
        ids = pad_rows([p[0] for p in pairs], PAD_ID)
        segments = pad_rows([p[1] for p in pairs], 0)
        g = torch.Generator().manual_seed(int(np.random.default_rng(list(seed)).integers(2**62)))
        inputs, labels = mask_tokens(ids, mask_id=MASK_ID, vocab_size=c.vocab_size, special_ids=c.specials,
                                     probability=c.mask_probability, generator=g)
        return inputs, segments, labels, nsp

    def batch_loss(self, fwd, inputs, segments, labels, nsp, device) -> tuple[torch.Tensor, int]:
        model = getattr(fwd, "module", fwd)  # DDP / compiled wrappers
        hidden = fwd(to_device(inputs, device), to_device(segments, device))
        # The chosen positions found on the host: a boolean index on the device would wait for it every step.
        chosen = (labels != IGNORE).flatten().nonzero().squeeze(1)
        nll = F.cross_entropy(model.mlm_logits(hidden.flatten(0, 1)[to_device(chosen, device)]).float(),
                              to_device(labels.flatten()[chosen], device), reduction="sum")
        n = len(chosen)
        if nsp is not None:  # NSP counts as one more predicted token per pair
            nll = nll + F.cross_entropy(model.nsp_logits(hidden).float(), to_device(nsp, device), reduction="sum")
            n += len(nsp)
        return nll, n

    def loss(self, fwd, batch, state, device):
        epoch, b, idx = batch
        inputs, segments, labels, nsp = self.inputs(self.train, idx, (self.cfg.seed, epoch, b))
        nll, n = self.batch_loss(fwd, inputs, segments, labels, nsp, device)
        return nll, n, int((inputs != PAD_ID).sum()), None

    def valid_batches(self):
        """The held-out batches with fixed masks (the same every epoch and every run)."""
        step = self.cfg.eval_batch_size * 8
        for b, start in enumerate(range(0, len(self.valid), step)):
            idx = np.arange(start, min(start + step, len(self.valid)))
            yield self.inputs(self.valid, idx, (self.cfg.seed, 2**31, b))  # 2**31: an epoch no training reaches

    @torch.no_grad()
    def evaluate(self, module, device, precision):
        if not self.valid:
            return None
        was = module.training
        module.eval()
        total, count = 0.0, 0
        for inputs, segments, labels, nsp in self.valid_batches():
            with autocast(device, precision):
                nll, n = self.batch_loss(module, inputs, segments, labels, nsp, device)
            total, count = total + float(nll), count + n
        module.train(was)
        return total, count


# ---------------------------------------------------------------------------------------------
# held-out figures


POSITION_KINDS = ("mask", "random", "unchanged")  # BERT's 80 / 10 / 10 of the chosen positions


def position_kinds(inputs: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
    """Boolean masks of the chosen positions by what the input shows there: [MASK], a random token, or the token
    itself (a random draw of the same token counts as unchanged: the answer is in the input)."""
    chosen = labels != IGNORE
    return {"mask": chosen & (inputs == MASK_ID), "random": chosen & (inputs != MASK_ID) & (inputs != labels),
            "unchanged": chosen & (inputs == labels)}


@torch.no_grad()
def masked_lm_scores(model: EncoderModel, task: MLMTask, device: torch.device,
                     prior: torch.Tensor | None = None) -> dict[str, float]:
    """Held-out figures on fixed masks: accuracy and perplexity at the [MASK] positions, at the random-replaced
    and at the unchanged ones (where copying the input scores), the mean loss over all chosen positions, and,
    given `prior` (log P(token) of the training text), the unigram perplexity of the [MASK] positions' tokens:
    the figure a model that ignores the context reaches."""
    model.eval()
    sums = {k: np.zeros(4) for k in POSITION_KINDS}  # correct, nll, count, unigram nll
    total_nll = 0.0
    for inputs, segments, labels, _ in task.valid_batches():
        chosen = labels != IGNORE
        hidden = model(inputs.to(device), segments.to(device))
        logits = model.mlm_logits(hidden[chosen.to(device)]).float()
        y = labels[chosen]
        nll = F.cross_entropy(logits, y.to(device), reduction="none").cpu().double()
        hit = (logits.argmax(-1).cpu() == y).double()
        uni = -prior[y].double() if prior is not None else torch.zeros_like(nll)
        total_nll += float(nll.sum())
        for kind, where in position_kinds(inputs, labels).items():
            sel = where[chosen]
            sums[kind] += [float(hit[sel].sum()), float(nll[sel].sum()), int(sel.sum()), float(uni[sel].sum())]
    out: dict[str, float] = {}
    for kind, (correct, nll, n, _) in sums.items():
        out |= {f"{kind}_accuracy": correct / max(n, 1), f"{kind}_perplexity": math.exp(nll / max(n, 1)),
                f"{kind}_tokens": int(n)}
    out["masked_lm_loss"] = total_nll / max(sum(int(v[2]) for v in sums.values()), 1)
    if prior is not None:
        out["unigram_perplexity"] = math.exp(sums["mask"][3] / max(sums["mask"][2], 1))
    return out


def unigram_perplexity(prior: torch.Tensor, sentences: Sequence[np.ndarray]) -> float:
    """exp(-1/N Σ log P(w)) of every token of `sentences` under the unigram `prior`: pseudo-perplexity's baseline."""
    ids = torch.as_tensor(np.concatenate(sentences), dtype=torch.long)
    return math.exp(-float(prior[ids].double().mean()))


@torch.no_grad()
def pseudo_perplexity(model: EncoderModel, sentences: Sequence[np.ndarray], device: torch.device,
                      batch_tokens: int = 4096) -> float:
    """exp(-1/N Σ_i log P(w_i | sentence with w_i alone masked)) over every token of `sentences`
    (Salazar et al. 2020): one copy of the sentence per token, batched."""
    model.eval()
    c = model.config
    nll, n = 0.0, 0
    for s in sentences:
        ids, _ = with_specials(s, c.max_len)
        t = len(ids)
        positions = torch.arange(1, t - 1)
        for start in range(0, len(positions), max(1, batch_tokens // t)):
            pos = positions[start:start + max(1, batch_tokens // t)]
            batch = torch.tensor(ids).repeat(len(pos), 1)
            batch[torch.arange(len(pos)), pos] = MASK_ID
            hidden = model(batch.to(device))
            logits = model.mlm_logits(hidden[torch.arange(len(pos)), pos.to(device)]).float()
            nll += float(F.cross_entropy(logits, torch.tensor(ids)[pos].to(device), reduction="sum"))
            n += len(pos)
    return math.exp(nll / max(n, 1))


def log_prior(sentences: Sequence[np.ndarray], vocab_size: int) -> torch.Tensor:
    """log P(token) over `sentences` (add-one smoothed): the MLM's output bias at init. Adam moves a weight
    ~lr per step, so a zero bias needs thousands of steps to reach the unigram log-odds (a plateau near
    perplexity 1000 for 3 epochs of our corpus); started there, the steps go to the context."""
    counts = np.bincount(np.concatenate(sentences), minlength=vocab_size)[:vocab_size] + 1.0
    return torch.as_tensor(np.log(counts / counts.sum()), dtype=torch.float32)


# ---------------------------------------------------------------------------------------------
# the estimator


class MaskedLM:
    """`MaskedLM(EncoderConfig(V), TrainConfig(...)).fit(train_sentences, valid_sentences)`; sentences are
    WordPiece id arrays without [CLS]/[SEP] (tokenizer built with special_tokens=BERT_SPECIALS)."""

    def __init__(self, config: EncoderConfig, train: TrainConfig | None = None, tokenizer=None) -> None:
        self.config, self.train_config = config, train or TrainConfig()
        self.tokenizer = tokenizer  # the WordPiece the ids come from, saved alongside when given
        self.model: EncoderModel | None = None
        self.history: list[dict] = []
        self.metrics: dict = {}

    def fit(self, train_sentences: Sequence[np.ndarray], valid_sentences: Sequence[np.ndarray] | None = None,
            *, pppl_sentences: int = 200, on_step=None) -> MaskedLM:
        c, cfg = self.config, self.train_config
        c.validate()
        cfg.validate()  # all checks before any work
        train = check_sentences(train_sentences, c.vocab_size, "pretraining sentences")
        valid = check_sentences(valid_sentences, c.vocab_size, "held-out sentences") if valid_sentences else None
        torch.manual_seed(cfg.seed)
        self.model = EncoderModel(c)
        prior = log_prior(train, c.vocab_size)
        with torch.no_grad():
            self.model.mlm_bias.copy_(prior)
        task = MLMTask(train, valid, c, cfg)
        trainer = Trainer(self.model, task, cfg, name="mlm.pretrain", on_step=on_step)
        self.history = trainer.run()
        self.metrics = {"parameters": self.n_parameters, "epochs": len(self.history),
                        "tokens_per_s": self.history[-1]["tokens_per_s"] if self.history else None}
        if valid:
            self.metrics |= masked_lm_scores(self.model, task, trainer.device, prior)
            self.metrics |= {"pseudo_perplexity": pseudo_perplexity(self.model, valid[:pppl_sentences], trainer.device),
                             "unigram_pseudo_perplexity": unigram_perplexity(prior, valid[:pppl_sentences])}
        self.model.to("cpu").eval()
        return self

    @property
    def n_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters()) if self.model is not None else 0

    def save(self, path: str | Path) -> None:
        if self.model is None:
            raise ParameterError("MaskedLM.save: fit or load the model first")
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        save_file(module_tensors(self.model), str(path / "encoder.safetensors"))
        (path / "config.json").write_text(json.dumps({"model": asdict(self.config), "train": asdict(self.train_config),
                                                      "metrics": self.metrics}, indent=2))
        if self.tokenizer is not None:  # artifacts are flat folders: the tokenizer's files as tokenizer-<name>
            with tempfile.TemporaryDirectory() as tmp:
                self.tokenizer.save(tmp)
                for f in Path(tmp).iterdir():
                    shutil.move(f, path / f"tokenizer-{f.name}")

    @classmethod
    def load(cls, path: str | Path) -> MaskedLM:
        path = Path(path)
        if not (path / "config.json").exists():
            raise InputError(f"{path}: no config.json; not a saved encoder (MaskedLM.save writes one)")
        meta = json.loads((path / "config.json").read_text())
        model_cfg = meta["model"] | {"specials": tuple(meta["model"]["specials"])}
        self = cls(EncoderConfig(**model_cfg), TrainConfig(**meta["train"]))
        self.model = EncoderModel(self.config)
        load_module_tensors(self.model, load_file(str(path / "encoder.safetensors")), str(path / "encoder.safetensors"))
        self.model.eval()
        self.metrics = meta.get("metrics", {})
        if (path / "tokenizer-config.json").exists():
            from lexiflow.models.tokenizers.wordpiece import WordPiece

            with tempfile.TemporaryDirectory() as tmp:
                for f in path.glob("tokenizer-*"):
                    shutil.copy(f, Path(tmp) / f.name.removeprefix("tokenizer-"))
                self.tokenizer = WordPiece.load(tmp)
        return self
