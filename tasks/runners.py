"""The runners a sharded stage's tasks run on (tasks/parallel.py): a thread pool, this process's pool of
processes, or a Dask cluster, which this module starts, keeps and readies, and one stage's tasks on it (`Pool`).

- `local`, or a single shard: no pool; tasks/parallel.py calls the shard functions itself, one after the other
  (the small default corpus pays nothing).
- `threads`: a thread pool in this process, a stage's own; results stay in memory, except for merges that
  stream (`map_shards(lazy=True)`: corpus, encoding), whose shards write parts (tasks/parts.py).
- `processes`: a pool of `workers` spawned processes this process starts at its first such stage and keeps
  for the later ones (`process_pool`); results travel as parts (Arrow IPC files) in the writer's local work
  folder (one machine).
- `dask`: the cluster at `dask_address`, or a `LocalCluster` of `workers` single-threaded worker processes
  that this process starts at its first sharded stage, or as `lexiflow run` starts (`start_local_cluster`),
  and keeps for the later ones (`local_cluster`): a worker's start-up, importing lexiflow and the stage's
  libraries, cost ~10 s per stage on 2 cores when each stage started its own. Its workers fork from a
  forkserver that has loaded Dask, NumPy and SciPy (`worker_forkserver`), and its monitors run quietly
  (`QUIET_DASK`). Results travel as parts in the writer's shared
  folder in the store's staging area (`ArtifactWriter.shared`: a path, or an s3://... URL read and
  written through fsspec), so workers share nothing with the driver but the store URL; only the
  parts' paths and small counts come back, never pickled tables.

A task is a plain call of a module-level function on the pool (`run_shard`), not a Prefect task run: a shard
task run cost ~0.12 s of Prefect bookkeeping on the worker and the server, and on Dask it carried the flow's
context, whose flow and parameters made every worker import all of lexiflow's models (torch, gensim: ~11 CPU s a
worker). This module imports `tasks.params` for type checking only, and `tasks.shards` (the shard and merge
functions, which import neither Prefect nor the models, nor this module) only to load it on the workers early.
The log lines a task makes on a worker are logged again where the stage runs, so they reach the stage's run in
the UI.

On Dask, each stage readies the workers: a worker plugin gives them back glibc's adaptive mmap threshold
(Dask's nanny pins it low: fresh pages for every NumPy array), and a LocalCluster the runner starts gives its
worker processes WORKER_ENVIRONMENT (one polars thread each, freed pages kept a while: lexiflow's
`POLARS_ALLOCATOR`); workers started elsewhere with more polars threads are warned about. Tasks are
submitted with random keys (Dask would hash each whole pickled message).

A failing shard fails the stage with a one-line `ShardError` naming the stage, the shard, the worker
and its exception, at once (not after the shards before it), and cancels the stage's other tasks: a
transient I/O error is retried twice where the shard ran (`SHARD_RETRY_DELAYS`), other errors not at all.
On Dask, a probe first loads each task (shard, merge) with its first call on a worker, so a worker that
cannot import them fails the stage with the worker's ImportError (Dask itself would drop a worker that cannot
load a task's message, then wait for another forever); a cluster left with no worker for `NO_WORKER_SECONDS`
fails it too.
"""

from __future__ import annotations

import atexit
import contextvars
import functools
import logging
import multiprocessing
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any
from uuid import uuid4

import polars as pl
from lexiflow import POLARS_ALLOCATOR
from lexiflow.models.errors import LexiflowError
from lexiflow.models.heap import adaptive_mmap_threshold, keep_freed_heap, release_freed_memory
from lexiflow.storage.store import retrying
from lexiflow.tasks.retries import worth_retrying

if TYPE_CHECKING:  # params imports every model (torch, gensim): not on a worker's import path (runners.py)
    from lexiflow.tasks.params import ParallelParams

_log = logging.getLogger("lexiflow.parallel")


