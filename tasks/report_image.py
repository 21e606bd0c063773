"""The evaluation report as a Prefect image artifact: a bar chart of the headline figures.

The image travels inside the artifact as a `data:` URL, so the UI shows it without any file
server (the store may be a local folder the browser cannot reach).
"""

from __future__ import annotations

import base64
import io
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
        values = [float(row.get(m) or 0.0) for m in metrics]
        positions = [k + i * height for k in range(len(metrics))]
        ax.barh(positions, values, height=height, label=str(row.get("embeddings", row.get("evaluation", i))))
        for y, v in zip(positions, values, strict=True):
            ax.text(v, y, f" {v:.3f}", va="center", fontsize=8)
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


def publish_chart(rows: list[dict[str, Any]], key: str = "embedding-evaluation-chart") -> None:
    """Create the image artifact; outside a run (or when the API is busy) do nothing."""
    try:
        from prefect.artifacts import create_image_artifact

        url = "data:image/png;base64," + base64.b64encode(chart_png(rows)).decode()
        create_image_artifact(url, key=key, description="Headline evaluation figures")
    except Exception:  # the report is also a table and markdown artifact: the chart is a nicety
        pass
