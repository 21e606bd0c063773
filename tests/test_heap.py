"""models/heap.py: inside `reuse_freed_memory`, a freed large block is reused instead of fresh pages; after
`adaptive_mmap_threshold`, a freed block under 32 MB is, in a process started as Dask's nanny starts its workers;
after `keep_freed_heap`, the heap's freed top too, until `release_freed_memory`."""

import os
import resource
import subprocess
import sys

import numpy as np
import pytest
from lexiflow.models.heap import _glibc, adaptive_mmap_threshold, reuse_freed_memory


def _page_faults_of_a_second_large_array() -> int:
    first = np.ones(16_000_000)  # 128 MB: above glibc's largest mmap threshold (32 MB)
    del first
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    second = np.ones(16_000_000)
    del second
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


@pytest.mark.skipif(_glibc() is None, reason="glibc's mallopt only")
def test_large_blocks_are_reused_inside_and_returned_after():
    outside = _page_faults_of_a_second_large_array()
    with reuse_freed_memory() as active:
        inside = _page_faults_of_a_second_large_array()
    after = _page_faults_of_a_second_large_array()
    assert active
    # fresh pages each time: 128 MB is >= 64 faults even when the kernel backs it with 2 MB huge pages
    assert outside >= 32 and after >= 32
    assert inside <= min(8, outside // 4)  # the freed block came back


def test_does_nothing_without_glibc(monkeypatch):
    monkeypatch.setattr("lexiflow.models.heap._glibc", lambda: None)
    with reuse_freed_memory() as active:
        assert not active


def page_faults_of_a_second_block() -> int:
    """Page faults of a 16 MB array made after one of that size was freed (self-contained: Dask workers run it)."""
    import resource

    import numpy as np

    first = np.ones(2_000_000)  # 16 MB: under glibc's largest mmap threshold (32 MB), over its default (128 KB)
    pin = np.ones(2_000_000)  # after it: the freed block is not the heap's top (which a low trim threshold returns)
    del first
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    second = np.ones(2_000_000)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    del second, pin
    return faults


@pytest.mark.skipif(_glibc() is None, reason="glibc's mallopt only")
def test_adaptive_mmap_threshold_reuses_blocks_a_dask_like_environment_would_unmap():
    code = ("from lexiflow.models.heap import adaptive_mmap_threshold\n"
            "from tests.test_heap import page_faults_of_a_second_block as faults\n"
            "print(faults(), adaptive_mmap_threshold(), faults())")
    env = {**os.environ, "MALLOC_TRIM_THRESHOLD_": "65536"}  # what a Dask nanny gives its workers
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                            cwd=os.path.dirname(os.path.dirname(__file__)))
    frozen, active, adaptive = result.stdout.split()
    assert active == "True"
    assert int(frozen) >= 8  # fresh pages: >= 8 even when the kernel backs 16 MB with 2 MB huge pages
    assert int(adaptive) <= min(2, int(frozen) // 4)  # the freed block came back


def faults_of_a_top_block(free_first: bool = True) -> int:
    """Page faults of a 16 MB array at the heap's top, made after one such was freed (`free_first`) or after
    whatever was freed before (self-contained: a subprocess runs it)."""
    import resource

    import numpy as np

    if free_first:
        first = np.ones(2_000_000)
        del first  # the heap's top: a low trim threshold returns it at once
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    second = np.ones(2_000_000)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    del second
    return faults


@pytest.mark.skipif(_glibc() is None, reason="glibc's mallopt only")
def test_keep_freed_heap_keeps_its_top_for_the_next_shard_until_released():
    code = ("from lexiflow.models.heap import adaptive_mmap_threshold, keep_freed_heap, release_freed_memory\n"
            "from tests.test_heap import faults_of_a_top_block as faults\n"
            "adaptive_mmap_threshold()\n"
            "trimmed = faults()\n"
            "active = keep_freed_heap()\n"
            "kept = faults()\n"
            "release_freed_memory()\n"
            "print(trimmed, active, kept, faults(free_first=False))")
    env = {**os.environ, "MALLOC_TRIM_THRESHOLD_": "65536"}  # what a Dask nanny gives its workers
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                            cwd=os.path.dirname(os.path.dirname(__file__)))
    trimmed, active, kept, released = result.stdout.split()
    assert active == "True"
    assert int(trimmed) >= 8 and int(released) >= 8  # fresh pages: the top went back to the system
    assert int(kept) <= min(2, int(trimmed) // 4)  # the freed top came back


def test_adaptive_mmap_threshold_does_nothing_without_glibc(monkeypatch):
    monkeypatch.setattr("lexiflow.models.heap._glibc", lambda: None)
    assert not adaptive_mmap_threshold()


@pytest.mark.parametrize("own", [None, "narenas:1"])
def test_polars_allocator_keeps_freed_pages_as_lexiflow_sets_it_unless_the_user_set_it(own):
    """jemalloc (polars' allocator) reads its settings when polars loads, the last of a key winning: after
    lexiflow, polars' own defaults come first and lexiflow's decay last; a user's own setting stays last."""
    from lexiflow import POLARS_ALLOCATOR

    env = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    env |= {"_RJEM_MALLOC_CONF": own} if own else {}
    code = "import lexiflow, polars, os; print(os.environ['_RJEM_MALLOC_CONF'])"
    conf = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    settings = conf.strip().split(",")
    assert settings[-1] == (own or POLARS_ALLOCATOR.split(",")[-1]) and "dirty_decay_ms:500" in settings
    if not own:  # the decay polars would have: lexiflow's 3 s, not its 0.5 s
        assert [s for s in settings if s.startswith("dirty_decay_ms")][-1] == "dirty_decay_ms:3000"
