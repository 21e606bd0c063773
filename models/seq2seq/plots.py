"""Attention heatmaps: the notes' alignment pictures (source words across, target words down)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from lexiflow.models.plotting import pyplot


def attention_heatmap(source_tokens: list[str], target_tokens: list[str], weights: np.ndarray, path: Path,
                      title: str = "") -> None:
    """`weights` (target tokens [+ </s>], source tokens) as a grey-scale grid, written as PNG to `path`."""
    plt = pyplot()

    rows = list(target_tokens) + ["</s>"] * (weights.shape[0] - len(target_tokens))
    fig, ax = plt.subplots(figsize=(1.2 + 0.45 * len(source_tokens), 1.0 + 0.4 * len(rows)), dpi=100)
    ax.imshow(weights, cmap="Greys", vmin=0.0, vmax=1.0, aspect="auto")
    ax.set_xticks(range(len(source_tokens)), source_tokens, rotation=60, ha="right", fontsize=8)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
