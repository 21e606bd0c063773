"""How many threads a stage's numeric work uses: one rule for torch and the BLAS/OpenMP pools that
numpy and scipy call into.

Left alone, torch and OpenBLAS start one thread per core in every process. A worker that runs one
stage next to others (shards, other tasks, other users) then oversubscribes the CPU: on a 2-core
machine with other work running, a GloVe epoch took 10-19x longer with 2 threads than with 1. So a
stage limits its threads to its `threads` parameter for the span of its work (default 1 per worker:
add threads only where the worker has cores to itself) and restores the previous setting after.
Every stage runs inside such a limit (tasks/stage.py): the `threads` field of its parameters, one
declared with the `Threads` type below, or the default. The limit covers torch's intra-op pool, the
BLAS/OpenMP pools (threadpoolctl), and lexiflow's own polars fan-out (`current_threads`, read by
`models.ingest.stats.in_threads`). polars' internal pool is per process and fixed when polars is
imported: set POLARS_MAX_THREADS in the worker's environment. torch's setting is per process too:
stages running at once in threads of one process share it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Annotated

from lexiflow.models.errors import ParameterError
from pydantic import Field

DEFAULT_THREADS = 1
Threads = Annotated[int, Field(ge=1, le=256, description="CPU threads of this stage's numeric work (torch, BLAS, "
                                                         "polars fan-out): 1 per worker; more only where the worker "
                                                         "has the cores to itself.")]
_current: ContextVar[int | None] = ContextVar("lexiflow_threads", default=None)


def machine_cores() -> int:
    """Cores this process may run on (its CPU affinity, where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def current_threads(available: int) -> int:
    """Threads the code running now may fan out to, of `available` (the limit in force, if any)."""
    limit = _current.get()
    return available if limit is None else max(1, min(limit, available))


@contextmanager
def limit_threads(threads: int, parameter: str = "threads") -> Iterator[None]:
    """Run the block with at most `threads` torch intra-op threads and BLAS/OpenMP threads."""
    if not isinstance(threads, int) or threads < 1:
        raise ParameterError(f"{parameter}={threads!r}: must be a whole number of threads, at least 1")
    from threadpoolctl import threadpool_limits

    torch = sys.modules.get("torch")  # only when the stage uses torch: importing it costs ~1 s
    before = torch.get_num_threads() if torch is not None else None
    token = _current.set(threads)
    with threadpool_limits(threads):
        if torch is not None:
            torch.set_num_threads(threads)
        try:
            yield
        finally:
            _current.reset(token)
            if torch is not None:
                torch.set_num_threads(before)
