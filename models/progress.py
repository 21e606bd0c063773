"""Progress reporting with throughput for long loops, through `logging` (Prefect forwards the
`lexiflow` logger into flow-run logs) and an optional callback (tasks feed Prefect progress artifacts)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable


class Progress:
    """Log `name: 45% (4.5M/10M tokens, 6.1M tokens/s, ETA 1m05s)` at most every `every_s` seconds.

    `callback(fraction)` is called on the same schedule, with 0..1 (or None when total is unknown).
    `done`: work finished before this run (a resumed job); it counts towards the total, not the rate.
    """

    def __init__(
        self,
        name: str,
        total: float | None = None,
        unit: str = "items",
        every_s: float = 5.0,
        callback: Callable[[float | None], None] | None = None,
        done: float = 0.0,
    ) -> None:
        self.name, self.total, self.unit, self.every_s, self.callback = name, total, unit, every_s, callback
        self.done = self._done_before = float(done)
        self.logger = logging.getLogger(f"lexiflow.{name}")
        self._start = self._last = time.perf_counter()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self._start

    @property
    def rate(self) -> float:
        return (self.done - self._done_before) / max(self.elapsed, 1e-9)

    def update(self, n: float = 1) -> None:
        self.done += n
        now = time.perf_counter()
        if now - self._last >= self.every_s:
            self._last = now
            self._report()

    def close(self) -> None:
        self._report(final=True)

    def _report(self, final: bool = False) -> None:
        fraction = None if not self.total else min(1.0, self.done / self.total)
        pct = f"{100 * fraction:.0f}% " if fraction is not None else ""
        of_total = f"/{_human(self.total)}" if self.total else ""
        verb = f"done in {self.elapsed:.1f}s, " if final else ""
        rate = self.rate
        left = max(0.0, (self.total or 0) - self.done)
        eta = "" if final or not self.total or rate <= 0 else f", ETA {_duration(left / rate)}"
        self.logger.info(
            "%s: %s%s(%s%s %s, %s %s/s%s)", self.name, verb, pct, _human(self.done), of_total,
            self.unit, _human(rate), self.unit, eta,
        )
        if self.callback is not None:
            self.callback(1.0 if final else fraction)


def _duration(seconds: float) -> str:
    """12s, 4m05s, 2h03m."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _human(x: float) -> str:
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.1f}{suffix}"
    return f"{x:.0f}" if float(x).is_integer() else f"{x:.1f}"