# A shard that fails on a transient I/O error (`retries.worth_retrying`) runs again after these pauses, where it ran.
SHARD_RETRY_DELAYS = (1.0, 2.0)
# What a Dask worker process needs in its environment before it starts. Its one task thread is its core, and
# polars sizes its own pool once, from the cores: N workers on N cores would run N² polars threads (the corpus
# stage on 2 workers, 2 cores: 25 CPU s and 18 s, against 20 and 15 with this). And polars' allocator as lexiflow
# sets it (freed pages kept 3 s: `lexiflow.POLARS_ALLOCATOR`).
WORKER_ENVIRONMENT = {"POLARS_MAX_THREADS": "1", "_RJEM_MALLOC_CONF": POLARS_ALLOCATOR}
# What a worker of a Dask cluster lexiflow starts finds loaded: these load once, in the forkserver its workers fork
# from (`worker_forkserver`), not once a worker (~1.2 of a worker's ~1.9 s of imports). Only modules that start no
# thread as they load: polars and pyarrow start their allocators' threads, which a fork would leave behind.
FORKSERVER_PRELOAD = ["distributed", "numpy", "scipy.sparse", "pydantic", "fsspec", "cloudpickle"]
# What a Dask cluster lexiflow starts runs besides its tasks. Dask's defaults sample each worker's stacks every
# 10 ms for the dashboard's profile, and time the event loop every 20 ms, memory every 100 ms and the system every
# 0.5 s, on the cores the shards need: an idle LocalCluster of 2 took 3.8 CPU s in 20 s so, 0.46 with these.
QUIET_DASK = {"distributed.worker.profile.enabled": False, "distributed.admin.tick.interval": "1s",
              "distributed.worker.memory.monitor-interval": "500ms",
              "distributed.admin.system-monitor.interval": "2s"}
# A Dask cluster with no worker for this long fails the stage (workers that died, or never came).
NO_WORKER_SECONDS = 120.0
_POLL_SECONDS = 2.0  # how often a wait for shard results looks at the cluster


class ShardError(LexiflowError):
    """A shard (or merge) task failed or cannot run: the stage fails with this one line."""


_clusters: dict[int, Any] = {}  # workers -> the LocalCluster this process started (`local_cluster`)
_starting: dict[int, Future] = {}  # workers -> the start of a LocalCluster in the background (`start_local_cluster`)
_process_pools: dict[int, ProcessPoolExecutor] = {}  # workers -> the process pool of `process_pool`


def start_local_cluster(workers: int) -> None:
    """Start `local_cluster(workers)` in the background, its workers importing the shard functions, for a run
    that will need it: started as the command starts, its start-up overlaps the command's own imports."""
    if workers not in _clusters and workers not in _starting:
        worker_forkserver()  # in the caller's thread: it sets this process's environment for a moment
        starter = ThreadPoolExecutor(1, thread_name_prefix="lexiflow-cluster-start")
        _starting[workers] = starter.submit(_warm_cluster, workers)
        starter.shutdown(wait=False)


def _warm_cluster(workers: int) -> None:
    from distributed import Client

    cluster = _new_local_cluster(workers)
    with suppress(Exception), Client(cluster.scheduler_address, set_as_default=False) as client:
        client.run(_load_shard_functions)  # a failure is the stage's probe's to report


def _load_shard_functions() -> None:
    import lexiflow.tasks.shards  # noqa: F401


def local_cluster(workers: int) -> Any:
    """The LocalCluster of `workers` worker processes this process runs its Dask stages on: started at the first
    (with WORKER_ENVIRONMENT) or before (`start_local_cluster`), kept for the next ones, closed at exit. One thread
    per worker process: polars and numpy inside a shard are the parallelism."""
    if (starting := _starting.pop(workers, None)) is not None:
        with suppress(Exception):  # a start that failed is tried again below, where its error is raised
            starting.result()
    return _new_local_cluster(workers)


def _new_local_cluster(workers: int) -> Any:
    cluster = _clusters.get(workers)
    if cluster is None or cluster.status.name in ("closing", "closed", "failed"):
        cluster = new_worker_cluster(workers, dashboard_address=":0")  # a free port: no clash
        _clusters[workers] = cluster
        atexit.register(cluster.close)
    return cluster


def process_pool(workers: int) -> ProcessPoolExecutor:
    """The pool of `workers` processes this process runs its `processes` stages on: started at the first, kept
    for the next ones (each process imports the shard functions' modules once a run, not once a stage), shut
    down at exit; a pool broken by a process that died is replaced. Spawned, not forked: the flow's process
    runs threads (Prefect's, polars') that a fork would copy mid-work."""
    pool = _process_pools.get(workers)
    if pool is None or pool._broken:  # noqa: SLF001 -- the one public sign is a failed submit
        pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))
        _process_pools[workers] = pool
        atexit.register(pool.shutdown, cancel_futures=True)
    return pool


