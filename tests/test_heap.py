"""models/heap.py: inside `reuse_freed_memory`, a freed large block is reused instead of fresh pages."""

import resource

import numpy as np
import pytest
from lexiflow.models.heap import _glibc, reuse_freed_memory


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
