"""Shared base of the neural LMs: the module interface, the estimator (fit / log_probs / perplexity),
pretrained-embedding init and freezing, and the `lm` artifact (save / load).

Every neural LM module maps token ids (B, T) and a carried state to next-token logits (B, T, V) and
the new state, so one training loop (`models.lm.train`) and one scorer serve the FFNN, the RNNs and
the Transformer. The estimator follows scikit-learn: parameters in `__init__`, `fit` returns self,
learned state ends with `_`.

The `lm` artifact is a directory of exactly:
- `config.json`: {"kind", "config" (the model's dataclass), "train" (TrainConfig), "pretrained_init"}
- `model.safetensors`: the weights (tied matrices stored once)
- `metrics.parquet`: one row per epoch: epoch, step, train/valid loss and perplexity, tokens/s, seconds, steps
  skipped for a non-finite loss or gradient
- `loss_curve.png`: train and valid loss per epoch
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import polars as pl
import torch
import torch.nn.functional as F
from lexiflow.models.device import resolve_device
from lexiflow.models.errors import InputError, ParameterError
from lexiflow.models.estimator import Estimator
from lexiflow.models.heap import reuse_freed_memory
from lexiflow.models.lm import train as training
from lexiflow.models.lm.module import LMModule
from lexiflow.models.lm.stream import pad_sequences, to_stream
from lexiflow.models.lm.train import TrainConfig
from lexiflow.models.plotting import pyplot
from lexiflow.models.progress import Progress
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

METRIC_COLUMNS = {
    "epoch": pl.Int64, "step": pl.Int64, "train_loss": pl.Float64, "train_ppl": pl.Float64,
    "valid_loss": pl.Float64, "valid_ppl": pl.Float64, "tokens_per_s": pl.Float64, "seconds": pl.Float64,
    "skipped_steps": pl.Int64,
}





def init_embeddings(embedding: nn.Embedding, pretrained: np.ndarray | None, freeze: bool) -> None:
    """Copy pretrained rows (V x d, aligned to vocabulary ids) into the embedding, then maybe freeze it.

    Rows that are entirely NaN mark words the embeddings artifact lacks: they keep their random init.
    Freezing freezes the whole matrix (and, with weight tying, the output layer that shares it).
    """
    weight = embedding.weight
    if pretrained is not None:
        arr = np.asarray(pretrained, dtype=np.float32)
        if arr.shape != tuple(weight.shape):
            raise ParameterError(f"embeddings has shape {arr.shape} but the model needs {tuple(weight.shape)} "
                                 "(vocab_size x embedding dim): align rows to vocabulary ids and match the dim")
        present = ~np.isnan(arr).all(axis=1)
        if np.isnan(arr[present]).any():
            raise ParameterError("embeddings has rows with some NaN values: a row is either all NaN "
                                 "(word missing, kept random) or all finite")
        with torch.no_grad():
            idx = torch.from_numpy(np.flatnonzero(present))
            weight[idx] = torch.from_numpy(arr[present]).to(weight.device)
    weight.requires_grad_(not freeze)


class NeuralLM(Estimator):
    """Estimator base: subclasses set `kind`, `config_class` and `_build()` (the kinds: `models.lm.registry`)."""

    kind: ClassVar[str] = ""
    config_class: ClassVar[type]

    def __init__(self, config: Any, train: TrainConfig | None = None, embeddings: np.ndarray | None = None) -> None:
        self.config = config
        self.train = train if train is not None else TrainConfig()
        self.embeddings = embeddings

    # -- to implement ------------------------------------------------------------------------
    def _build(self) -> LMModule:
        raise NotImplementedError

    # -- construction ------------------------------------------------------------------------
    def _new_module(self) -> LMModule:
        torch.manual_seed(self.train.seed)  # the same seed gives the same initial weights
        module = self._build()
        init_embeddings(module.embedding, self.embeddings, self.config.freeze_embeddings)
        return module

    @property
    def _window(self) -> int:
        mc = self.module_.max_context if hasattr(self, "module_") else None
        return self.train.bptt if mc is None else min(self.train.bptt, mc)

    def fit(self, train_sentences: Sequence[np.ndarray], valid_sentences: Sequence[np.ndarray] | None = None, *,
            on_step: Callable[[int, float], None] | None = None,
            progress: Callable[[float | None], None] | None = None) -> NeuralLM:
        """Train with the loop of `models.lm.train` (resuming from `train.checkpoint_dir` when a checkpoint
        is there); per-epoch metrics land in `metrics_`."""
        c = self.config
        torch.manual_seed(self.train.seed)
        stream = to_stream(train_sentences, c.bos_id, c.eos_id, c.vocab_size, "train_sentences")
        valid = None if valid_sentences is None else to_stream(
            valid_sentences, c.bos_id, c.eos_id, c.vocab_size, "valid_sentences")
        self.module_ = self._new_module()
        with reuse_freed_memory():  # each step's large temporaries reuse the last step's memory (CPU: ~25 % faster)
            history = training.train(self.module_, stream, valid, self.train, bos_id=c.bos_id, pad_id=c.pad_id,
                                     window=self._window, on_step=on_step, progress=progress)
        self.metrics_ = pl.DataFrame(history, schema=METRIC_COLUMNS) if history else pl.DataFrame(
            schema=METRIC_COLUMNS)
        self.device_ = next(self.module_.parameters()).device  # under torchrun, this rank's GPU
        return self

    # -- scoring -----------------------------------------------------------------------------
    @torch.no_grad()
    def log_probs_batch(self, contexts: Sequence[Sequence[int]]) -> np.ndarray:
        """(B, V) natural-log next-token distributions, one per context (each starting with <s>)."""
        self._check_fitted()
        c, module = self.config, self.module_
        module.eval()
        seqs = []
        for ctx in contexts:
            a = np.asarray(ctx, dtype=np.int64).ravel()
            if len(a) == 0:
                a = np.array([c.bos_id], dtype=np.int64)
            if module.max_context is not None:
                a = a[-self._window :]  # a Transformer sees the last tokens of the window it was trained on
            if a.min() < 0 or a.max() >= c.vocab_size:
                raise InputError(f"context holds an id outside [0, {c.vocab_size})")
            seqs.append(a)
        x = pad_sequences(seqs, c.pad_id).to(self.device_)
        last = torch.tensor([len(s) - 1 for s in seqs], device=self.device_)
        with training.autocast(self.device_, self.train.precision):
            logits, _ = module(x, None)  # right padding never reaches earlier positions (causal)
        out = F.log_softmax(logits[torch.arange(len(seqs), device=self.device_), last].float(), dim=-1)
        return out.cpu().numpy()

    def log_probs(self, context: Sequence[int]) -> np.ndarray:
        """(V,) natural-log next-token distribution given the preceding ids (starting with <s>)."""
        return self.log_probs_batch([context])[0]

    def perplexity(self, sentences: Sequence[np.ndarray], *, carry: bool = False,
                   progress: Callable[[float | None], None] | None = None) -> float:
        """exp(mean NLL) over every word and every `</s>` (never `<s>`/`<pad>`).

        carry=False (default): each sentence is scored on its own from `<s>`, like the n-gram models
        and `log_probs` (a Transformer: in windows of the min(bptt, max_len) tokens it was trained on,
        so a longer sentence's later windows start without context). carry=True: the sentences form
        one stream `<s> s1 </s> <s> s2 </s> ...` cut into `eval_batch_size` rows, the state carried
        across sentences (the usual WikiText evaluation); the stream's tail beyond a whole number of
        rows is not scored, so the count can be a little smaller than with carry=False.
        """
        nll, count = self.score(sentences, carry=carry, progress=progress)
        return training.perplexity(nll / max(count, 1))  # inf for a diverged model, as n-gram zeros give

    def score(self, sentences: Sequence[np.ndarray], *, carry: bool = False,
              progress: Callable[[float | None], None] | None = None) -> tuple[float, int]:
        """Summed NLL (nats) and number of predicted tokens; see `perplexity`. Progress (sentences, rate,
        ETA) is logged and fed to `progress(fraction)`."""
        self._check_fitted()
        c, cfg = self.config, self.train
        stream = to_stream(sentences, c.bos_id, c.eos_id, c.vocab_size)
        if carry:
            data = training.batchify(stream, min(cfg.eval_batch_size, max(1, len(stream) // 2)))
            return training.evaluate(self.module_, data, max(self._window, 256) if self.module_.max_context is None
                                     else self._window, self.device_, cfg.precision, c.bos_id, c.pad_id)
        seqs = [np.concatenate(([c.bos_id], np.asarray(s, dtype=np.int64).ravel(), [c.eos_id])) for s in sentences]
        order = np.argsort([len(s) for s in seqs], kind="stable")  # similar lengths share a batch: less padding
        total, count = 0.0, 0
        batch = max(1, cfg.eval_batch_size * 4)
        with Progress("lm.perplexity", total=len(order), unit="sentences", callback=progress) as report:
            for start in range(0, len(order), batch):
                chunk = [seqs[i] for i in order[start : start + batch]]
                data = pad_sequences(chunk, c.pad_id)
                window = data.shape[1] if self.module_.max_context is None else self._window
                nll, n = training.evaluate(self.module_, data, window, self.device_, cfg.precision, c.bos_id,
                                           c.pad_id)
                total, count = total + nll, count + n
                report.update(len(chunk))
        return total, count

    # -- the lm artifact ---------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        """Write config.json, model.safetensors, metrics.parquet and loss_curve.png into `path`."""
        self._check_fitted()
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        config = {"kind": self.kind, "config": asdict(self.config), "train": asdict(self.train),
                  "pretrained_init": self.embeddings is not None}
        (path / "config.json").write_text(json.dumps(config, indent=2))
        save_file(training.module_tensors(self.module_), str(path / "model.safetensors"))
        self.metrics_.write_parquet(path / "metrics.parquet")
        plot_loss_curve(self.metrics_, path / "loss_curve.png", title=f"{self.kind} LM")

    @classmethod
    def load(cls, path: str | Path, device: str = "cpu") -> NeuralLM:
        """Read an `lm` artifact directory written by `save` of this class (any kind: `models.lm.registry.load`)."""
        path = Path(path)
        if not (path / "config.json").exists():
            raise InputError(f"{path / 'config.json'} is missing: is {path} an lm artifact?")
        try:
            meta = json.loads((path / "config.json").read_text())
            if meta["kind"] != cls.kind:
                raise InputError(f"{path / 'config.json'} holds kind {meta['kind']!r}, not a {cls.__name__}")
            config = from_dict(cls.config_class, meta["config"], path / "config.json")
            train = from_dict(TrainConfig, meta["train"], path / "config.json")
            lm = cls(config, train)
            lm.module_ = lm._build()
            lm.module_.embedding.weight.requires_grad_(not config.freeze_embeddings)
            training.load_module_tensors(lm.module_, load_file(str(path / "model.safetensors")),
                                         str(path / "model.safetensors"))
            lm.metrics_ = pl.read_parquet(path / "metrics.parquet")
        except ParameterError:  # a ValueError of ours: already names what is wrong
            raise
        except (OSError, ValueError, KeyError, TypeError, pl.exceptions.PolarsError, SafetensorError) as e:
            raise InputError(f"{path}: damaged lm artifact ({type(e).__name__}: {e}); rebuild it, "
                             "or check it with `lexiflow artifacts verify --full`") from e
        lm.device_ = resolve_device(device)
        lm.module_.to(lm.device_).eval()
        return lm

    @property
    def n_parameters(self) -> int:
        """Trainable + frozen parameters, tied matrices counted once."""
        self._check_fitted()
        return sum(p.numel() for p in self.module_.parameters())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config!r})"


def from_dict(klass: type, values: dict, where: Path) -> Any:
    """A dataclass from a saved dict, refusing fields it does not know (a newer writer's)."""
    names = {f.name for f in fields(klass)}
    unknown = set(values) - names
    if unknown:
        raise InputError(f"{where} has unknown {klass.__name__} fields {sorted(unknown)}: written by a newer version?")
    return klass(**values)


def plot_loss_curve(metrics: pl.DataFrame, out: Path, title: str = "LM") -> None:
    """Train (and valid, when present) loss per epoch as a PNG."""
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(5, 3.5), dpi=100)
    if metrics.height:
        ax.plot(metrics["epoch"], metrics["train_loss"], marker="o", label="train")
        if metrics["valid_loss"].drop_nulls().len():
            ax.plot(metrics["epoch"], metrics["valid_loss"], marker="o", label="valid")
        ax.legend()
    ax.set_xlabel("epoch")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)

