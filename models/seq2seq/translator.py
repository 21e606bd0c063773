"""The translation estimator: tokenizers + an encoder–decoder + the shared training loop + decoding + BLEU.

    tr = Translator("rnn", RNNSeq2SeqConfig(attention="additive"), TokenizerConfig("word"), TrainConfig(epochs=5))
    tr.fit(train_src, train_tgt, valid=(valid_src, valid_tgt))
    tr.translate(["I am cold."], beam_width=5)            # -> ["J'ai froid."]
    tr.save(path); Translator.load(path)

Training is teacher forcing (the decoder reads the reference prefix <s> y_1 .. y_{t-1} and predicts y_t;
the loss is the mean cross-entropy per target token, </s> included) through `models.lm.train.Trainer`
(checkpoints/resume, device, bf16 autocast on CUDA, progress, early stopping on validation loss).
Batches hold `TrainConfig.batch_size` pairs of similar source length (pairs shuffled per epoch with the
epoch's seed, sorted by length within pools of 50 batches, batches shuffled), so padding stays small and a
resumed run walks the same batches.

Tokenizers: "word" (the project's word vocabulary; unknown words -> <unk>), "bpe" or "wordpiece"
(models.tokenizers), separate for each side or one `joint` tokenizer learned on both. Output text is the
decoded tokens with no space before . , ) and after ( (BLEU's 13a tokenisation splits them again).

The `seq2seq` artifact is a directory: config.json (model kind and config, tokenizer and train configs),
model.safetensors, metrics.parquet (per epoch), the tokenizers' files prefixed `src-`/`tgt-` (or `joint-`).
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch
import torch.nn.functional as F
from lexiflow.models.bleu import BLEUScore, corpus_bleu
from lexiflow.models.device import resolve_device
from lexiflow.models.errors import InputError, ParameterError
from lexiflow.models.lm.train import (
    IGNORE,
    TrainConfig,
    Trainer,
    TrainTask,
    autocast,
    dist_info,
    length_batches,
    load_module_tensors,
    module_tensors,
    to_device,
)
from lexiflow.models.seq2seq.config import TokenizerConfig
from lexiflow.models.seq2seq.decoding import Hypothesis, beam_search, greedy
from lexiflow.models.seq2seq.rnn import RNNSeq2Seq, RNNSeq2SeqConfig
from lexiflow.models.seq2seq.transformer import TransformerSeq2Seq, TransformerSeq2SeqConfig
from lexiflow.models.text import pretokenize_expr
from lexiflow.models.tokenizers import BPE, WordPiece
from lexiflow.models.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Vocabulary
from safetensors.torch import load_file, save_file
from torch import nn

MODELS: dict[str, tuple[type, type]] = {
    "rnn": (RNNSeq2Seq, RNNSeq2SeqConfig),
    "transformer": (TransformerSeq2Seq, TransformerSeq2SeqConfig),
}
_SUBWORD = {"bpe": BPE, "wordpiece": WordPiece}




class Codec:
    """Text <-> ids for one side: the word vocabulary or a subword tokenizer, behind one interface."""

    def __init__(self, kind: str, impl: Any) -> None:
        self.kind, self.impl = kind, impl

    @classmethod
    def fit(cls, cfg: TokenizerConfig, texts: list[str]) -> Codec:
        series = pl.Series(texts, dtype=pl.String)
        if cfg.tokenizer == "word":
            words = series.to_frame("t").select(pretokenize_expr(pl.col("t")))["t"]
            return cls("word", Vocabulary.count(words, min_count=cfg.min_count, max_size=cfg.vocab_size - 4))
        subword = _SUBWORD[cfg.tokenizer](vocab_size=cfg.vocab_size, min_frequency=cfg.min_count)
        return cls(cfg.tokenizer, subword.fit(series))

    def __len__(self) -> int:
        return len(self.impl)

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        ids = self.impl.encode_batch(pl.Series(texts, dtype=pl.String))
        return [np.asarray(a, dtype=np.int64) for a in ids.to_list()]

    def decode(self, ids: list[int]) -> str:
        return detokenize(self.impl.decode(ids))

    def tokens(self, ids: list[int]) -> list[str]:
        return [self.impl.id_to_token(i) for i in ids]

    def save(self, path: Path, prefix: str) -> None:
        """Files `<prefix>-<name>` in `path` (artifacts are flat folders)."""
        if self.kind == "word":
            self.impl.frame.write_parquet(path / f"{prefix}-vocab.parquet")
            return
        with tempfile.TemporaryDirectory() as tmp:
            self.impl.save(tmp)
            for f in Path(tmp).iterdir():
                shutil.move(f, path / f"{prefix}-{f.name}")

    @classmethod
    def load(cls, kind: str, path: Path, prefix: str) -> Codec:
        if kind == "word":
            return cls("word", Vocabulary(pl.read_parquet(path / f"{prefix}-vocab.parquet")))
        with tempfile.TemporaryDirectory() as tmp:
            for f in path.glob(f"{prefix}-*"):
                shutil.copy(f, Path(tmp) / f.name[len(prefix) + 1:])
            return cls(kind, _SUBWORD[kind].load(tmp))


def detokenize(text: str) -> str:
    """Tokens joined by spaces -> text: no space before . , ) and after ( ."""
    return re.sub(r"\( ", "(", re.sub(r" ([.,)])", r"\1", text))


def _specials(codec: Codec) -> tuple[int, int, int]:
    if codec.kind == "word":
        return BOS_ID, EOS_ID, PAD_ID
    return codec.impl.bos_id, codec.impl.eos_id, codec.impl.pad_id


def pad_batch(seqs: list[np.ndarray], pad_id: int, prefix: int | None = None, suffix: int | None = None,
              ) -> torch.Tensor:
    """(B, T_max) right-padded ids, each sequence framed by the optional prefix/suffix token."""
    extra = (prefix is not None) + (suffix is not None)
    out = np.full((len(seqs), max(len(s) for s in seqs) + extra), pad_id, dtype=np.int64)
    for i, s in enumerate(seqs):
        row = ([prefix] if prefix is not None else []) + list(s) + ([suffix] if suffix is not None else [])
        out[i, : len(row)] = row
    return torch.from_numpy(out)


class Seq2SeqTask(TrainTask):
    """Teacher-forced cross-entropy on length-bucketed batches of (source, target) id pairs."""

    def __init__(self, src: list[np.ndarray], tgt: list[np.ndarray], valid: tuple[list, list] | None,
                 cfg: TrainConfig, *, bos_id: int, eos_id: int, pad_id: int) -> None:
        self.src, self.tgt, self.valid, self.cfg = src, tgt, valid, cfg
        self.src_lengths = np.fromiter(map(len, src), dtype=np.int64, count=len(src))
        self.bos_id, self.eos_id, self.pad_id = bos_id, eos_id, pad_id
        self.rank, self.world = dist_info()
        n_batches = max(1, -(-len(src) // cfg.batch_size))
        self.tokens_per_step = (sum(map(len, src)) + sum(map(len, tgt)) + len(tgt)) / n_batches

    def epoch_batches(self, epoch: int) -> list[np.ndarray]:
        return length_batches(self.src_lengths, self.cfg.batch_size, self.cfg.seed, epoch)  # by source length

    def tensors(self, src: list[np.ndarray], tgt: list[np.ndarray], device: torch.device):
        s = to_device(pad_batch(src, self.pad_id), device)
        tgt_in = to_device(pad_batch(tgt, self.pad_id, prefix=self.bos_id), device)
        tgt_out = pad_batch(tgt, self.pad_id, suffix=self.eos_id)
        tgt_out = to_device(tgt_out.masked_fill(tgt_out == self.pad_id, IGNORE), device)
        return s, s != self.pad_id, tgt_in, tgt_out

    def loss(self, fwd, batch, state, device):
        mine = batch[self.rank::self.world]  # data parallel: this rank's rows of the global batch
        src, mask, tgt_in, tgt_out = self.tensors([self.src[i] for i in mine], [self.tgt[i] for i in mine], device)
        logits = fwd(src, mask, tgt_in)
        nll = F.cross_entropy(logits.float().flatten(0, 1), tgt_out.flatten(), ignore_index=IGNORE, reduction="sum")
        n = sum(len(self.tgt[i]) + 1 for i in batch)  # predicted tokens in the global batch, </s> included
        return nll, n, n + sum(len(self.src[i]) for i in batch), None

    @torch.no_grad()
    def evaluate(self, module, device, precision):
        if self.valid is None:
            return None
        was = module.training
        module.eval()
        total, count = 0.0, 0
        vs, vt = self.valid
        for i in range(0, len(vs), self.cfg.eval_batch_size * 8):
            src, mask, tgt_in, tgt_out = self.tensors(vs[i:i + self.cfg.eval_batch_size * 8],
                                                      vt[i:i + self.cfg.eval_batch_size * 8], device)
            with autocast(device, precision):
                logits = module(src, mask, tgt_in)
            total += F.cross_entropy(logits.float().flatten(0, 1), tgt_out.flatten(), ignore_index=IGNORE,
                                     reduction="sum").item()
            count += int((tgt_out != IGNORE).sum())
        module.train(was)
        return total, count


@dataclass
class Translation:
    text: str
    score: float  # length-normalised log-probability
    source_tokens: list[str]
    target_tokens: list[str]  # without </s>
    attention: np.ndarray | None = None  # (target tokens + 1 for </s>, source tokens)


class Translator:
    """Encoder–decoder translation estimator (scikit-learn style: parameters in __init__, learned state `_`)."""

    def __init__(self, kind: str = "rnn", config: RNNSeq2SeqConfig | TransformerSeq2SeqConfig | None = None,
                 tokenizer: TokenizerConfig | None = None, train: TrainConfig | None = None, *,
                 max_len_a: float = 1.5, max_len_b: int = 5) -> None:
        if kind not in MODELS:
            raise ParameterError(f"seq2seq model={kind!r}: use one of {', '.join(MODELS)}")
        self.kind = kind
        self.config = config if config is not None else MODELS[kind][1]()
        self.tokenizer = tokenizer or TokenizerConfig()
        self.train = train or TrainConfig()
        self.max_len_a, self.max_len_b = max_len_a, max_len_b

    # -- training -----------------------------------------------------------------------------
    def fit(self, src: list[str], tgt: list[str], valid: tuple[list[str], list[str]] | None = None,
            on_step=None) -> Translator:
        if len(src) != len(tgt) or not src:
            raise InputError(f"fit: {len(src)} source and {len(tgt)} target sentences; give equally many, at least 1")
        self.tokenizer.validate()
        self.train.validate()
        if self.tokenizer.joint_vocabulary:
            joint = Codec.fit(self.tokenizer, list(src) + list(tgt))
            self.src_codec_ = self.tgt_codec_ = joint
        else:
            self.src_codec_ = Codec.fit(self.tokenizer, list(src))
            self.tgt_codec_ = Codec.fit(self.tokenizer, list(tgt))
        self.bos_id_, self.eos_id_, pad = _specials(self.tgt_codec_)
        self.config = replace(self.config, src_vocab_size=len(self.src_codec_), tgt_vocab_size=len(self.tgt_codec_),
                              pad_id=pad)
        s_ids, t_ids = self.src_codec_.encode(list(src)), self.tgt_codec_.encode(list(tgt))
        keep = [i for i, (a, b) in enumerate(zip(s_ids, t_ids, strict=True)) if len(a) and len(b)]
        s_ids, t_ids = [s_ids[i] for i in keep], [t_ids[i] for i in keep]
        self._check_lengths(s_ids, t_ids)
        v = (self.src_codec_.encode(list(valid[0])), self.tgt_codec_.encode(list(valid[1]))) if valid else None
        task = Seq2SeqTask(s_ids, t_ids, v, self.train, bos_id=self.bos_id_, eos_id=self.eos_id_, pad_id=pad)
        torch.manual_seed(self.train.seed)
        self.module_ = MODELS[self.kind][0](self.config)  # initialised under the seed
        self.history_ = Trainer(self.module_, task, self.train, name="seq2seq.train", on_step=on_step).run()
        self.device_ = next(self.module_.parameters()).device
        return self

    def _check_lengths(self, s_ids: list[np.ndarray], t_ids: list[np.ndarray]) -> None:
        cap = getattr(self.config, "max_len", None)
        longest = max(max(map(len, s_ids)), max(map(len, t_ids)) + 1)
        if cap is not None and longest > cap:
            raise InputError(f"a training sentence has {longest} tokens, more than the Transformer's max_len={cap}: "
                             "raise seq2seq max_len or filter long pairs")

    # -- decoding -----------------------------------------------------------------------------
    def _decode_batch(self, src_ids: list[np.ndarray], beam_width: int, alpha: float, n_best: int,
                      return_attention: bool) -> list[list[Hypothesis]]:
        pad = self.config.pad_id
        unk = UNK_ID if self.src_codec_.kind == "word" else self.src_codec_.impl.unk_id
        src = pad_batch([s if len(s) else np.array([unk]) for s in src_ids], pad).to(self.device_)  # "" -> <unk>
        mask = src != pad
        cap = getattr(self.config, "max_len", None)
        common = dict(pad_id=pad, max_len_a=self.max_len_a, max_len_b=self.max_len_b, max_len_cap=cap,
                      return_attention=return_attention)
        if beam_width == 1:
            return [[h] for h in greedy(self.module_, src, mask, self.bos_id_, self.eos_id_, alpha=alpha, **common)]
        return beam_search(self.module_, src, mask, self.bos_id_, self.eos_id_, beam_width=beam_width, alpha=alpha,
                           n_best=n_best, **common)

    @torch.no_grad()
    def translate(self, sentences: list[str], beam_width: int = 1, alpha: float = 1.0, n_best: int = 1,
                  return_attention: bool = False, batch_size: int = 64) -> list:
        """Translations, in order: a string per sentence; with `return_attention` (or n_best > 1) a Translation
        (or a list of n_best) per sentence, attention rows over the source tokens."""
        self._check_fitted()
        if isinstance(sentences, str):
            raise ParameterError("translate: give a list of sentences, not one string")
        self.module_.eval()
        ids = self.src_codec_.encode(list(sentences))
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))  # similar lengths together: little padding
        results: list = [None] * len(ids)
        for p in range(0, len(order), batch_size):
            part = order[p:p + batch_size]
            for i, hyps in zip(part, self._decode_batch([ids[i] for i in part], beam_width, alpha, n_best,
                                                        return_attention), strict=True):
                results[i] = [self._translation(ids[i], h) for h in hyps]
        if n_best == 1 and not return_attention:
            return [r[0].text for r in results]
        return [r if n_best > 1 else r[0] for r in results]

    def _translation(self, src_ids: np.ndarray, h: Hypothesis) -> Translation:
        body = h.tokens[:-1] if h.tokens and h.tokens[-1] == self.eos_id_ else h.tokens
        return Translation(self.tgt_codec_.decode(body), h.score, self.src_codec_.tokens(list(src_ids)),
                           self.tgt_codec_.tokens(body),
                           h.attention[:, : len(src_ids)].numpy() if h.attention is not None else None)

    def bleu(self, src: list[str], references: list[list[str]], beam_width: int = 1, alpha: float = 1.0,
             ) -> tuple[BLEUScore, list[str]]:
        hyps = self.translate(src, beam_width=beam_width, alpha=alpha)
        return corpus_bleu(hyps, references), hyps

    # -- persistence --------------------------------------------------------------------------
    def _check_fitted(self) -> None:
        if not hasattr(self, "module_"):
            raise ParameterError("this Translator is not trained: call fit(...) or Translator.load(path)")

    def save(self, path: str | Path) -> None:
        self._check_fitted()
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        save_file(module_tensors(self.module_), str(path / "model.safetensors"))
        if self.tokenizer.joint_vocabulary:
            self.src_codec_.save(path, "joint")
        else:
            self.src_codec_.save(path, "src")
            self.tgt_codec_.save(path, "tgt")
        cfg = {"kind": self.kind, "config": asdict(self.config), "tokenizer": asdict(self.tokenizer),
               "train": asdict(self.train), "max_len_a": self.max_len_a, "max_len_b": self.max_len_b}
        (path / "config.json").write_text(json.dumps(cfg, indent=1))
        pl.DataFrame(self.history_ or [], infer_schema_length=None).write_parquet(path / "metrics.parquet")

    @classmethod
    def load(cls, path: str | Path, device: str = "auto") -> Translator:
        path = Path(path)
        try:
            cfg = json.loads((path / "config.json").read_text())
        except (OSError, ValueError) as exc:
            raise InputError(f"{path}/config.json: not a saved translator ({exc})") from None
        kind = cfg["kind"]
        config_cls = MODELS[kind][1]
        config = config_cls(**{f.name: cfg["config"][f.name] for f in fields(config_cls) if f.name in cfg["config"]})
        tr = cls(kind, config, TokenizerConfig(**cfg["tokenizer"]), TrainConfig(**cfg["train"]),
                 max_len_a=cfg["max_len_a"], max_len_b=cfg["max_len_b"])
        if tr.tokenizer.joint_vocabulary:
            tr.src_codec_ = tr.tgt_codec_ = Codec.load(tr.tokenizer.tokenizer, path, "joint")
        else:
            tr.src_codec_ = Codec.load(tr.tokenizer.tokenizer, path, "src")
            tr.tgt_codec_ = Codec.load(tr.tokenizer.tokenizer, path, "tgt")
        tr.bos_id_, tr.eos_id_, _ = _specials(tr.tgt_codec_)
        tr.module_ = MODELS[kind][0](config)
        load_module_tensors(tr.module_, load_file(str(path / "model.safetensors")), str(path / "model.safetensors"))
        tr.device_ = resolve_device(device, "seq2seq.device")
        tr.module_.to(tr.device_).eval()
        metrics = path / "metrics.parquet"
        tr.history_ = pl.read_parquet(metrics).to_dicts() if metrics.exists() else []
        return tr


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
