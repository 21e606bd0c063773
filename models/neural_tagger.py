"""BiLSTM part-of-speech tagger (Plank, Søgaard & Goldberg 2016; Ma & Hovy 2016), optionally with
ELMo features (Peters et al. 2018). Same interface as `models.hmm.HMMTagger`: `fit(sentences, dev=...)`,
`tag(words)`, `tag_many(sentences)`, `tag_text(text)`, `is_known(word)`, `save(dir)` / `load(dir)`.

Per word: [word embedding; char-CNN vector (spelling, for rare and unknown words); ELMo mix
γ · Σ_j softmax(s)_j h_j of a frozen biLM's layers (optional)] -> dropout -> stacked bidirectional
LSTM (each position sees the whole sentence: forward states from the left, backward from the right,
concatenated) -> dropout -> one linear + softmax layer per tag column.

- Word embeddings are random, or start from pretrained vectors (any `embeddings` artifact, as gensim
  KeyedVectors; their words join the vocabulary, so a word unseen in training but in the vectors keeps
  its vector) and are frozen or fine-tuned (`freeze_embeddings`). Words are looked up lowercased
  (`lowercase_words`); case stays visible to the char CNN.
- HMM features (`hmm_features`, stacking): the tag the project's HMM tagger predicts for each word joins
  the input as a one-hot. The training sentences' HMM tags come from HMMs trained on the other
  `hmm_folds` folds (jackknifing), so the BiLSTM learns how far to trust the HMM as it errs on unseen
  text; at tagging time the HMM trained on every training sentence predicts (saved beside the model).
- Word dropout: a training word seen c times is replaced by `<unk>` with probability α / (α + c)
  (Kiperwasser & Goldberg 2016), so the `<unk>` embedding is trained on rare-word contexts.
- Training items are `(word, tag)` or `(word, tag, other)`: the third element (the other tag column,
  XPOS for a UPOS tagger) trains a second output head with weight `aux_weight` (multi-task, one joint
  model); `tag_many(..., head=1)` returns that column.
- Trained with the project's one training loop (`models.lm.train.Trainer` on a `SentenceTask`: AdamW,
  schedule, clipping, checkpoints/resume, CUDA with bf16 autocast, progress with rate and ETA), early
  stopping on dev accuracy of the first head (the loop's `valid_loss` is the dev error rate).
- Sequences are packed: padding never reaches a real position, so a sentence's tags do not depend on
  the other sentences of its batch.
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from lexiflow.models import text
from lexiflow.models.char_encoder import CharBiLSTM, CharCNN, CharVocab
from lexiflow.models.device import resolve_device
from lexiflow.models.elmo import BiLM, ScalarMix, run_lstm
from lexiflow.models.errors import InputError, ParameterError
from lexiflow.models.hmm import HMMTagger
from lexiflow.models.lm.train import (
    SentenceTask,
    TrainConfig,
    Trainer,
    find_checkpoint,
    load_module_tensors,
    module_tensors,
)
from lexiflow.models.neural_tagger_config import TaggerConfig
from safetensors.torch import load_file, save_file
from torch import nn

logger = logging.getLogger("lexiflow.neural_tagger")

UNK, PAD = 0, 3  # the project's word ids: 0 <unk>, 1 <s>, 2 </s>, 3 <pad>
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]
IGNORE = -100
_DIGITS = re.compile(r"\d")




def _hmm_of(train: list[list[tuple[str, ...]]]) -> HMMTagger:
    """The HMM of the stacked features: the default trigram HMM (states refined by the second column when
    the items carry one), uncalibrated, so the folds' and the full model's tags are alike."""
    return HMMTagger(order=3).fit([[t[:3] for t in s] for s in train])


def dev_accuracy(history: list[dict]) -> float | None:
    """The best epoch's dev accuracy: the loop's `valid_loss` is the dev error rate (None without dev)."""
    errors = [r["valid_loss"] for r in history if r["valid_loss"] is not None]
    return 1.0 - min(errors) if errors else None


def config_from_dict(d: dict) -> TaggerConfig:
    return TaggerConfig(**{**d, "char_kernels": tuple(d["char_kernels"]), "train": TrainConfig(**d["train"])})


class TaggerModule(nn.Module):
    def __init__(self, config: TaggerConfig, n_words: int, n_chars: int, n_tags: Sequence[int],
                 bilm: nn.Module | None = None) -> None:
        super().__init__()
        self.config = config
        self.embedding = nn.Embedding(n_words, config.word_dim, padding_idx=PAD)
        self.chars = CharCNN(n_chars, config.char_dim, config.char_filters, config.char_kernels) \
            if config.char_encoder == "cnn" else CharBiLSTM(n_chars, config.char_dim, config.char_hidden)
        in_dim = config.word_dim + self.chars.out_dim + (n_tags[0] if config.hmm_features else 0)
        self.bilm = bilm
        if bilm is not None:
            bilm.requires_grad_(False)  # frozen: only the mix is the tagger's
            self.mix = ScalarMix(bilm.n_layers)
            self.elmo_drop = nn.Dropout(config.elmo_dropout)
            in_dim += bilm.out_dim
        self.drop = nn.Dropout(config.dropout)
        self.lstm = nn.LSTM(in_dim, config.hidden_dim, num_layers=config.num_layers, batch_first=True,
                            bidirectional=config.bidirectional,
                            dropout=config.dropout if config.num_layers > 1 else 0.0)
        out = config.hidden_dim * (2 if config.bidirectional else 1)
        self.heads = nn.ModuleList(nn.Linear(out, k) for k in n_tags)

    def train(self, mode: bool = True) -> TaggerModule:
        super().train(mode)
        if self.bilm is not None:
            self.bilm.eval()  # frozen features: no dropout in the biLM
        return self

    def forward(self, batch: dict) -> list[torch.Tensor]:
        """Per head (B, T, K) tag scores."""
        x = [self.embedding(batch["words"]), self.chars(batch["chars"])[batch["inverse"]]]
        if "hmm" in batch:  # the HMM's tag as a one-hot (padding: all zeros)
            x.append(F.one_hot(batch["hmm"] + 1, self.heads[0].out_features + 1)[..., 1:].to(x[0].dtype))
        if self.bilm is not None:
            layers = batch.get("elmo")  # precomputed (training: the biLM is frozen, its layers never change)
            if layers is None:
                with torch.no_grad():
                    layers = torch.stack(self.bilm(batch["bilm"]))[:, :, 1:-1]  # (L+1, B, T, 2d): words only
            x.append(self.elmo_drop(self.mix(layers)))
        h = run_lstm(self.lstm, self.drop(torch.cat(x, dim=-1)), batch["lengths"])
        h = self.drop(h)
        return [head(h) for head in self.heads]


class BiLSTMTagger:
    """`BiLSTMTagger(TaggerConfig()).fit(train, dev=dev)`; items (word, tag) or (word, tag, other tag)."""

    def __init__(self, config: TaggerConfig | None = None) -> None:
        self.config = config or TaggerConfig()
        self.config.validate()
        self.words: list[str] = []
        self.word_counts: np.ndarray = np.zeros(0)
        self.known: set[str] = set()
        self.tags: list[list[str]] = []
        self.chars: CharVocab | None = None
        self.bilm: BiLM | None = None
        self.hmm_: HMMTagger | None = None  # with hmm_features: the HMM trained on every training sentence
        self.module_: TaggerModule | None = None
        self.history_: list[dict] = []
        self.dev_accuracy_: float | None = None

    # ---- vocabulary and batches
    def _form(self, word: str) -> str:
        w = _DIGITS.sub("0", word)  # numbers share embeddings; the char CNN still sees the digits
        return w.lower() if self.config.lowercase_words else w

    def _set_words(self, words: list[str]) -> None:
        self.words = words
        self._index = {w: i for i, w in enumerate(words)}

    def is_known(self, word: str) -> bool:
        """Whether the word form occurred in the training sentences (for known/unknown accuracy)."""
        return word in self.known

    def batch(self, sentences: Sequence[Sequence[str]], device: torch.device | str = "cpu",
              word_dropout: bool = False, elmo: Sequence[np.ndarray] | None = None,
              hmm: Sequence[np.ndarray] | None = None) -> dict:
        """Padded tensors for the module; `elmo`: the sentences' biLM layers, `hmm`: the HMM's tag ids
        (the jackknifed ones in training), when computed already."""
        lengths = torch.tensor([len(s) for s in sentences])
        words = torch.full((len(sentences), int(lengths.max())), PAD, dtype=torch.long)
        inverse = torch.zeros_like(words)
        forms: dict[str, int] = {}
        for i, s in enumerate(sentences):
            words[i, : len(s)] = torch.tensor([self._index.get(self._form(w), UNK) for w in s])
            inverse[i, : len(s)] = torch.tensor([forms.setdefault(w, len(forms)) for w in s])
        if word_dropout and self.config.word_dropout_alpha > 0:
            a = self.config.word_dropout_alpha
            counts = torch.from_numpy(self.word_counts)[words]
            drop = torch.rand(words.shape) < a / (a + counts)
            words = words.masked_fill(drop & (words != PAD), UNK)
        batch = {"words": words.to(device), "chars": self.chars.encode(list(forms)).to(device),
                 "inverse": inverse.to(device), "lengths": lengths}
        if self.config.hmm_features:
            ids = hmm if hmm is not None else self._hmm_tag_ids(self.hmm_, sentences)
            padded = torch.full(words.shape, -1, dtype=torch.long)
            for i, a in enumerate(ids):
                padded[i, : len(a)] = torch.from_numpy(a)
            batch["hmm"] = padded.to(device)
        if elmo is not None:
            layers = np.zeros((elmo[0].shape[0], len(sentences), words.shape[1], elmo[0].shape[2]), dtype=np.float32)
            for i, a in enumerate(elmo):
                layers[:, i, : a.shape[1]] = a
            batch["elmo"] = torch.from_numpy(layers).to(device)
        elif self.bilm is not None:
            batch["bilm"] = self.bilm.batch(sentences, device)
        return batch

    # ---- training
    def fit(self, sentences: Sequence[Sequence[tuple[str, ...]]],
            dev: Sequence[Sequence[tuple[str, ...]]] | None = None, vectors=None, bilm: BiLM | None = None,
            on_step=None) -> BiLSTMTagger:
        """Train on tagged sentences; `dev` (same items) for early stopping; `vectors`: pretrained word
        vectors (gensim KeyedVectors, e.g. `lexiflow.loaders.load(store, "embeddings", v)`); `bilm`: a trained BiLM
        (needs `config.elmo`); `on_step(step, loss)`: the training loop's per-step callback."""
        cfg = self.config
        train = _check_tagged(sentences, "sentences")
        dev_items = _check_tagged(dev, "dev") if dev else None
        self._prepare(train, vectors, bilm)
        n_heads = len(self.tags)
        module = self.module_
        words_of = [[t[0] for t in s] for s in train]
        tag_index = [{t: i for i, t in enumerate(tags)} for tags in self.tags]
        targets = [[torch.tensor([tag_index[h][t[h + 1]] for t in s]) for s in train] for h in range(n_heads)]
        weights = [1.0, cfg.aux_weight]

        elmo = self._elmo_layers(words_of) if bilm is not None else None
        hmm = self._jackknifed_hmm_tags(train) if cfg.hmm_features else None

        def batch_loss(idx: np.ndarray, device: torch.device) -> tuple[torch.Tensor, int]:
            logits = module(self.batch([words_of[i] for i in idx], device, word_dropout=True,
                                       elmo=[elmo[i] for i in idx] if elmo is not None else None,
                                       hmm=[hmm[i] for i in idx] if hmm is not None else None))
            total = 0.0
            for h, lg in enumerate(logits):
                y = torch.nn.utils.rnn.pad_sequence([targets[h][i] for i in idx], batch_first=True,
                                                    padding_value=IGNORE).to(device)
                total = total + weights[h] * F.cross_entropy(lg.float().reshape(-1, lg.shape[-1]), y.reshape(-1),
                                                             ignore_index=IGNORE, reduction="sum")
            return total, int(sum(len(words_of[i]) for i in idx))

        dev_words = [[t[0] for t in s] for s in dev_items] if dev_items else None
        dev_gold = [t[1] for s in dev_items for t in s] if dev_items else None

        def dev_errors() -> tuple[float, int]:  # the loop stops early on the error rate: on dev accuracy
            pred = [t for s in self.tag_many(dev_words) for t in s]
            return float(np.sum(np.asarray(pred, dtype=object) != np.asarray(dev_gold, dtype=object))), len(dev_gold)

        task = SentenceTask([len(s) for s in words_of], batch_loss, cfg.train, dev_errors if dev_items else None,
                            "tagger.train", valid_metric="error")
        self.history_ = Trainer(module, task, cfg.train, name="tagger.train", on_step=on_step).run()
        self.dev_accuracy_ = dev_accuracy(self.history_)
        return self

    def _hmm_tag_ids(self, hmm: HMMTagger, sentences: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """The HMM's tags of the sentences as ids of the first tag column (-1: a tag it never saw here)."""
        index = {t: i for i, t in enumerate(self.tags[0])}
        return [np.array([index.get(t, -1) for t in tags], dtype=np.int64) for tags in hmm.tag_many(sentences)]

    def _jackknifed_hmm_tags(self, train: list[list[tuple[str, ...]]]) -> list[np.ndarray]:
        """Each training sentence tagged by an HMM trained on the other folds (its test-time error rate);
        `hmm_` is then trained on them all, for tagging."""
        k = min(self.config.hmm_folds, len(train))
        words = [[t[0] for t in s] for s in train]
        if k < 2:  # one sentence: no other fold to tag it
            self.hmm_ = _hmm_of(train)
            return self._hmm_tag_ids(self.hmm_, words)
        out: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * len(train)
        for fold in range(k):
            held = range(fold, len(train), k)
            rest = [s for i, s in enumerate(train) if i % k != fold]
            for i, ids in zip(held, self._hmm_tag_ids(_hmm_of(rest), [words[i] for i in held]), strict=True):
                out[i] = ids
            logger.info("HMM features: fold %d of %d tagged", fold + 1, k)
        self.hmm_ = _hmm_of(train)
        return out

    def _prepare(self, train: list[list[tuple[str, ...]]], vectors, bilm: BiLM | None) -> None:
        """Vocabularies, tag sets and the untrained module (deterministic in the training sentences)."""
        cfg = self.config
        if cfg.elmo and bilm is None:
            raise ParameterError("TaggerConfig.elmo=True needs a trained biLM: fit(..., bilm=BiLM.load(dir))")
        if bilm is not None and not cfg.elmo:
            raise ParameterError("a biLM was given but TaggerConfig.elmo=False: set elmo=True or leave bilm out")
        n_heads = 2 if cfg.aux_weight > 0 and all(len(t) >= 3 for s in train for t in s) else 1
        self.tags = [sorted({t[h + 1] for s in train for t in s}) for h in range(n_heads)]
        counts = Counter(self._form(t[0]) for s in train for t in s)
        words = SPECIALS + sorted(counts, key=lambda w: (-counts[w], w))
        if vectors is not None:
            if cfg.word_dim != vectors.vector_size:
                cfg.word_dim = vectors.vector_size  # the vectors decide the width
            have = set(words)
            top = vectors.index_to_key[: cfg.pretrained_max_words]
            words += [w for w in top if self._form(w) == w and w not in have]  # as looked up, new
        self._set_words(words)
        self.word_counts = np.array([counts.get(w, 0) for w in words], dtype=np.float32)
        self.known = {t[0] for s in train for t in s}
        self.chars = CharVocab.build(t[0] for s in train for t in s)
        self.bilm = bilm
        torch.manual_seed(cfg.train.seed)
        self.module_ = TaggerModule(cfg, len(words), len(self.chars), [len(t) for t in self.tags],
                                    bilm.module_ if bilm is not None else None)
        if vectors is not None:
            self._init_vectors(vectors)

    @classmethod
    def from_checkpoint(cls, config: TaggerConfig, sentences: Sequence[Sequence[tuple[str, ...]]],
                        bilm: BiLM | None = None) -> BiLSTMTagger:
        """The best epoch so far of a training run still going (or stopped) with `config.train.checkpoint_dir`:
        the same training sentences rebuild the vocabularies, the checkpoint gives the weights and history."""
        path = find_checkpoint(config.train.checkpoint_dir)
        if path is None:
            raise InputError(f"{config.train.checkpoint_dir}: no training checkpoint; train with checkpoint_dir set")
        tagger = cls(config)
        train = _check_tagged(sentences, "sentences")
        tagger._prepare(train, None, bilm)
        tagger.hmm_ = _hmm_of(train) if config.hmm_features else None
        best = path / "best.safetensors"
        weights = best if best.exists() else path / "model.safetensors"
        load_module_tensors(tagger.module_, load_file(str(weights)), str(weights))
        tagger.module_.eval()
        tagger.history_ = json.loads((path / "trainer.json").read_text())["history"]
        tagger.dev_accuracy_ = dev_accuracy(tagger.history_)
        return tagger

    def _elmo_layers(self, sentences: list[list[str]], batch_size: int = 64) -> list[np.ndarray]:
        """The frozen biLM's layers for every training sentence, once (float16 in memory: (L+1)·2d per token)."""
        self.bilm.module_.to(resolve_device(self.config.train.device, "train.device"))
        out: list[np.ndarray] = []
        for lo in range(0, len(sentences), batch_size):
            out.extend(a.astype(np.float16) for a in self.bilm.layers(sentences[lo : lo + batch_size]))
        logger.info("ELMo layers of %d training sentences computed", len(sentences))
        return out

    def _init_vectors(self, vectors) -> None:
        emb = self.module_.embedding.weight
        with torch.no_grad():
            hits = 0
            for i, w in enumerate(self.words):
                key = w if w in vectors.key_to_index else None
                if key is not None:
                    emb[i] = torch.tensor(np.asarray(vectors[key], dtype=np.float32))
                    hits += 1
            logger.info("pretrained vectors cover %d of %d vocabulary words", hits, len(self.words))
        emb.requires_grad_(not self.config.freeze_embeddings)

    # ---- tagging
    def tag(self, words: Sequence[str], head: int = 0) -> list[str]:
        return self.tag_many([words], head=head)[0]

    @torch.no_grad()
    def tag_many(self, sentences: Sequence[Sequence[str]], head: int = 0, **_ignored) -> list[list[str]]:
        """Tags per sentence (`head=1`: the second tag column of a joint model). Decoding keywords of
        the HMM (`method`, `beam_width`) are accepted and ignored: each token's tag is its argmax."""
        if self.module_ is None:
            raise ParameterError("the tagger is not trained: call fit(...) or load(dir) first")
        if not 0 <= head < len(self.tags):
            raise ParameterError(f"head={head}: this tagger has {len(self.tags)} tag column(s)")
        sents = _check_words(sentences)
        module = self.module_
        device = next(module.parameters()).device
        was = module.training
        module.eval()
        out: list[list[str]] = [[] for _ in sents]
        order = sorted((i for i, s in enumerate(sents) if s), key=lambda i: len(sents[i]))
        bs = self.config.tag_batch_size
        for lo in range(0, len(order), bs):
            idx = order[lo : lo + bs]
            logits = module(self.batch([sents[i] for i in idx], device))[head]
            best = logits.argmax(-1).cpu().numpy()
            for row, i in enumerate(idx):
                out[i] = [self.tags[head][k] for k in best[row, : len(sents[i])]]
        module.train(was)
        return out

    def tag_text(self, raw: str, head: int = 0) -> list[list[tuple[str, str]]]:
        """Split plain text into sentences and words (`models.text`) and tag them."""
        sents = [text.pretokenize(s) for s in text.split_sentences(raw)]
        sents = [s for s in sents if s]
        return [list(zip(s, t, strict=True)) for s, t in zip(sents, self.tag_many(sents, head=head), strict=True)]

    def to(self, device: str) -> BiLSTMTagger:
        """Move the model (tagging then runs there): 'cpu', 'cuda', 'auto'."""
        self.module_.to(resolve_device(device, "device"))
        return self

    # ---- persistence
    def save(self, directory: str | Path) -> None:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        state = {"model": "bilstm", "config": asdict(self.config), "words": self.words,
                 "word_counts": self.word_counts.tolist(), "known": sorted(self.known), "tags": self.tags,
                 "chars": self.chars.chars, "max_chars": self.chars.max_chars, "history": self.history_,
                 "dev_accuracy": self.dev_accuracy_, "bilm": self.bilm.state() if self.bilm is not None else None}
        (d / "config.json").write_text(json.dumps(state, indent=1))
        save_file(module_tensors(self.module_), str(d / "model.safetensors"))
        if self.hmm_ is not None:
            self.hmm_.save(d, prefix="hmm-")

    @classmethod
    def load(cls, directory: str | Path) -> BiLSTMTagger:
        d = Path(directory)
        if not (d / "config.json").exists() or not (d / "model.safetensors").exists():
            raise InputError(f"{d}: no config.json and model.safetensors; give a folder a BiLSTMTagger was saved to")
        state = json.loads((d / "config.json").read_text())
        tagger = cls(config_from_dict(state["config"]))
        tagger._set_words(state["words"])
        tagger.word_counts = np.array(state["word_counts"], dtype=np.float32)
        tagger.known = set(state["known"])
        tagger.tags = state["tags"]
        tagger.chars = CharVocab(state["chars"], state["max_chars"])
        tagger.history_, tagger.dev_accuracy_ = state["history"], state["dev_accuracy"]
        tagger.bilm = BiLM.from_state(state["bilm"]) if state["bilm"] else None
        tagger.hmm_ = HMMTagger.load(d, prefix="hmm-") if tagger.config.hmm_features else None
        tagger.module_ = TaggerModule(tagger.config, len(tagger.words), len(tagger.chars),
                                      [len(t) for t in tagger.tags],
                                      tagger.bilm.module_ if tagger.bilm is not None else None)
        load_module_tensors(tagger.module_, load_file(str(d / "model.safetensors")), str(d / "model.safetensors"))
        tagger.module_.eval()
        return tagger

    def elmo_weights(self) -> dict[str, list[float] | float] | None:
        """The learned layer weights softmax(s) and scale γ (None without ELMo)."""
        if self.bilm is None:
            return None
        mix = self.module_.mix
        return {"weights": mix.weights().detach().tolist(), "gamma": float(mix.gamma.detach())}


def _check_tagged(sentences, name: str) -> list[list[tuple[str, ...]]]:
    out = []
    for i, s in enumerate(sentences or []):
        items = list(s)
        for j, t in enumerate(items):
            if not isinstance(t, (tuple, list)) or len(t) < 2 or not all(isinstance(x, str) and x for x in t):
                raise InputError(f"{name}[{i}][{j}]: expected a (word, tag) or (word, tag, other) tuple of "
                                 f"non-empty strings, got {t!r}")
        if items:
            out.append([tuple(t) for t in items])
    if not out:
        raise InputError(f"{name}: no tagged sentence; give lists of (word, tag) tuples")
    return out


def _check_words(sentences) -> list[list[str]]:
    if isinstance(sentences, str):
        raise InputError("tag_many: give a list of sentences (lists of words), not a string; use tag_text for text")
    out = []
    for i, s in enumerate(sentences):
        if isinstance(s, str) or not all(isinstance(w, str) and w for w in s):
            raise InputError(f"sentence {i}: give a list of non-empty word strings")
        out.append(list(s))
    return out
