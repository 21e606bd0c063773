"""The cold scaling benchmark's baseline: the default runner's runs from both rows that run it."""

from __future__ import annotations

import statistics

from benchmarks.scaling import cold_runners, default_runs


def test_the_default_runner_timed_in_two_rows_is_one_pooled_baseline():
    runners = cold_runners("tcp://127.0.0.1:8786", ["threads", "processes", "dask", "cluster"])
    default_row = next(iter(runners))
    runs = {name: [] for name in runners}
    runs[default_row] = [40.4, 41.8, 42.1, 41.9]  # the 300 MB rounds of 2026-11-29
    runs["threads"] = [40.8, 37.6, 36.2, 39.8]
    runs["local"] = [66.0, 65.9, 66.1, 60.5]
    runs["processes"] = [30.0]  # another runner: never pooled
    runs["dask, a LocalCluster of 2 the run starts"] = [40.7, 40.5, 44.0, 37.0]
    pooled = default_runs(runs, runners)
    assert sorted(pooled) == sorted(runs[default_row] + runs["threads"])
    assert statistics.median(pooled) == (40.4 + 40.8) / 2  # by hand: the 4th and 5th of eight sorted runs


def test_without_the_threads_row_the_baseline_is_the_default_rows_own():
    runners = cold_runners("", ["dask"])
    runs = {name: [float(i)] for i, name in enumerate(runners)}
    assert default_runs(runs, runners) == [0.0]
