"""Extrinsic evaluation of word embeddings (notes 001, "Extrinsic Evaluation": how well the embedding
performs on a downstream task): the genre of an English Web Treebank sentence (its `sent_id` prefix:
answers, email, newsgroup, reviews, weblog) from the average of its word vectors, by the midterm
review's feed-forward network (notes 000, "Feed forward neural networks"):

    h1 = f(W1 x + b1),  h2 = f(W2 h1 + b2),  y = Wo h2,  ŷ = softmax(y),  L = -log ŷ_label

Features are standardised with the train split's mean and deviation; words missing from the embeddings
are skipped (a sentence with none averages to zero). Trained with Adam on train; the epoch with the
best dev accuracy is kept; test accuracy is reported beside it and the majority-class baseline.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from lexiflow.models.conllu import Sentence, read_conllu
from lexiflow.models.errors import InputError
from lexiflow.models.extrinsic_config import ClassifierConfig
from torch import nn

SPLITS = ("train", "dev", "test")




class FeedForwardClassifier(nn.Module):
    def __init__(self, d: int, n_classes: int, c: ClassifierConfig) -> None:
        super().__init__()
        self.hidden1 = nn.Linear(d, c.classifier_hidden1)  # W1, b1
        self.hidden2 = nn.Linear(c.classifier_hidden1, c.classifier_hidden2)  # W2, b2
        self.output = nn.Linear(c.classifier_hidden2, n_classes, bias=False)  # Wo (the notes' output has no bias)
        self.f = {"relu": torch.relu, "tanh": torch.tanh, "sigmoid": torch.sigmoid}[c.classifier_activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits y (B, C); softmax and the cross-entropy are the loss's."""
        return self.output(self.f(self.hidden2(self.f(self.hidden1(x)))))


def genre(sent_id: str) -> str:
    """EWT's genre: the sent_id prefix before the first '-' (weblog-juancole.com_... -> weblog)."""
    prefix, dash, _ = sent_id.partition("-")
    if not dash or not prefix:
        raise InputError(f"sent_id {sent_id!r} has no genre prefix (expected e.g. 'weblog-...-0001')")
    return prefix


def read_genre_splits(directory: str | Path) -> dict[str, tuple[list[list[str]], list[str]]]:
    """{split: (sentences as word lists, genres)} from `*-ud-{train,dev,test}.conllu` in `directory`."""
    directory = Path(directory)
    paths = {}
    for split in SPLITS:  # every file found before any is parsed
        files = sorted(directory.glob(f"*-ud-{split}.conllu"))
        if len(files) != 1:
            raise InputError(f"evaluation.genre_treebank={directory}: expected one *-ud-{split}.conllu file there, "
                             f"found {len(files)}; give the folder of a UD treebank such as UD_English-EWT")
        paths[split] = files[0]
    out = {}
    for split, path in paths.items():
        sentences = list(read_conllu(path))
        if not sentences:
            raise InputError(f"{path}: no sentences")
        out[split] = ([s.words for s in sentences], [_genre_at(s, path) for s in sentences])
    return out


def _genre_at(sentence: Sentence, path: Path) -> str:
    try:
        return genre(sentence.sent_id)
    except InputError as e:
        raise InputError(f"{path}:{sentence.line}: {e}") from None


def average_vectors(sentences: Sequence[Sequence[str]], words: Sequence[str], matrix: np.ndarray,
                    lowercase: bool = True) -> tuple[np.ndarray, float]:
    """(n, d) mean vector of each sentence's known words, and the share of tokens that were known."""
    index = {w: i for i, w in enumerate(words)}
    out = np.zeros((len(sentences), matrix.shape[1]), dtype=np.float32)
    known = total = 0
    for n, sentence in enumerate(sentences):
        ids = [index[w] for w in (t.lower() if lowercase else t for t in sentence) if w in index]
        known, total = known + len(ids), total + len(sentence)
        if ids:
            out[n] = matrix[ids].mean(axis=0)
    return out, known / max(total, 1)


def fit_classifier(x: dict[str, np.ndarray], y: dict[str, np.ndarray], n_classes: int,
                   c: ClassifierConfig) -> tuple[FeedForwardClassifier, dict[str, float]]:
    """Train on x['train'], keep the best epoch on x['dev']; accuracies of train, dev and test."""
    c.validate()
    torch.manual_seed(c.classifier_seed)
    mean, std = x["train"].mean(axis=0), x["train"].std(axis=0) + 1e-8
    t = {s: torch.from_numpy((x[s] - mean) / std).float() for s in x}
    labels = {s: torch.from_numpy(y[s]).long() for s in y}
    model = FeedForwardClassifier(t["train"].shape[1], n_classes, c)
    opt = torch.optim.Adam(model.parameters(), lr=c.classifier_lr)
    g = torch.Generator().manual_seed(c.classifier_seed)

    def accuracy(split: str) -> float:
        model.eval()
        with torch.no_grad():
            return float((model(t[split]).argmax(1) == labels[split]).float().mean())

    best, best_state = -1.0, None
    for _ in range(c.classifier_epochs):
        model.train()
        order = torch.randperm(len(t["train"]), generator=g)
        for start in range(0, len(order), 64):
            idx = order[start:start + 64]
            loss = F.cross_entropy(model(t["train"][idx]), labels["train"][idx])  # -log softmax(y)[label]
            opt.zero_grad()
            loss.backward()
            opt.step()
        dev = accuracy("dev")
        if dev > best:
            best, best_state = dev, {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(best_state)
    return model, {s: accuracy(s) for s in t}


def genre_accuracy(words: Sequence[str], matrix: np.ndarray, directory: str | Path,
                   c: ClassifierConfig = ClassifierConfig(), lowercase: bool = True) -> dict[str, float]:  # noqa: B008 -- frozen
    """The genre task's metrics for one embedding matrix (rows = `words`)."""
    data = read_genre_splits(directory)
    classes = sorted(set(data["train"][1]))
    unseen = sorted((set(data["dev"][1]) | set(data["test"][1])) - set(classes))
    if unseen:
        raise InputError(f"evaluation.genre_treebank={directory}: genres {unseen} occur in dev/test, not in train")
    label = {g: i for i, g in enumerate(classes)}
    x, y, coverage = {}, {}, 0.0
    for split, (sentences, genres) in data.items():
        x[split], cov = average_vectors(sentences, words, matrix, lowercase)
        y[split] = np.array([label[g] for g in genres])
        coverage = cov if split == "test" else coverage
    _, acc = fit_classifier(x, y, len(classes), c)
    majority = Counter(data["train"][1]).most_common(1)[0][0]
    return {"genre_dev_accuracy": acc["dev"], "genre_test_accuracy": acc["test"],
            "genre_majority_accuracy": float(np.mean(np.array(data["test"][1]) == majority)),
            "genre_token_coverage": coverage, "genre_classes": len(classes)}
