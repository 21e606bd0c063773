"""The scaling benchmark's baselines: the default runner's cold runs from both rows that run it, and its warm
stages beside the Dask workers'."""

from __future__ import annotations

import statistics

from benchmarks.scaling import DEFAULT_WARM, against_default, cold_runners, default_against_itself, default_runs


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
    assert default_runs(runs, runners, 2) == [42.1, 36.2]  # the third round's: what its Dask run is paired with
    # the same runner's two rows, round by round: 40.8/40.4, 37.6/41.8, 36.2/42.1, 39.8/41.9 (the noise band)
    assert default_against_itself(runs, runners) == [40.8 / 40.4, 37.6 / 41.8, 36.2 / 42.1, 39.8 / 41.9]


def test_without_the_threads_row_the_baseline_is_the_default_rows_own():
    runners = cold_runners("", ["dask"])
    runs = {name: [float(i)] for i, name in enumerate(runners)}
    assert default_runs(runs, runners) == [0.0]
    assert default_against_itself(runs, runners) == []


def test_warm_stages_on_dask_are_compared_with_the_default_runners_on_the_workers_stages_only():
    nan = float("nan")
    dask = {"corpus": (8.0, (0.9, 1.6, ""), None), "tokenizer": (10.0, (0.8, 2.0, ""), None),
            "ppmi": (3.0, (1.1, nan, ""), None)}  # a stage of the flow's process: no worker peak
    default = {"corpus": (10.0, (2.0, nan, ""), None), "tokenizer": (9.0, (2.1, nan, ""), None),
               "ppmi": (3.3, (1.1, nan, ""), None)}
    rows = against_default("300 MB", dask, default)
    assert [row.case for row in rows] == [f"300 MB text, corpus, 2 Dask workers against {DEFAULT_WARM}",
                                          f"300 MB text, tokenizer, 2 Dask workers against {DEFAULT_WARM}"]
    assert [row.ours for row in rows] == [10.0 / 8.0, 9.0 / 10.0]  # the default's seconds over Dask's: > 1 is faster
    assert all(row.higher_is_better and row.peer == 1.0 for row in rows)
