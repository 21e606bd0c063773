"""The evaluation report's figures as Prefect image artifacts: a bar chart of the headline figures,
and each PNG of the report (projections, loss curves, confusion heatmap).

An image travels inside the artifact as a `data:` URL, so the UI shows it without any file
server (the store may be a local folder the browser cannot reach).
"""

from __future__ import annotations

import base64
import io
import math
from typing import Any

HEADLINE = ("ws353_spearman", "simlex999_spearman", "analogy_add_accuracy", "analogy_mul_accuracy", "analogy_coverage")


def chart_png(rows: list[dict[str, Any]]) -> bytes:
    """Grouped horizontal bars: one group per headline figure, one bar per evaluated embeddings."""
    import matplotlib

    matplotlib.use("Agg")  # no display on workers
    import matplotlib.pyplot as plt

    metrics = [m for m in HEADLINE if any(isinstance(r.get(m), int | float) for r in rows)]
    fig, ax = plt.subplots(figsize=(7, 0.6 + 0.5 * len(metrics) * max(len(rows), 1)), dpi=100)
    height = 0.8 / max(len(rows), 1)
    for i, row in enumerate(rows):
        values = [float("nan") if row.get(m) is None else float(row[m]) for m in metrics]  # null: no score, no bar
        positions = [k + i * height for k in range(len(metrics))]
        ax.barh(positions, values, height=height, label=str(row.get("embeddings", row.get("evaluation", i))))
        for y, v in zip(positions, values, strict=True):
            ax.text(0.0 if math.isnan(v) else v, y, " –" if math.isnan(v) else f" {v:.3f}", va="center", fontsize=8)
    ax.set_yticks([k + 0.4 - height / 2 for k in range(len(metrics))], metrics)
    ax.invert_yaxis()
    ax.set_xlim(min(0.0, ax.get_xlim()[0]), 1.0)
    ax.set_title("Intrinsic evaluation of embeddings")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()


def publish_image(png: bytes, key: str, description: str) -> None:
    """An image artifact carrying the PNG as a `data:` URL; outside a run (or when the API is busy)
    do nothing: the same figure is in the report artifact's folder."""
    try:
        from prefect.artifacts import create_image_artifact

        create_image_artifact("data:image/png;base64," + base64.b64encode(png).decode(), key=key,
                              description=description)
    except Exception:  # the report is also a table and markdown artifact: the images are a nicety
        pass


def publish_chart(rows: list[dict[str, Any]], key: str = "embedding-evaluation-chart") -> None:
    publish_image(chart_png(rows), key, "Headline evaluation figures")
