"""Pictures of word vectors: the training-loss curve and a labelled 2-D map of frequent words.

- `plot_loss(history, path)`: loss per epoch from a `history_` (GloVe or word2vec), one PNG;
- `plot_projection(vectors, tokens, path)`: the most frequent words (lowest ids, zero rows
  such as the specials skipped) projected to 2-D with PCA (linear, on unit-length vectors so
  distances follow cosine similarity) and t-SNE (van der Maaten & Hinton 2008, cosine metric,
  PCA initialisation, seeded), side by side with word labels.

matplotlib runs with the Agg backend (files only, no display), so this works on servers/workers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from lexiflow.models.errors import InputError, ParameterError
from lexiflow.models.plotting import pyplot

METHODS = ("pca", "tsne")


def plot_loss(history: Sequence[Mapping[str, float]], path: str | Path, title: str = "training loss") -> Path:
    """Write the loss-per-epoch curves of a `history_` (every `*loss` column, e.g. GloVe's observed and
    unobserved cells) to a PNG; returns the path."""
    if not history:
        raise InputError("plot_loss: the history is empty (was the model fitted?)")
    epochs = [h["epoch"] for h in history]
    from matplotlib.ticker import MaxNLocator

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    curves = [key for key in history[0] if key.endswith("loss")]
    for key in curves:
        ax.plot(epochs, [h[key] for h in history], marker="o", markersize=3, label=key.replace("_", " "))
    if len(curves) > 1:
        ax.legend()
    ax.set_xlabel("epoch")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs are whole numbers
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
    return Path(path)


MIN_PROJECTION_WORDS = 5  # fewer points make no map worth drawing (and t-SNE needs perplexity < n)


def frequent_rows(vectors: np.ndarray, n_words: int, skip: int = 0) -> np.ndarray:
    """Ids of the first `n_words` nonzero rows after skipping `skip` of them (ids sort by frequency)."""
    nonzero = np.flatnonzero(np.any(vectors != 0, axis=1))
    return nonzero[skip:skip + n_words]


def project(vectors: np.ndarray, method: str, seed: int = 0) -> np.ndarray:
    """(n, d) vectors -> (n, 2) coordinates by PCA or t-SNE (rows normalized to unit length first)."""
    from sklearn.decomposition import PCA
    from sklearn.manifold import TSNE

    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    if method == "pca":
        return PCA(n_components=2, random_state=seed).fit_transform(unit)
    if method == "tsne":
        perplexity = min(30.0, (len(unit) - 1) / 3)
        return TSNE(n_components=2, metric="cosine", init="pca", perplexity=perplexity,
                    random_state=seed).fit_transform(unit)
    raise ParameterError(f"method={method!r}: choose from {', '.join(METHODS)}")


def plot_projection(vectors: np.ndarray, tokens: Sequence[str], path: str | Path, n_words: int = 300,
                    skip: int = 0, methods: Sequence[str] = METHODS, seed: int = 0,
                    title: str = "word vectors") -> list[str]:
    """Write a PNG with one labelled 2-D map per method; returns the words drawn.

    vectors: (V, d) by vocabulary id, ids sorted by frequency; `skip` leaves out that many of the
    most frequent nonzero rows (punctuation and function words crowd the picture).
    """
    if len(tokens) != len(vectors):
        raise InputError(f"plot_projection: {len(tokens)} tokens for {len(vectors)} vectors")
    rows = frequent_rows(vectors, n_words, skip)
    if len(rows) < MIN_PROJECTION_WORDS:
        raise InputError(f"plot_projection: only {len(rows)} nonzero vectors to draw "
                         f"(need at least {MIN_PROJECTION_WORDS})")
    words = [tokens[i] for i in rows]
    data = np.asarray(vectors[rows], dtype=np.float64)
    plt = pyplot()
    fig, axes = plt.subplots(1, len(methods), figsize=(11 * len(methods), 11), dpi=80, squeeze=False)
    for ax, method in zip(axes[0], methods, strict=True):
        xy = project(data, method, seed)
        ax.scatter(xy[:, 0], xy[:, 1], s=4, alpha=0.5)
        for (x, y), word in zip(xy, words, strict=True):
            ax.annotate(word, (x, y), fontsize=7, alpha=0.8)
        ax.set_title(f"{title}: {method.upper()} of {len(words)} frequent words")
        ax.set_xticks([])
        ax.set_yticks([])
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
    return words
