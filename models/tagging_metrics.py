"""Evaluation of a sequence tagger: token accuracy (overall, on known and on unknown words), per-tag
precision / recall / F1 as a polars DataFrame, and a confusion-matrix heatmap (PNG, matplotlib Agg).

Gold tags never seen by the tagger are fine: they simply count as errors (their recall is 0).
"""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence
from pathlib import Path

import numpy as np
import polars as pl
from lexiflow.models.errors import InputError
from lexiflow.models.plotting import pyplot


def _flatten(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]],
             names: tuple[str, str] = ("gold", "pred")) -> tuple[list[str], list[str]]:
    if len(gold) != len(pred):
        raise InputError(f"{names[0]} has {len(gold)} sentences but {names[1]} has {len(pred)}; "
                         "give the same sentences")
    g: list[str] = []
    p: list[str] = []
    for n, (gs, ps) in enumerate(zip(gold, pred, strict=True)):
        if len(gs) != len(ps):
            raise InputError(f"sentence {n}: {len(gs)} {names[0]} tokens but {len(ps)} {names[1]}; "
                             "give the same tokens")
        g.extend(gs)
        p.extend(ps)
    return g, p


def accuracy_report(
    words: Sequence[Sequence[str]],
    gold: Sequence[Sequence[str]],
    pred: Sequence[Sequence[str]],
    known: Container[str] | Callable[[str], bool],
) -> dict[str, float]:
    """Accuracy overall, on known and on unknown words (known: a vocabulary or a predicate such as
    `tagger.is_known`), with token counts. An empty split gives accuracy NaN."""
    g, p = _flatten(gold, pred)
    w, _ = _flatten(words, gold, ("words", "gold"))
    is_known = known if callable(known) else known.__contains__
    k = np.fromiter((bool(is_known(x)) for x in w), dtype=bool, count=len(w))
    ok = np.asarray(g, dtype=object) == np.asarray(p, dtype=object)

    def acc(mask: np.ndarray) -> float:
        return float(ok[mask].mean()) if mask.any() else float("nan")

    return {
        "accuracy": acc(np.ones(len(ok), dtype=bool)),
        "known_accuracy": acc(k),
        "unknown_accuracy": acc(~k),
        "tokens": float(len(ok)),
        "unknown_tokens": float((~k).sum()),
    }


def per_tag_scores(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> pl.DataFrame:
    """One row per tag seen in gold or pred: tag, support (gold count), predicted, precision, recall, f1
    (0 where undefined, as scikit-learn's zero_division=0), sorted by tag."""
    g, p = _flatten(gold, pred)
    df = pl.DataFrame({"gold": g, "pred": p}, schema={"gold": pl.String, "pred": pl.String})
    tags = sorted(set(g) | set(p))
    support = dict(df.group_by("gold").len().iter_rows())
    predicted = dict(df.group_by("pred").len().iter_rows())
    correct = dict(df.filter(pl.col("gold") == pl.col("pred")).group_by("gold").len().iter_rows())
    rows = []
    for t in tags:
        tp, s, q = correct.get(t, 0), support.get(t, 0), predicted.get(t, 0)
        prec = tp / q if q else 0.0
        rec = tp / s if s else 0.0
        f1 = 2 * prec * rec / (prec + rec) if prec + rec else 0.0
        rows.append((t, s, q, prec, rec, f1))
    return pl.DataFrame(rows, schema={"tag": pl.String, "support": pl.Int64, "predicted": pl.Int64,
                                      "precision": pl.Float64, "recall": pl.Float64, "f1": pl.Float64},
                        orient="row")


def confusion_matrix(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]],
                     labels: Sequence[str] | None = None) -> tuple[list[str], np.ndarray]:
    """(labels, C) with C[i, j] = tokens of gold labels[i] tagged labels[j]; labels default to every tag
    seen, sorted. Tags outside a given `labels` are not counted."""
    g, p = _flatten(gold, pred)
    labels = sorted(set(g) | set(p)) if labels is None else list(labels)
    index = {t: i for i, t in enumerate(labels)}
    cm = np.zeros((len(labels), len(labels)), dtype=np.int64)
    gi = np.fromiter((index.get(t, -1) for t in g), dtype=np.int64, count=len(g))
    pi = np.fromiter((index.get(t, -1) for t in p), dtype=np.int64, count=len(p))
    keep = (gi >= 0) & (pi >= 0)
    np.add.at(cm, (gi[keep], pi[keep]), 1)
    return labels, cm


def plot_confusion(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]], path: str | Path,
                   labels: Sequence[str] | None = None, normalize: bool = True, title: str = "") -> Path:
    """Write the confusion matrix as a heatmap PNG (rows gold, columns predicted; row-normalised by
    default, so the diagonal is each tag's recall). Returns the path."""
    plt = pyplot()

    labels, cm = confusion_matrix(gold, pred, labels)
    values = cm / np.maximum(cm.sum(axis=1, keepdims=True), 1) if normalize else cm
    size = max(4.0, 0.32 * len(labels) + 2)
    fig, ax = plt.subplots(figsize=(size, size * 0.9), dpi=100)
    im = ax.imshow(values, cmap="Blues", vmin=0, vmax=1 if normalize else None)
    ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=7)
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.set_xlabel("predicted")
    ax.set_ylabel("gold")
    ax.set_title(title or ("confusion matrix (row-normalised)" if normalize else "confusion matrix"))
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    plt.close(fig)
    return path
