"""Sharded stages: shards planned, run on a pool of threads, processes or Dask workers, and merged.

A sharded stage cuts its input into shards (byte ranges of files, row ranges of a table: `shard_ranges`), runs
one shard task per shard on the runner that `ParallelParams.runner` names (tasks/runners.py), and merges the
results (counts add, rows concatenate in shard order), so the artifact is the same whatever the runner or
shard size, and so is its version (`parallel` is not versioned, tasks/stage.py). Inline (the `local` runner, or
a single shard) the shard functions are called here, one after the other, with no pool.

The stage is the Prefect task run (cached, retried, its progress counting the shards); a shard task is a plain
call of a module-level function on the pool, not a task run of its own. The shard and merge functions live in
`tasks.shards`, and their results cross processes as parts (`tasks.parts`); this module imports `tasks.params`
for type checking only.

Count merges run on the runner, two ways. `reduce_shards` (word counts): a balanced tree built as
results finish, four results of the same level merged by a merge task (reading their parts, writing
one), so the driver receives one merged result. `reduce_partitioned` (co-occurrence counts, whose total
grows with the corpus): each shard cuts its counts into key-space partitions (word ids ≡ p mod P), one
record batch each of one Arrow file; once the shards are done, P merge tasks each read their batch of every
shard and add them, in parallel and in one pass, so no worker ever holds more than one partition.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import suppress
from typing import TYPE_CHECKING, Any

import polars as pl
import scipy.sparse as sp
from lexiflow.models.progress import Progress
from lexiflow.models.shards import aligned, equal_ranges
from lexiflow.models.threads import machine_cores
from lexiflow.storage import ArtifactRef, ArtifactWriter
from lexiflow.storage.formats import row_groups
from lexiflow.tasks.parts import deliver, filesystem, part_paths, received, remove_folder
from lexiflow.tasks.runners import Pool

if TYPE_CHECKING:  # params imports every model (torch, gensim): not on a worker's import path (parallel.py)
    from lexiflow.tasks.params import ParallelParams

_log = logging.getLogger("lexiflow.parallel")
# Results one merge task adds up: fewer tasks (each a round trip through the pool, and a part written and read
# again) than pairs, still a shallow tree (log4 n levels) whose top merges hold little more than the total.
MERGE_FAN_IN = 4


def shard_ranges(ref: ArtifactRef, name: str, parallel: ParallelParams,
                 rows_per_shard: int | None = None) -> list[tuple[int, int]]:
    """Row ranges of an artifact's Parquet table, one per shard: `parallel.shard_rows` rows each when set, else
    `rows_per_shard`, else as many rows as hold ~`parallel.shard_bytes` of the table uncompressed (from its
    footer), so that documents of any length make shards of like work and memory; cut at the table's row-group
    boundaries where one is near (`shards.aligned`: a shard reads whole row groups)."""
    groups = row_groups(ref, name)
    rows, size = sum(n for n, _ in groups), sum(b for _, b in groups)
    per_shard = parallel.shard_rows or rows_per_shard or max(1, parallel.shard_bytes * rows // max(size, 1))
    return aligned(equal_ranges(rows, per_shard), list(itertools.accumulate(n for n, _ in groups[:-1])))


def map_shards(fn: Any, calls: Sequence[dict[str, Any]], params: ParallelParams, name: str,
               out: ArtifactWriter, lazy: bool = False) -> list[Any]:
    """fn(**call, part=...) for every call, results in call order (`stream_shards`, all of them)."""
    return list(stream_shards(fn, calls, params, name, out, lazy))


def stream_shards(fn: Any, calls: Sequence[dict[str, Any]], params: ParallelParams, name: str,
                  out: ArtifactWriter, lazy: bool = False) -> Iterator[Any]:
    """fn(**call, part=...) for every call, results yielded in call order with every `Part` read back,
    each as soon as it and those before it are done (a merge that streams, writing in order, works while
    later shards run): inline for one call or the local runner, else as tasks on the runner's pool (`fn` is
    a module-level function, which workers import by name, that passes its large results through
    `deliver(result, part)`). Parts live in the
    writer's own folders while the shards run (a concurrent build of the same version has its own) and
    are removed once read.

    `lazy`: tables come back as LazyFrames over their parts, read when the caller collects them (a
    merge that streams holds one shard's table at a time); the threads runner writes parts too, and
    the parts stay until the writer ends."""
    if len(calls) <= 1 or params.runner == "local":
        with Progress(f"{name} shards", total=len(calls), unit="shards", callback=out.progress) as bar:
            for call in calls:
                yield _counted(fn(**call, part=None), bar)
        return
    folder = _parts_folder(params, out, parts=lazy)
    results: dict[int, Any] = {}
    following = 0  # the next result in call order
    start = time.perf_counter()
    with Progress(f"{name} shards", total=len(calls), unit="shards", callback=out.progress) as bar, \
            Pool(params, name, folder) as pool:
        pool.submit_shards(fn, calls)
        for i, result in pool.completed():
            results[i] = received(result, lazy, out.work / "received")
            bar.update()
            while following in results:
                yield results.pop(following)
                following += 1
    _log.info("%s: %d shards in %.1f s", name, len(calls), time.perf_counter() - start)
    if folder is not None and not lazy:
        remove_folder(folder)


def reduce_shards(fn: Any, calls: Sequence[dict[str, Any]], combine: Callable[[list[Any]], Any],
                  params: ParallelParams, name: str, out: ArtifactWriter) -> Any:
    """`combine` of every fn(**call, part=...) result, read back. `combine(results)` merges a list of
    shard results into one of the same shape (a tuple of tables, sparse matrices and numbers), exactly
    and in any order (counts add). Inline (local runner, one call): `combine` of all results, here.
    On a pool: a tree on the workers, groups of finished results merged by merge tasks that read their
    parts and write one, so only the last merged result comes to this process."""
    if len(calls) <= 1 or params.runner == "local":
        results = map_shards(fn, calls, params, name, out)
        return results[0] if len(results) == 1 else combine(results)
    folder = _parts_folder(params, out, parts=False)
    with Progress(f"{name} shards", total=len(calls), unit="shards",
                  callback=out.progress) as bar, Pool(params, name, folder) as pool:
        pool.submit_shards(fn, calls)
        # A balanced tree, built as results come (in any order: the merge is exact in any order): MERGE_FAN_IN
        # results of the same level (shards: 0, a merge: one more than its inputs') merge, so each count is
        # read and written about log(n) times, not n times as in a chain onto one growing total; once nothing
        # else can come, the lowest ones merge.
        levels: dict[Any, int] = dict.fromkeys(range(len(calls)), 0)
        ready: list[tuple[int, Any]] = []
        merges = 0
        for key, result in pool.completed():
            if isinstance(key, int):  # a shard (merges are not counted: their number depends on the order)
                bar.update()
            ready = sorted([*ready, (levels.pop(key), result)], key=lambda item: item[0])
            level = _full_level(ready)
            if level is not None or (len(ready) > 1 and not pool.futures):
                group = [item for item in ready if item[0] == level][:MERGE_FAN_IN] if level is not None \
                    else ready[:MERGE_FAN_IN]
                ready = [item for item in ready if not any(item is g for g in group)]
                merges += 1
                levels[key := f"m{merges:06d}"] = max(lvl for lvl, _ in group) + 1
                pool.submit(merge_group, {"combine": combine, "results": [r for _, r in group]}, key, f"merge {merges}")
    ((_, final),) = ready
    result = received(final)
    if folder is not None:
        remove_folder(folder)
    return result


def _full_level(ready: list[tuple[int, Any]]) -> int | None:
    """A level holding MERGE_FAN_IN ready results, if any."""
    counts: dict[int, int] = {}
    for level, _ in ready:
        counts[level] = counts.get(level, 0) + 1
    return next((level for level, n in counts.items() if n >= MERGE_FAN_IN), None)


def merge_group(combine: Callable[[list[Any]], Any], results: list[Any], part: str | None) -> Any:
    """One node of a tree merge: `combine` of shard (or merged) results, delivered as parts; the parts
    read are removed (best effort: the writer's folder goes at its end anyway)."""
    merged = combine([received(result) for result in results])
    delivered = tuple(deliver(item, part, str(j)) if isinstance(item, pl.DataFrame | sp.spmatrix) else item
                      for j, item in enumerate(merged if isinstance(merged, tuple) else (merged,)))
    for fs, path in map(filesystem, part_paths(results)):
        with suppress(OSError):
            fs.rm(path)
    return delivered if isinstance(merged, tuple) else delivered[0]


def partition_count(n_shards: int, slots: int) -> int:
    """Key-space partitions of a partitioned reduction on a pool running `slots` tasks at once: about one
    merge task per MERGE_FAN_IN shards, so a merge holds about that many shard results' worth of counts
    whatever the corpus size (flat memory per worker), in whole rounds of the slots (one each at least)."""
    rounds = math.ceil(n_shards / MERGE_FAN_IN / slots)
    return slots * max(1, rounds)  # whole rounds: no worker idles through the last one


def reduce_partitioned(fn: Any, calls: Sequence[dict[str, Any]], merge: Callable[[list[Any]], Any],
                       params: ParallelParams, name: str, out: ArtifactWriter,
                       consume: Callable[[Iterator[tuple]], Any] = list) -> tuple[list[Any], Any, int]:
    """Run fn(**call, partitions=P, part=...) for every call; its result is (partitions, *rest), where
    partitions[p] holds the shard's counts of key partition p (`deliver_partitions(row_partitions(...))`).
    Returns ([merge(partition p of every shard) for p < P], consume(rests), threads), `threads` being what the
    caller's last steps here may use: the tasks the runner ran at once (1 inline), idle by now, at most this
    machine's cores. `consume` takes an iterator
    over each shard's rest in call order, each as soon as it and those before it are done (a streamed
    write works while later shards run), its tables as LazyFrames over their parts (as `map_shards(lazy=True)`).
    On a pool, once every shard is done, the P merges run as tasks on the runner (each reads its record
    batch of every shard's part: one pass, in parallel, no worker holding more than its partition) and come back
    read. Inline (local runner, one call): one partition, merged here."""
    if len(calls) <= 1 or params.runner == "local":
        blocks: list[Any] = []

        def inline() -> Iterator[tuple]:
            for result in stream_shards(fn, [{**call, "partitions": 1} for call in calls], params, name, out):
                blocks.append(result[0][0])
                yield tuple(result[1:])

        consumed = _drained(inline(), consume)
        return [merge(blocks)], consumed, 1
    folder = _parts_folder(params, out, parts=True)
    shards: dict[int, Any] = {}
    merged: dict[str, Any] = {}
    start = time.perf_counter()
    with Progress(f"{name} shards", total=len(calls), unit="shards", callback=out.progress) as bar, \
            Pool(params, name, folder) as pool:
        slots = pool.slots()
        partitions = partition_count(len(calls), slots)
        pool.submit_shards(fn, [{**call, "partitions": partitions} for call in calls])

        def in_order() -> Iterator[tuple]:
            following = 0
            for i, result in pool.completed():
                shards[i] = result
                bar.update()
                while following in shards:
                    yield received(tuple(shards[following][1:]), lazy=True, downloads=out.work / "received")
                    following += 1

        consumed = _drained(in_order(), consume)
        shards_done = time.perf_counter()
        for p in range(partitions):
            blocks = [shards[i][0][p] for i in range(len(calls))]
            pool.submit(merge_partition, {"merge": merge, "blocks": blocks}, f"p{p:06d}",
                        f"merge of partition {p + 1}/{partitions}")
        for key, result in pool.completed():
            merged[key] = received(result)
    _log.info("%s: %d shards in %.1f s, then %d partition merges in %.1f s", name, len(calls),
              shards_done - start, partitions, time.perf_counter() - shards_done)
    for fs, path in map(filesystem, sorted({block.path for i in shards for block in shards[i][0]})):
        with suppress(OSError):  # the partitions are merged; the rest stays until the writer ends
            fs.rm(path)
    return [merged[f"p{p:06d}"] for p in range(partitions)], consumed, min(slots, machine_cores())


def _drained(items: Iterator[Any], consume: Callable[[Iterator[Any]], Any]) -> Any:
    """consume(items), then whatever it left of them (so every shard is done when this returns)."""
    consumed = consume(items)
    for _ in items:
        pass
    return consumed


def merge_partition(merge: Callable[[list[Any]], Any], blocks: list[Any], part: str | None) -> Any:
    """One key partition's merge: `merge` of its blocks from every shard, delivered as a part."""
    merged = merge([received(block) for block in blocks])
    return deliver(merged, part) if isinstance(merged, pl.DataFrame | sp.spmatrix) else merged


def _parts_folder(params: ParallelParams, out: ArtifactWriter, parts: bool) -> str | None:
    """Where shards deliver their results: the store's staging area for Dask (workers anywhere), the
    local work folder for processes (or threads when `parts`), none (memory) for threads."""
    if params.runner == "threads" and not parts:
        return None
    folder = out.shared if params.runner == "dask" else str(out.work / "shards")
    fs, path = filesystem(folder)
    fs.makedirs(path, exist_ok=True)  # a no-op on object stores
    return folder


def _counted(result: Any, bar: Progress) -> Any:
    bar.update()
    return result
