"""matplotlib for the plots stages write (PNG files only)."""

from __future__ import annotations

from typing import Any


def pyplot() -> Any:
    """`matplotlib.pyplot` on the Agg backend (files only: no display on servers and workers). Imported when a
    plot is drawn, not with the module that draws it: the import takes about a second, which a cached
    `lexiflow run` (every stage's module imported to derive its code version, nothing drawn) should not pay."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