def on_every_worker(params: ParallelParams, fn: Callable[[], Any]) -> None:
    """fn() on every worker of the Dask cluster at `params.dask_address`, best effort (a cleanup: a worker
    gone or unreachable is no error). Other runners' workers end with the stage's task runner."""
    if params.runner != "dask" or not params.dask_address:
        return
    from distributed import Client

    with suppress(Exception), Client(params.dask_address, timeout=5, set_as_default=False) as client:
        client.run(fn)


def _label(i: int, n: int, call: dict[str, Any]) -> str:
    """`shard i/n (what it reads)`, for errors."""
    if "start" in call and "stop" in call:
        what = f"rows {call['start']}-{call['stop']}"
    elif "shard" in call:
        what = ", ".join(f"{Path(r.path).name}" + (f" bytes {r.start}-{r.stop}" if r.stop is not None else "")
                         for r in call["shard"][:2]) + (", ..." if len(call["shard"]) > 2 else "")
    else:
        what = ""
    return f"shard {i + 1}/{n}" + (f" ({what})" if what else "")


class Pool:
    """Tasks on the pool `params` name (a thread pool, the run's process pool, a Dask cluster), results yielded
    as they finish (`completed`), each failure raised at once as a `ShardError`, a Dask cluster watched while the
    tasks wait. A task is a plain call of a module-level function (`run_shard`), not a Prefect task run: Prefect
    tracks the stage, whose progress counts the shards, and gets the shards' log lines from this process."""

    def __init__(self, params: ParallelParams, name: str, folder: str | None) -> None:
        self.params, self.name, self.folder = params, name, folder
        self.dask, self.threads = params.runner == "dask", params.runner == "threads"
        self.client: Any = None  # dask
        self.executor: Executor | None = None  # threads, processes
        self.done: queue.Queue = queue.Queue()
        self.futures: dict[Any, tuple[Any, str]] = {}  # key -> (future, label)
        self.probed: set[str] = set()  # functions whose first call a worker has loaded

    def __enter__(self) -> Pool:
        if self.dask:
            from distributed import Client

            address = self.params.dask_address or local_cluster(self.params.workers).scheduler_address
            self.client = Client(address, set_as_default=False)
            with suppress(Exception):  # a speed setting: a worker that cannot take it fails on the probe instead
                self.client.register_plugin(_worker_setup_plugin())
            _warn_oversubscribed(self.client)
        elif self.threads:
            self.executor = ThreadPoolExecutor(self.params.workers, thread_name_prefix=f"lexiflow-{self.name}")
        else:
            self.executor = process_pool(self.params.workers)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if exc_info[0] is not None:  # a failed stage: its other tasks would only load a pool that stays up
            for future, _ in self.futures.values():
                with suppress(Exception):
                    future.cancel()
        if self.dask:
            if exc_info[0] is None:  # the heap the workers kept from shard to shard goes back now
                with suppress(Exception):  # (`keep_freed_heap`; after a failure, at the next stage's end)
                    self.client.run(release_freed_memory)
            self.client.close()
        elif self.threads:
            self.executor.shutdown(wait=True, cancel_futures=True)

    def slots(self) -> int:
        """Tasks the pool runs at once: a Dask cluster's worker threads now (a cluster at `dask_address` has
        however many it has; `workers` sizes only the clusters lexiflow starts), else `workers`."""
        threads = sum(self.client.nthreads().values()) if self.dask else 0
        return threads or self.params.workers

    def submit_shards(self, fn: Callable[..., Any], calls: Sequence[dict[str, Any]]) -> None:
        """A stage's shards: task i runs fn(**calls[i]), keyed i, labelled for errors."""
        for i, call in enumerate(calls):
            self.submit(fn, call, i, _label(i, len(calls), call))

    def submit(self, fn: Callable[..., Any], call: dict[str, Any], key: Any, label: str) -> None:
        call = {**call, "part": None if self.folder is None else f"{self.folder}/{key:06d}"
                if isinstance(key, int) else f"{self.folder}/{key}"}
        if self.dask:
            if fn.__qualname__ not in self.probed:
                self._probe(fn, call, label)
            # a random key (pure=False): Dask would otherwise hash the whole pickled call
            future = self.client.submit(run_shard, fn, call, key=f"{fn.__name__}-{uuid4()}", pure=False)
        elif self.threads:  # the stage's context goes along: the shard's log lines are the stage's, as inline
            future = self.executor.submit(contextvars.copy_context().run, run_shard, fn, call, False)
        else:
            future = self.executor.submit(run_shard, fn, call)
        self.futures[key] = (future, label)
        future.add_done_callback(lambda _, key=key: self.done.put(key))

    def completed(self) -> Any:
        """(key, result) of each task as it finishes, while any is submitted and not yet yielded."""
        no_worker_since = None
        while self.futures:
            try:
                key = self.done.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                no_worker_since = self._watch(no_worker_since)
                continue
            future, label = self.futures.pop(key)
            try:
                result, records = future.result()
            except Exception as exc:
                raise ShardError(f"{self.name} {label} failed{self._where(future)}: {_one_line(exc)}") from exc
            for name, level, message in records:  # the worker's log lines, in the stage's log
                logging.getLogger(name).log(level, "%s", message)
            yield key, result

    def _probe(self, fn: Callable[..., Any], call: dict[str, Any], label: str) -> None:
        """Load the function and its call on a worker, as the task's own message would be (a failure there
        makes Dask drop the worker, not fail the task): an unimportable module fails the stage now."""
        import cloudpickle

        self.probed.add(fn.__qualname__)
        # What the task's message carries, loaded by a function every worker has: a failure is this probe's,
        # not the worker's.
        probe = self.client.submit(cloudpickle.loads, cloudpickle.dumps((fn, call)), pure=False)
        no_worker_since = None
        while True:
            try:
                probe.result(timeout=_POLL_SECONDS)
                return
            except TimeoutError:
                no_worker_since = self._watch(no_worker_since)
            except Exception as exc:
                raise ShardError(f"{self.name} {label} cannot start on the Dask workers: {_one_line(exc)} (every "
                                 "worker needs the same lexiflow and dependencies as this process)") from exc

    def _watch(self, since: float | None) -> float | None:
        """While tasks wait: fail when the Dask cluster has had no worker for NO_WORKER_SECONDS."""
        if not self.dask or self.client.nthreads():
            return None
        since = since or time.monotonic()
        if time.monotonic() - since >= NO_WORKER_SECONDS:
            waiting = ", ".join(label for _, label in list(self.futures.values())[:3]) or "the probe"
            raise ShardError(f"{self.name}: the Dask cluster at {self.client.scheduler.address} has had no "
                             f"worker for {NO_WORKER_SECONDS:.0f} s while {waiting} waited (its workers died or "
                             "left: see their logs); start workers, then run again")
        return since

    def _where(self, future: Any) -> str:
        """` on worker tcp://...` for a failed Dask task (the worker it failed on, as the scheduler has it)."""
        if not self.dask:
            return ""
        with suppress(Exception):
            return f" on worker {self.client.run_on_scheduler(_erred_on, key=future.key)}"
        return ""


