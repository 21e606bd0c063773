"""ELMo-style bidirectional language model and its contextual vectors (Peters et al. 2018).

A forward LSTM LM reads `<s> w1 .. wn </s>` left to right and predicts each next token; a backward
LSTM LM reads it right to left and predicts each previous token. Both stack `num_layers` LSTMs over
the *same* token representations (a char CNN over the spelling, as in ELMo, or a word embedding) and
share the softmax. For a word w_t the biLM gives L+1 layers of vectors, each 2·dim wide:
layer 0 = [x_t; x_t] (the token representation, doubled to the width of the others) and layer j =
[→h_t^j; ←h_t^j] (the two directions' j-th LSTM layers, concatenated).

A task model mixes them with its own weights (`ScalarMix`):  ELMo_t = γ · Σ_j softmax(s)_j h_t^j,
the biLM frozen; s (one scalar per layer) and γ are learned by the task. Trained with
`models.lm.train.Trainer` (the project's one training loop, whole-sentence batches), early stopping on dev loss.

Saved as `bilm.json` (config, vocabularies) + `model.safetensors`.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from lexiflow.models.char_encoder import CharCNN, CharVocab
from lexiflow.models.errors import InputError, ParameterError
from lexiflow.models.lm.train import SentenceTask, TrainConfig, Trainer, load_module_tensors, module_tensors
from safetensors.torch import load_file, save_file
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

logger = logging.getLogger("lexiflow.elmo")

UNK, BOS, EOS, PAD = 0, 1, 2, 3  # the project's word ids 0..3
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]
IGNORE = -100


@dataclass
class BiLMConfig:
    """The biLM's architecture and its training (`train`: the project's TrainConfig)."""

    token_input: str = "char"  # "char" (char CNN, as ELMo) | "word" (an embedding per vocabulary word)
    dim: int = 128  # token representation and LSTM output width per direction (LSTM projection when hidden_dim differs)
    hidden_dim: int = 256  # LSTM cell size
    num_layers: int = 2
    dropout: float = 0.1
    max_vocab: int = 10000  # output (and word-input) vocabulary: the most frequent words
    min_count: int = 2
    lowercase: bool = False  # lowercase every word first (a biLM trained on lowercased text)
    char_dim: int = 16
    char_filters: int = 64
    char_kernels: tuple[int, ...] = (1, 2, 3, 4, 5)
    train: TrainConfig = field(default_factory=lambda: TrainConfig(epochs=5, batch_size=32, lr=2e-3,
                                                                    clip_grad_norm=5.0, patience=1))

    def validate(self) -> None:
        checks = [
            ("token_input", self.token_input in ("char", "word"), "use 'char' or 'word'"),
            ("dim", self.dim >= 1, "use 1 or more"), ("hidden_dim", self.hidden_dim >= self.dim, "use >= dim"),
            ("num_layers", self.num_layers >= 1, "use 1 or more"),
            ("dropout", 0 <= self.dropout < 1, "use a fraction in [0, 1)"),
            ("max_vocab", self.max_vocab >= 1, "use 1 or more"), ("min_count", self.min_count >= 1, "use 1 or more"),
        ]
        for name, ok, fix in checks:
            if not ok:
                raise ParameterError(f"BiLMConfig.{name}={getattr(self, name)!r} is invalid: {fix}")
        self.train.validate()


def config_from_dict(d: dict) -> BiLMConfig:
    d = dict(d)
    d["char_kernels"] = tuple(d["char_kernels"])
    return BiLMConfig(**{**d, "train": TrainConfig(**d["train"])})


class ScalarMix(nn.Module):
    """γ · Σ_j softmax(s)_j h_j over the first axis of a stack of layers; s starts at 0 (equal weights)."""

    def __init__(self, n_layers: int) -> None:
        super().__init__()
        self.scalars = nn.Parameter(torch.zeros(n_layers))
        self.gamma = nn.Parameter(torch.ones(()))

    def weights(self) -> torch.Tensor:
        return torch.softmax(self.scalars, dim=0)

    def forward(self, layers: torch.Tensor) -> torch.Tensor:
        w = self.weights().to(layers.dtype)
        return self.gamma.to(layers.dtype) * torch.tensordot(w, layers, dims=([0], [0]))


def reverse_padded(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Reverse each (B, T, ...) row's first `lengths[b]` steps, leaving its padding in place."""
    t = torch.arange(x.shape[1], device=x.device)[None, :]
    lens = lengths.to(x.device)[:, None]
    idx = torch.where(t < lens, lens - 1 - t, t)  # (B, T)
    return x.gather(1, idx.view(*idx.shape, *([1] * (x.dim() - 2))).expand_as(x))


