"""Sharded stages on a Prefect task runner.

A sharded stage cuts its input into shards (byte ranges of files, row ranges of a table), runs
one shard task per shard on the runner that `ParallelParams.runner` names, and merges the results
in shard order (counts add, rows concatenate), so the artifact is the same whatever the runner or
shard size, and so is its version (`parallel` is not versioned, tasks/stage.py).

- `local`, or a single shard: the shard functions are called here, one after the other: no pool,
  no extra task runs (the small default corpus pays nothing).
- `threads`: Prefect's `ThreadPoolTaskRunner`; results stay in memory, except for merges that
  stream (`map_shards(lazy=True)`: corpus, encoding), whose shards write Parquet parts as below.
- `processes`: Prefect's `ProcessPoolTaskRunner`; `dask`: `prefect_dask.DaskTaskRunner` on the
  cluster at `dask_address`, or a `LocalCluster` of `workers` single-threaded worker processes.
  Results travel as Parquet parts written to the writer's work folder (`<store>/.staging/...-work`,
  so workers on other machines need the store on a shared filesystem) and only their paths and
  small counts come back, never pickled tables.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import scipy.sparse as sp
from lexiflow.models.progress import Progress
from lexiflow.storage import ArtifactWriter
from lexiflow.tasks.params import ParallelParams
from lexiflow.tasks.stage import retry_transient_only
from prefect.cache_policies import NO_CACHE
from prefect.task_runners import ProcessPoolTaskRunner, TaskRunner, ThreadPoolTaskRunner

# Options of every shard task: no cache or persisted result (the stage around it caches the
# artifact); transient I/O errors retried like the stages'.
SHARD_TASK: dict[str, Any] = {"cache_policy": NO_CACHE, "persist_result": False, "retries": 2,
                              "retry_delay_seconds": [1, 2], "retry_condition_fn": retry_transient_only}


def task_runner(params: ParallelParams) -> TaskRunner:
    """The Prefect task runner `params` describe (not entered)."""
    if params.runner == "processes":
        return ProcessPoolTaskRunner(max_workers=params.workers)
    if params.runner == "dask":
        from prefect_dask import DaskTaskRunner

        if params.dask_address:
            return DaskTaskRunner(address=params.dask_address)
        # One thread per worker process: polars/numpy inside a shard are the parallelism.
        return DaskTaskRunner(cluster_kwargs={"n_workers": params.workers, "threads_per_worker": 1,
                                              "dashboard_address": None})
    return ThreadPoolTaskRunner(max_workers=params.workers)


def row_ranges(n_rows: int, shard_rows: int) -> list[tuple[int, int]]:
    """[start, stop) ranges of at most `shard_rows` rows covering `n_rows` (one range when empty)."""
    n = max(1, math.ceil(n_rows / shard_rows))
    return [(i * shard_rows, min((i + 1) * shard_rows, n_rows)) for i in range(n)]


def map_shards(fn: Any, calls: Sequence[dict[str, Any]], params: ParallelParams, name: str,
               out: ArtifactWriter, lazy: bool = False) -> list[Any]:
    """fn(**call, part=...) for every call, results in call order with every `Part` read back:
    inline for one call or the local runner, else as task runs on the runner (`fn` is a Prefect task
    that passes its large results through `deliver(result, part)`). Parts live in the writer's own
    work folder while the shards run (a concurrent build of the same version has its own) and are
    removed once read.

    `lazy`: tables come back as LazyFrames over their parts, read when the caller collects them (a
    merge that streams holds one shard's table at a time); the threads runner writes parts too, and
    the parts stay until the writer ends."""
    inline = len(calls) <= 1 or params.runner == "local"
    folder = None if inline or (params.runner == "threads" and not lazy) else out.work / "shards"
    if folder is not None:  # results cross a process boundary: each shard writes Parquet parts
        folder.mkdir(parents=True)
    calls = [{**call, "part": None if folder is None else str(folder / f"{i:06d}")} for i, call in enumerate(calls)]
    results = []
    with (Progress(f"{name} shards", total=len(calls), unit="shards", callback=out.progress) as bar,
          nullcontext() if inline else task_runner(params) as runner):
        outcomes = (fn.fn(**call) for call in calls) if inline else \
            (future.result() for future in [runner.submit(fn, parameters=call) for call in calls])
        for outcome in outcomes:
            results.append(_received(outcome, lazy))
            bar.update()
    if folder is not None and not lazy:
        shutil.rmtree(folder, ignore_errors=True)
    return results


# ---- shard results: in memory, or a Parquet part (tables; sparse matrices as row, col, value) ----
@dataclass(frozen=True)
class Part:
    """A shard result written to a Parquet file (what crosses the process boundary instead)."""

    path: str


def deliver(result: pl.DataFrame | sp.spmatrix, part: str | None, name: str = "") -> Any:
    """The shard's result itself (`part` None), or the `Part` it was written to (`name` tells apart
    several results of one shard)."""
    if part is None:
        return result
    path = f"{part}{'-' + name if name else ''}.parquet"
    if isinstance(result, pl.DataFrame):
        result.write_parquet(path, compression="lz4")  # a temporary part: fast over small
    else:
        coo = sp.coo_matrix(result)
        table = pa.table({"row": coo.row.astype(np.int64), "col": coo.col.astype(np.int64), "value": coo.data})
        pq.write_table(table.replace_schema_metadata({"shape": json.dumps(list(coo.shape))}), path)
    return Part(path)


def _received(result: Any, lazy: bool = False) -> Any:
    """A shard's result with its `Part`s (also inside a tuple) read back (tables as LazyFrames with `lazy`)."""
    if isinstance(result, tuple):
        return tuple(_received(item, lazy) for item in result)
    if not isinstance(result, Part):
        return result
    metadata = pq.read_schema(result.path).metadata or {}
    if b"shape" not in metadata:
        return pl.scan_parquet(result.path) if lazy else pl.read_parquet(result.path)
    table = pq.read_table(result.path)
    shape = tuple(json.loads(metadata[b"shape"]))
    return sp.csr_matrix((table["value"].to_numpy(), (table["row"].to_numpy(), table["col"].to_numpy())), shape=shape)


def sum_matrices(matrices: list[sp.spmatrix], shape: tuple[int, int] | None = None) -> sp.csr_matrix:
    """Sum of shard matrices (exact for integer counts, in any order), of `shape` (default: the
    first's; smaller ones are padded). CSR additions: linear merges of sorted rows, no re-sort."""
    shape = shape or matrices[0].shape
    total = None
    for matrix in matrices:
        matrix = matrix.tocsr()
        if matrix.shape != shape:
            matrix = matrix.copy()
            matrix.resize(shape)
        total = matrix if total is None else total + matrix
    return total