def _erred_on(dask_scheduler: Any, key: str) -> str:
    """The worker a task failed on (run on the Dask scheduler)."""
    return next(iter(dask_scheduler.tasks[key].erred_on))


def run_shard(fn: Callable[..., Any], call: dict[str, Any], capture: bool = True) -> tuple[Any, list[tuple]]:
    """A pool's task: fn(**call), run again after a transient I/O error (`SHARD_RETRY_DELAYS`), with the
    lexiflow log lines it made (`capture`: on a worker, whose log lines reach neither the flow's console nor
    Prefect; the pool logs them where the stage runs)."""
    with _captured_logs(capture) as records:
        result = retrying(functools.partial(fn, **call), SHARD_RETRY_DELAYS, worth_retrying, lambda exc, delay:
                          _log.warning("%s: %s; again in %g s", fn.__qualname__, _one_line(exc), delay))
    return result, records


@contextmanager
def _captured_logs(capture: bool) -> Iterator[list[tuple]]:
    """Within: (logger, level, message) of each lexiflow log record this thread makes, at INFO or above."""
    records: list[tuple] = []
    if not capture:
        yield records
        return
    thread = threading.get_ident()
    handler = logging.Handler(logging.INFO)
    handler.addFilter(lambda record: record.thread == thread)
    handler.emit = lambda record: records.append((record.name, record.levelno, handler.format(record)))
    logger = logging.getLogger("lexiflow")
    level = logger.level
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)  # a plain worker logs warnings only
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def new_worker_cluster(workers: int, dashboard_address: str | None = None) -> Any:
    """A LocalCluster of `workers` single-threaded worker processes as lexiflow runs them: quiet (QUIET_DASK, its
    scheduler and workers alike), its workers forked from `worker_forkserver`, which holds WORKER_ENVIRONMENT (a
    variable the user set is kept; polars' allocator setting ends with lexiflow's), at their start and when a
    nanny restarts one that died. The nannies set nothing in this process's own environment (Dask's pre-spawn
    variables are the forkserver's)."""
    import dask
    from distributed import LocalCluster

    worker_forkserver()
    # Dask reads its multiprocessing method as each worker process starts, a restart too: set for this process,
    # not for the start alone, or a worker the nanny restarts (one that died, or ran out of memory) is spawned
    # here, importing everything again and running polars on every core beside the others.
    dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"})
    environment = _worker_environment()  # Dask's pre-spawn variables among them: read before they are emptied below
    with dask.config.set({**QUIET_DASK, "distributed.nanny.pre-spawn-environ": {}}):
        # `env` again in the worker as it starts: what a forkserver that died and came back without it lacks
        return LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                            dashboard_address=dashboard_address, env=environment)