def run_lstm(lstm: nn.LSTM, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """A batch-first LSTM over right-padded rows; padding never reaches a real position (packed)."""
    packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
    out, _ = lstm(packed)
    return pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])[0]


class BiLMModule(nn.Module):
    def __init__(self, config: BiLMConfig, vocab_size: int, n_chars: int) -> None:
        super().__init__()
        self.config = config
        d = config.dim
        if config.token_input == "char":
            self.chars = CharCNN(n_chars, config.char_dim, config.char_filters, config.char_kernels)
            self.char_proj = nn.Linear(self.chars.out_dim, d)
        else:
            self.embedding = nn.Embedding(vocab_size, d)
        proj = d if config.hidden_dim != d else 0

        def stack() -> nn.ModuleList:
            return nn.ModuleList(nn.LSTM(d, config.hidden_dim, batch_first=True, proj_size=proj)
                                 for _ in range(config.num_layers))

        self.forward_lstms, self.backward_lstms = stack(), stack()
        self.drop = nn.Dropout(config.dropout)
        self.softmax = nn.Linear(d, vocab_size)  # shared by both directions

    @property
    def n_layers(self) -> int:
        return self.config.num_layers + 1

    @property
    def out_dim(self) -> int:
        return 2 * self.config.dim

    def tokens(self, batch: dict) -> torch.Tensor:
        if self.config.token_input == "char":
            x = self.char_proj(self.chars(batch["chars"]))[batch["inverse"]]  # (B, T, d)
        else:
            x = self.embedding(batch["ids"])
        return x

    def forward(self, batch: dict) -> list[torch.Tensor]:
        """The L+1 layers, each (B, T, 2·dim), over the whole input `<s> w1 .. wn </s>`."""
        lengths = batch["lengths"]
        x = self.tokens(batch)
        layers = [torch.cat([x, x], dim=-1)]
        fwd, bwd = x, reverse_padded(x, lengths)
        for i, (lf, lb) in enumerate(zip(self.forward_lstms, self.backward_lstms, strict=True)):
            f_in, b_in = (self.drop(fwd), self.drop(bwd))
            f_out, b_out = run_lstm(lf, f_in, lengths), run_lstm(lb, b_in, lengths)
            if i > 0:  # residual between LSTM layers (ELMo)
                f_out, b_out = f_out + fwd, b_out + bwd
            fwd, bwd = f_out, b_out
            layers.append(torch.cat([fwd, reverse_padded(bwd, lengths)], dim=-1))
        return layers

    def loss(self, batch: dict) -> tuple[torch.Tensor, int]:
        """Summed NLL of the forward LM (each token from its left) and the backward LM (from its right)."""
        top = self.forward(batch)[-1]
        d = self.config.dim
        ids, lengths = batch["targets"], batch["lengths"]
        fwd_h, bwd_h = self.drop(top[:, :-1, :d]), self.drop(top[:, 1:, d:])
        fwd_y, bwd_y = ids[:, 1:], ids[:, :-1]
        # The backward LM never predicts from a padding position: mask targets at positions >= length - 1.
        t = torch.arange(ids.shape[1] - 1, device=ids.device)[None, :]
        valid = t < (lengths.to(ids.device)[:, None] - 1)
        fwd_y = fwd_y.masked_fill(~valid, IGNORE)
        bwd_y = bwd_y.masked_fill(~valid, IGNORE)
        logits = self.softmax(torch.cat([fwd_h, bwd_h], dim=0)).float()
        nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.cat([fwd_y, bwd_y]).reshape(-1),
                              ignore_index=IGNORE, reduction="sum")
        return nll, int(valid.sum()) * 2


