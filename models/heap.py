"""Freed memory stays in the process for reuse while a CPU training loop runs (glibc only).

glibc serves an allocation above its mmap threshold (128 KB, adapting up to 32 MB) with fresh
pages from the kernel and unmaps them on free. A training step's large temporaries (the logits
and their gradients: tens of MB each for a 13k vocabulary) are therefore new memory every step,
and the kernel zero-fills each page on first touch: ~25 % of an LSTM LM step on this machine
(0.20 -> 0.15 s, `benchmarks/lm_neural.py`'s model). Inside `reuse_freed_memory()` large blocks come
from the heap and freed ones are kept for the next step; on exit glibc's settings are restored
(its adaptive threshold as it ends up after large frees: 32 MB) and the free heap is returned to
the system. Elsewhere (other C libraries, other systems) it does nothing.

`adaptive_mmap_threshold()` puts back, for good, the mmap threshold glibc's adaptive rule reaches by itself, in
a process whose environment froze it (a Dask worker: its nanny sets MALLOC_TRIM_THRESHOLD_=65536, which also
pins the mmap threshold at 128 KB, so every array above that is fresh zero-filled pages, unmapped when freed:
a co-occurrence shard took 3× the page faults and ~20 % more CPU than in a plain process).

`keep_freed_heap()` is for a Dask worker while a stage's shards run one after another: the heap's free top is
kept (no trimming) for the next shard, whose arrays then take pages already there; the stage hands it back
when it ends (`release_freed_memory()` on every worker: `tasks/parallel.py`).

`release_freed_memory()` is the other direction, for a long streaming loop (a large compressed file's
batches, `models/ingest/sharding.py`): hand what a batch freed back to the system, so each batch's
transient peak does not land beside memory kept from the last ones.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pyarrow as pa

# mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_MMAP_MAX = -1, -3, -4
_KEEP_ALL = 2**31 - 1  # mallopt takes an int
_MMAP_MAX_DEFAULT, _MMAP_THRESHOLD_MAX = 65536, 32 << 20


def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 - glibc only (musl has no mallopt tunables)
        return libc
    except (OSError, AttributeError):
        return None


@contextmanager
def reuse_freed_memory() -> Iterator[bool]:
    """Within: no mmap'd blocks and no heap trimming. Yields whether the setting took effect."""
    libc = _glibc()
    if libc is None or not (libc.mallopt(_M_MMAP_MAX, 0) and libc.mallopt(_M_TRIM_THRESHOLD, _KEEP_ALL)):
        yield False
        return
    try:
        yield True
    finally:
        libc.mallopt(_M_MMAP_MAX, _MMAP_MAX_DEFAULT)
        adaptive_mmap_threshold()
        libc.mallopt(_M_TRIM_THRESHOLD, 2 * _MMAP_THRESHOLD_MAX)  # what glibc's adaptive rule pairs with it
        libc.malloc_trim(0)


def adaptive_mmap_threshold() -> bool:
    """Blocks under 32 MB from the heap, freed ones reused: where glibc's adaptive mmap threshold ends up
    after large frees. The trim threshold stays as the environment set it (Dask's 64 KB returns the heap's
    free top: a corpus shard's worker peaked at 1.4 GB with it, 1.7 GB with glibc's adaptive 64 MB, in
    the same time). Returns whether it took effect (glibc only)."""
    libc = _glibc()
    return libc is not None and bool(libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX))


def keep_freed_heap() -> bool:
    """No trimming of the heap's free top (Dask's nanny sets a 64 KB threshold: every shard's heap memory went
    back to the system, the next shard's came fresh, zero-filled, which costs 2-4x more kernel time when two
    workers fault at once). Until `release_freed_memory()`, which trims once. Returns whether it took effect."""
    libc = _glibc()
    return libc is not None and bool(libc.mallopt(_M_TRIM_THRESHOLD, _KEEP_ALL))


def release_freed_memory() -> None:
    """Return memory freed so far to the system: Arrow's pool and glibc's heap keep it otherwise, and a
    long shard's peak then creeps up batch after batch (a 512 MiB gzip file: 1.78 GB after nine batches
    against 1.57 GB with this; docs/reliability.md)."""
    pa.default_memory_pool().release_unused()
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