def _worker_environment() -> dict[str, str]:
    """WORKER_ENVIRONMENT and Dask's pre-spawn worker variables, as this process's environment leaves them: a
    variable the user set wins, and polars' allocator setting ends with lexiflow's."""
    import dask
    import distributed  # noqa: F401 - its settings (Dask's worker environment) load with it

    environment = {name: os.environ.get(name, str(value)) for name, value in
                   {**dask.config.get("distributed.nanny.pre-spawn-environ"), **WORKER_ENVIRONMENT}.items()}
    allocator = os.environ.get("_RJEM_MALLOC_CONF")
    if allocator is not None and not allocator.endswith(POLARS_ALLOCATOR):
        environment["_RJEM_MALLOC_CONF"] = f"{allocator},{POLARS_ALLOCATOR}"
    return environment


@functools.cache
def worker_forkserver() -> None:
    """Start (once a process) the forkserver the Dask workers this process starts fork from, its environment
    `_worker_environment()`; FORKSERVER_PRELOAD loads in it in the background. It takes its environment from
    this process's, set for the moment it starts: a library loading in another thread then (NumPy's BLAS,
    torch's OpenMP read their thread counts as they load) would take it too, so the first call comes before this
    process starts threads of its own (`start_local_cluster`), or once torch and NumPy have loaded (a stage)."""
    from multiprocessing import forkserver

    environment = _worker_environment()
    multiprocessing.get_context("forkserver").set_forkserver_preload(FORKSERVER_PRELOAD)
    before = {name: os.environ.get(name) for name in environment}
    os.environ.update(environment)  # the forkserver takes this process's environment as it starts
    try:
        forkserver.ensure_running()
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _warn_oversubscribed(client: Any) -> None:
    """Log when a cluster started elsewhere runs polars with more threads than a worker has task threads."""
    with suppress(Exception):  # advice only
        pools, threads = client.run(pl.thread_pool_size), client.nthreads()
        crowded = sorted(worker for worker, n in pools.items() if n > threads.get(worker, n))
        if crowded:
            _log.warning("Dask workers %s run polars with %d threads for %d task thread(s): start them with %s "
                         "in their environment (oversubscribed cores: ~20 %% slower shards)", ", ".join(crowded[:3]),
                         pools[crowded[0]], threads[crowded[0]],
                         " ".join(f"{name}={value}" for name, value in WORKER_ENVIRONMENT.items()))


@functools.cache
def _worker_setup_plugin() -> Any:
    """A Dask worker plugin run on every worker, present and future: glibc's adaptive mmap threshold
    (`heap.adaptive_mmap_threshold`: Dask's nanny pins it at 128 KB, ~20 % of a co-occurrence shard's CPU), the
    heap's free top kept for the next shard (`heap.keep_freed_heap`; each pool gives it back as it ends)."""
    from distributed.diagnostics.plugin import WorkerPlugin

    class WorkerSetup(WorkerPlugin):
        name = "lexiflow-worker-setup"
        idempotent = True

        def setup(self, worker: Any) -> None:
            adaptive_mmap_threshold()
            keep_freed_heap()

    return WorkerSetup()


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return type(exc).__name__ + (f": {text[0]}" if text else "")