class BiLM:
    """`BiLM(BiLMConfig()).fit(sentences, dev=...)`; `layers(sentences)` gives the L+1 layers per word."""

    def __init__(self, config: BiLMConfig | None = None) -> None:
        self.config = config or BiLMConfig()
        self.config.validate()
        self.words: list[str] = []
        self.chars: CharVocab | None = None
        self.module_: BiLMModule | None = None
        self.history_: list[dict] = []

    # ---- data
    def _build_vocab(self, sentences: Sequence[Sequence[str]]) -> None:
        counts = Counter(w for s in sentences for w in s)
        top = [w for w, n in counts.most_common() if n >= self.config.min_count and w not in SPECIALS]
        self.words = SPECIALS + top[: self.config.max_vocab]
        self.chars = CharVocab.build(counts)
        self._index = {w: i for i, w in enumerate(self.words)}

    def batch(self, sentences: Sequence[Sequence[str]], device: torch.device | str = "cpu") -> dict:
        """Padded `<s> w1 .. wn </s>` rows: word ids (targets; the input with token_input='word'),
        char ids of the batch's distinct forms and each position's row among them, lengths."""
        lower = self.config.lowercase
        rows = [["<s>", *([w.lower() for w in s] if lower else s), "</s>"] for s in sentences]
        lengths = torch.tensor([len(r) for r in rows])
        ids = torch.full((len(rows), int(lengths.max())), PAD, dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor([self._index.get(w, UNK) for w in r])
        batch = {"ids": ids.to(device), "targets": ids.to(device), "lengths": lengths}
        if self.config.token_input == "char":
            forms: dict[str, int] = {}
            inverse = torch.zeros_like(ids)
            for i, r in enumerate(rows):
                inverse[i, : len(r)] = torch.tensor([forms.setdefault(w, len(forms)) for w in r])
            batch["chars"] = self.chars.encode(list(forms), boundary=True).to(device)
            batch["inverse"] = inverse.to(device)
        return batch

    # ---- training
    def fit(self, sentences: Sequence[Sequence[str]], dev: Sequence[Sequence[str]] | None = None) -> BiLM:
        sents = _check_sentences(sentences, "sentences")
        if self.config.lowercase:
            sents = [[w.lower() for w in s] for s in sents]
        dev_s = _check_sentences(dev, "dev") if dev else None
        cfg = self.config
        self._build_vocab(sents)
        torch.manual_seed(cfg.train.seed)
        self.module_ = BiLMModule(cfg, len(self.words), len(self.chars))
        module = self.module_

        def batch_loss(idx: np.ndarray, device: torch.device) -> tuple[torch.Tensor, int]:
            return module.loss(self.batch([sents[i] for i in idx], device))

        def dev_loss() -> tuple[float, int]:
            return self.perplexity_loss(dev_s), 1  # the mean NLL (both directions) per predicted token

        task = SentenceTask([len(s) + 2 for s in sents], batch_loss, cfg.train, dev_loss if dev_s else None,
                            "elmo.train", valid_metric="ppl")
        self.history_ = Trainer(module, task, cfg.train, name="elmo.train").run()
        return self

    @torch.no_grad()
    def perplexity_loss(self, sentences: Sequence[Sequence[str]], batch_size: int = 64) -> float:
        """Mean NLL per predicted token (both directions) on sentences."""
        module = self.module_
        device = next(module.parameters()).device
        was = module.training
        module.eval()
        total, count = 0.0, 0
        for lo in range(0, len(sentences), batch_size):
            nll, n = module.loss(self.batch(sentences[lo : lo + batch_size], device))
            total, count = total + float(nll), count + n
        module.train(was)
        return total / max(count, 1)

    @torch.no_grad()
    def layers(self, sentences: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """Per sentence an (L+1, n, 2·dim) array: the layers at the words (boundaries left out)."""
        module = self.module_
        device = next(module.parameters()).device
        module.eval()
        out = torch.stack(module(self.batch(sentences, device)))  # (L+1, B, T, 2d)
        return [out[:, i, 1 : len(s) + 1].float().cpu().numpy() for i, s in enumerate(sentences)]

    # ---- persistence
    def state(self) -> dict:
        return {"config": asdict(self.config), "words": self.words, "chars": self.chars.chars,
                "max_chars": self.chars.max_chars, "history": self.history_}

    @classmethod
    def from_state(cls, state: dict) -> BiLM:
        bilm = cls(config_from_dict(state["config"]))
        bilm.words = state["words"]
        bilm._index = {w: i for i, w in enumerate(bilm.words)}
        bilm.chars = CharVocab(state["chars"], state["max_chars"])
        bilm.history_ = state.get("history", [])
        bilm.module_ = BiLMModule(bilm.config, len(bilm.words), len(bilm.chars))
        bilm.module_.eval()
        return bilm

    def save(self, directory: str | Path) -> None:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        (d / "bilm.json").write_text(json.dumps(self.state(), indent=1))
        save_file(module_tensors(self.module_), str(d / "model.safetensors"))

    @classmethod
    def load(cls, directory: str | Path) -> BiLM:
        d = Path(directory)
        if not (d / "bilm.json").exists():
            raise InputError(f"{d}: no bilm.json; give the folder a BiLM was saved to")
        bilm = cls.from_state(json.loads((d / "bilm.json").read_text()))
        load_module_tensors(bilm.module_, load_file(str(d / "model.safetensors")), str(d / "model.safetensors"))
        return bilm


def _check_sentences(sentences, name: str) -> list[list[str]]:
    out = []
    for i, s in enumerate(sentences or []):
        if isinstance(s, str) or not all(isinstance(w, str) and w for w in s):
            raise InputError(f"{name}[{i}]: a sentence must be a list of non-empty word strings")
        if s:
            out.append(list(s))
    if not out:
        raise InputError(f"{name}: no non-empty sentence; give lists of word strings")
    return out
