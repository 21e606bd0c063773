"""Sharded stages on a Dask cluster of worker processes that share nothing with this process but the
store URL (each has its own local directory and temp folder): with the store on S3 (moto on loopback)
they publish what one process publishes, shard parts crossing through the store's staging area; a
shard that fails, or cannot even be loaded on a worker, or a cluster without workers, fails the stage
with one line naming the stage, the shard and the worker's exception, instead of hanging; and
`lexiflow run` with the Dask runner works end to end, or fails with that one line."""

from __future__ import annotations

import functools
import os
import signal
import sys
import tempfile
import time
from contextlib import suppress
from pathlib import Path
from typing import Any

import dask
import numpy as np
import polars as pl
import pytest
import scipy.sparse as sp
from distributed import Client, LocalCluster, Nanny, Scheduler, SpecCluster, WorkerPlugin
from lexiflow import POLARS_ALLOCATOR
from lexiflow.flows.cli import main
from lexiflow.flows.commands.run import prestart_cluster
from lexiflow.flows.params import validate
from lexiflow.models.threads import machine_cores
from lexiflow.storage import ArtifactStore, Catalog
from lexiflow.tasks import parallel, runners
from lexiflow.tasks.parallel import (
    map_shards,
    reduce_partitioned,
    reduce_shards,
)
from lexiflow.tasks.params import ParallelParams
from lexiflow.tasks.parts import deliver, deliver_partitions, part_paths, row_partitions
from lexiflow.tasks.runners import ShardError
from prefect.testing.utilities import prefect_test_harness

from tests.test_heap import faults_of_a_top_block, page_faults_of_a_second_block
from tests.test_sharding import assert_same_artifacts, files, sources  # noqa: F401 - fixtures
from tests.test_sharding_dask import counts_flow

pytestmark = pytest.mark.prefect


@pytest.fixture(scope="module", autouse=True)
def prefect_server():
    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(scope="module")
def cluster(moto_s3, tmp_path_factory):
    """2 single-threaded worker processes, each with its own local directory and TMPDIR (neither is
    this process's), S3 credentials from the standard variables as a remote worker would have them."""
    env = {"AWS_ACCESS_KEY_ID": moto_s3.options["key"], "AWS_SECRET_ACCESS_KEY": moto_s3.options["secret"],
           "AWS_ENDPOINT_URL": moto_s3.endpoint, "AWS_DEFAULT_REGION": "eu-west-1", "OMP_NUM_THREADS": "1"}
    workers = {}
    for i in range(2):
        home = tmp_path_factory.mktemp(f"worker{i}")
        (home / "tmp").mkdir()
        workers[i] = {"cls": Nanny, "options": {"nthreads": 1, "local_directory": str(home),
                                                "env": {**env, "TMPDIR": str(home / "tmp")}}}
    with SpecCluster(workers=workers, scheduler={"cls": Scheduler, "options": {"dashboard_address": None}}) as spec:
        yield spec


def on(cluster) -> ParallelParams:
    return ParallelParams(runner="dask", dask_address=cluster.scheduler_address, shard_bytes=5000, shard_rows=150)


@pytest.mark.slow
def test_a_cluster_sharing_only_the_store_publishes_what_one_process_does(tmp_path, sources, moto_s3, cluster,  # noqa: F811
                                                                          monkeypatch):
    received = []
    original = parallel.received

    def spy(result, *args, **kwargs):
        received.extend(part_paths(result))
        return original(result, *args, **kwargs)

    monkeypatch.setattr(parallel, "received", spy)
    local = counts_flow(str(tmp_path / "local"), sources, on(cluster).model_copy(update={"runner": "local"}))
    url = moto_s3.new_url()
    on_s3 = counts_flow(url, sources, on(cluster))
    assert_same_artifacts(local, on_s3)
    # Every part this process read came through the store's staging area, and none is left there.
    assert received and all(path.startswith(f"{url}/.staging/") for path in received)
    store = ArtifactStore(url)
    store.refresh()
    assert not store.fs.exists(f"{store.root}/.staging") or not store.fs.find(f"{store.root}/.staging")
    # The workers ran in their own temp folders, never this process's.
    with Client(cluster.scheduler_address, set_as_default=False) as client:
        temp_folders = set(client.run(tempfile.gettempdir).values())
        trim_thresholds = set(client.run(os.environ.get, "MALLOC_TRIM_THRESHOLD_").values())
        faults = {worker: min(client.submit(page_faults_of_a_second_block, workers=[worker], pure=False).result()
                              for _ in range(2))  # in a task's thread, as a shard runs (the second: its arena made)
                  for worker in client.scheduler_info()["workers"]}
        top_faults = {worker: min(client.submit(faults_of_a_top_block, workers=[worker], pure=False).result()
                                  for _ in range(2)) for worker in client.scheduler_info()["workers"]}
        buffers = client.run(counting_buffers)
    assert len(temp_folders) == 2 and tempfile.gettempdir() not in temp_folders
    # Their nannies froze glibc's mmap threshold low (fresh pages for every block over 128 KB); the stages'
    # worker plugin put back the adaptive one: a freed 16 MB block is reused.
    assert trim_thresholds == {"65536"} and max(faults.values()) <= 2
    # It also keeps the heap's freed top for the next shard, which that threshold gave back at once.
    assert max(top_faults.values()) <= 2
    # The co-occurrence stage gave back the counting buffers its shards kept from one to the next.
    assert set(buffers.values()) == {0}


def counting_buffers() -> int:
    from lexiflow.models import cooccurrence

    return len(cooccurrence._scratches)


def test_a_killed_writers_shared_parts_are_garbage_collected(tmp_path, moto_s3):
    """A writer killed mid-build leaves its shared folder in the store; `gc` removes it (S3: once old
    enough, as every object-store leftover; --older-than 0 here)."""
    import subprocess
    import textwrap

    for url in (str(tmp_path / "store"), moto_s3.new_url()):
        code = textwrap.dedent(f"""
            import os, signal, fsspec
            from lexiflow.storage.files import register_storage_options, storage_options_for
            from lexiflow.storage.store import ArtifactStore
            register_storage_options("s3://{moto_s3.bucket}", {moto_s3.options!r})
            with ArtifactStore({url!r}).writer("corpus", "ab" * 8) as out:
                fs, path = fsspec.core.url_to_fs(out.shared, **storage_options_for(out.shared))
                fs.makedirs(path, exist_ok=True)
                fs.pipe_file(path + "/000000.parquet", b"part")
                print(out.shared, flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
        """)
        child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               cwd=Path(__file__).resolve().parents[1])
        shared = child.stdout.strip()
        assert child.returncode == -9 and shared.endswith("-shards"), child.stderr
        store = ArtifactStore(url)
        assert any(entry.rstrip("/").endswith(shared.rsplit("/", 1)[-1]) for entry in store.leftovers())
        assert main(["artifacts", "gc", "--older-than", "0", "--store", url]) == 0
        store.refresh()
        assert not store.fs.exists(store.fs._strip_protocol(shared))


# ---- failures: explicit states, never timing ----
def count_rows_shard(start: int, stop: int, broken: int, marks: str, part: str | None):
    """Counts of the values start..stop-1; shard `broken` raises (OSError: transient, so retried)."""
    (Path(marks) / f"{start}-{len(list(Path(marks).iterdir()))}").touch()  # one file per attempt
    if start == broken:
        raise OSError(f"rows {start}-{stop}: the disk went away") if broken == 0 else \
            ValueError(f"rows {start}-{stop} hold no numbers")
    return deliver(pl.DataFrame({"token": [str(i % 3) for i in range(start, stop)]}).group_by("token").len(), part)


@pytest.mark.slow  # the module's cluster of worker processes: ~20 s to start here
def test_a_failing_shard_fails_the_stage_naming_the_shard_worker_and_exception(tmp_path, cluster):
    marks = tmp_path / "marks"
    marks.mkdir()
    calls = [{"start": a, "stop": a + 10, "broken": 10, "marks": str(marks)} for a in (0, 10, 20)]
    with ArtifactStore(tmp_path / "store").writer("corpus", "ab" * 8) as out, pytest.raises(ShardError) as failed:
        reduce_shards(count_rows_shard, calls, lambda rs: rs[0], on(cluster), "counting", out)
    message = str(failed.value)
    assert message.startswith("counting shard 2/3 (rows 10-20) failed on worker tcp://")
    assert message.endswith("ValueError: rows 10-20 hold no numbers") and "\n" not in message
    assert len(list(marks.glob("10-*"))) == 1  # bad input is not retried

    # A transient error is retried twice, then fails the stage the same way.
    (marks := tmp_path / "retries").mkdir()
    calls = [{**call, "broken": 0, "marks": str(marks)} for call in calls]
    with ArtifactStore(tmp_path / "store").writer("corpus", "cd" * 8) as out, pytest.raises(ShardError) as failed:
        map_shards(count_rows_shard, calls, on(cluster), "counting", out)
    assert "shard 1/3 (rows 0-10) failed" in str(failed.value) and "OSError: rows 0-10: the disk went away" in \
        str(failed.value)
    assert len(list(marks.glob("0-*"))) == 3


def keyed_counts_shard(start: int, stop: int, partitions: int, part: str | None):
    """One count for each key start..stop-1 of 0..39, in `partitions` key partitions."""
    keys = np.arange(start, stop)
    counts = sp.csr_matrix((np.ones(len(keys)), (keys, np.zeros(len(keys), dtype=int))), shape=(40, 1))
    return deliver_partitions(row_partitions(counts, partitions), part, "pairs"), stop - start


def add_blocks(blocks: list[sp.spmatrix]) -> sp.csr_matrix:
    return sp.csr_matrix(sum(blocks[1:], blocks[0]))


@pytest.mark.slow  # the module's cluster of worker processes: ~20 s to start here
def test_a_clusters_partition_merges_run_one_per_worker_thread_whatever_the_workers_setting(tmp_path, cluster):
    """`workers` sizes the clusters lexiflow starts; a cluster at an address merges on all its threads."""
    calls = [{"start": a, "stop": a + 10} for a in (0, 10, 20, 30)]
    params = on(cluster).model_copy(update={"workers": 1})
    with ArtifactStore(tmp_path / "store").writer("cooccurrence", "ef" * 8) as out:
        merged, rests, threads = reduce_partitioned(keyed_counts_shard, calls, add_blocks, params, "counting", out)
        out.write_parquet("rows.parquet", pl.DataFrame({"rows": [n for n, in rests]}))
    assert len(merged) == 2  # 4 shards, one merge per MERGE_FAN_IN, in whole rounds of the cluster's 2 threads
    assert [sorted(m.nonzero()[0] % 2) for m in merged] == [[0] * 20, [1] * 20]  # keys ≡ p (mod 2)
    assert (sum(merged).toarray() == 1).all() and rests == [(10,)] * 4
    assert threads == min(2, machine_cores())  # the cluster's threads, idle once the merges are done


def mark_worker(folder: str) -> None:
    (Path(folder) / str(os.getpid())).touch()


@pytest.mark.slow  # the module's cluster of worker processes: ~20 s to start here
def test_a_stage_gives_back_the_heap_its_workers_kept_from_shard_to_shard_when_it_ends(tmp_path, cluster,
                                                                                      monkeypatch):
    released, marks = tmp_path / "released", tmp_path / "marks"
    released.mkdir(), marks.mkdir()
    monkeypatch.setattr(runners, "release_freed_memory", functools.partial(mark_worker, str(released)))
    calls = [{"start": a, "stop": a + 10, "broken": -1, "marks": str(marks)} for a in (0, 10, 20)]
    with ArtifactStore(tmp_path / "store").writer("corpus", "ab" * 8) as out:
        map_shards(count_rows_shard, calls, on(cluster), "counting", out)
    assert len(list(released.iterdir())) == 2  # on each worker, once
    for mark in released.iterdir():
        mark.unlink()
    # A failed stage leaves it to the next stage's end: its cluster may be unreachable.
    with ArtifactStore(tmp_path / "store").writer("corpus", "cd" * 8) as out, pytest.raises(ShardError):
        map_shards(count_rows_shard, [{**call, "broken": 10} for call in calls], on(cluster), "counting", out)
    assert not list(released.iterdir())


class Unimportable(WorkerPlugin):
    """Makes `module` fail to import on every worker (as a missing or broken install does)."""

    def __init__(self, module: str) -> None:
        self.module = module

    def setup(self, worker) -> None:
        self.saved = sys.modules.get(self.module)
        sys.modules[self.module] = None

    def teardown(self, worker) -> None:
        if self.saved is None:
            sys.modules.pop(self.module, None)
        else:
            sys.modules[self.module] = self.saved


@pytest.mark.slow  # the module's cluster of worker processes: ~20 s to start here
def test_a_shard_task_that_cannot_start_on_the_workers_fails_the_run_in_one_line(tmp_path, cluster, capsys):
    """The issue's failure: the workers cannot import the shard functions' module. Dask alone would drop each worker
    that fails to load the task and wait for another forever; the CLI run ends with one line instead."""
    with Client(cluster.scheduler_address) as client:
        client.register_plugin(Unimportable("lexiflow.tasks.shards"), name="unimportable")
        try:
            code = main(["run", "--store", str(tmp_path / "store"), "--corpus", "builtin:lee",
                         "--set", "parallel.runner=dask", "--set", f"parallel.dask_address={cluster.scheduler_address}",
                         "--set", "parallel.shard_rows=100", "--set", "lm=[]", "--set", 'embeddings=["svd"]'])
        finally:
            client.unregister_worker_plugin("unimportable")
        assert len(client.nthreads()) == 2  # the workers are still there
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2
    assert error.startswith("error: tokenizer shard 1/4 (rows 0-73) cannot start on the Dask workers: "
                            "ModuleNotFoundError: import of lexiflow.tasks.shards halted")


def test_a_cluster_without_workers_fails_the_stage(tmp_path, monkeypatch):
    monkeypatch.setattr(runners, "NO_WORKER_SECONDS", 1.0)
    monkeypatch.setattr(runners, "_POLL_SECONDS", 0.2)
    calls = [{"start": a, "stop": a + 10, "broken": -1, "marks": str(tmp_path)} for a in (0, 10)]
    with LocalCluster(n_workers=0, processes=False, dashboard_address=None) as empty, \
            ArtifactStore(tmp_path / "store").writer("corpus", "ab" * 8) as out, pytest.raises(ShardError) as failed:
        map_shards(count_rows_shard, calls, ParallelParams(runner="dask", dask_address=empty.scheduler_address),
                   "counting", out)
    assert str(failed.value).startswith(f"counting: the Dask cluster at {empty.scheduler_address} has had no worker "
                                        "for 1 s while the probe waited")


def test_a_dask_run_of_more_than_one_shard_starts_its_cluster_as_the_command_starts(tmp_path):
    """Before the pipeline is imported: its workers, forked with the shard functions loaded, are ready when the
    first stage asks for them. Not for one shard (no cluster), nor for a cluster given by address."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The cat sat on the mat.\n" * 200)  # 4800 bytes

    def started(workers: int, **parallel_params: Any) -> bool:
        prestart_cluster(validate({"corpus": {"sources": [str(corpus)]},
                                   "parallel": {"runner": "dask", "workers": workers, **parallel_params}}))
        return workers in runners._starting or workers in runners._clusters

    assert not started(3, shard_bytes=4800) and not started(3, shard_bytes=1024, dask_address="tcp://10.0.0.5:8786")
    assert started(1, shard_bytes=4799)
    cluster = runners.local_cluster(1)  # the one started, once it is up
    assert runners._clusters[1] is cluster and 1 not in runners._starting
    with Client(cluster.scheduler_address, set_as_default=False) as client:
        assert set(client.run(lambda: "lexiflow.tasks.shards" in sys.modules).values()) == {True}


@pytest.mark.slow
def test_cli_run_on_a_local_dask_cluster_of_two_workers_publishes_what_one_process_does(tmp_path, monkeypatch):
    pools, enter = [], runners.Pool.__enter__  # (runner, scheduler address) of each pool a stage opened
    monkeypatch.setattr(runners.Pool, "__enter__", lambda pool: enter(pool) and pools.append(
        (pool.params.runner, pool.client.scheduler.address)) or pool)
    small = ["--corpus", "builtin:lee", "--set", "lm=[]", "--set", 'embeddings=["svd"]', "--set", "svd.dim=10",
             "--set", "evaluation.projection_words=0"]
    small += ["--set", "parallel.shard_rows=100"]
    assert main(["run", "--store", str(tmp_path / "local"), *small, "--set", "parallel.runner=local"]) == 0
    assert main(["run", "--store", str(tmp_path / "dask"), *small, "--set", "parallel.runner=dask",
                 "--set", "parallel.workers=2"]) == 0
    # word counts, encoding and co-occurrence ran on one LocalCluster of 2 workers, started once for the run
    # (ingestion: one shard, inline)
    assert pools == [("dask", runners.local_cluster(2).scheduler_address)] * 3
    assert len(runners.local_cluster(2).workers) == 2
    local, dask = ArtifactStore(tmp_path / "local"), ArtifactStore(tmp_path / "dask")
    refs = {store: {m["kind"]: store.ref(m["kind"], m["version"]) for m in Catalog(store).list()
                    if m["kind"] in ("corpus", "tokenizer", "tokenized_corpus", "cooccurrence", "ppmi")}
            for store in (local, dask)}
    assert len(refs[local]) == 5
    assert_same_artifacts(refs[local], refs[dask])


def test_workers_the_runner_starts_run_polars_on_their_one_core_and_others_are_warned_about(caplog):
    # Polars sizes its pool once, from the cores: a one-thread worker started without POLARS_MAX_THREADS=1
    # runs as many polars threads as the machine has cores, beside every other worker's.
    names = ("POLARS_MAX_THREADS", "OMP_NUM_THREADS", "MALLOC_TRIM_THRESHOLD_")
    ours = {name: os.environ.get(name) for name in names}
    started = runners.new_worker_cluster(1)
    # A nanny would set the workers' variables in this process too (torch imported later: one thread).
    assert {name: os.environ.get(name) for name in names} == ours
    with started, Client(started, set_as_default=False) as client:
        assert set(client.run(pl.thread_pool_size).values()) == {1}
        assert set(client.run(lambda: os.environ["OMP_NUM_THREADS"]).values()) == {"1"}
        # forked from the forkserver that loaded their imports (a spawned worker's parent is this process),
        # and quiet: no stack sampling for a dashboard
        assert os.getpid() not in client.run(os.getppid).values()
        assert set(client.run(dask.config.get, "distributed.worker.profile.enabled").values()) == {False}
        # and polars' allocator set as lexiflow sets it (the last setting is jemalloc's), whichever loaded first here
        assert all(conf.endswith(POLARS_ALLOCATOR) for conf in client.run(os.getenv, "_RJEM_MALLOC_CONF").values())
        runners._warn_oversubscribed(client)
    assert "run polars with" not in caplog.text
    if pl.thread_pool_size() > 1:  # in-process workers: this process's pool, one per core
        with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as other, \
                Client(other, set_as_default=False) as client:
            runners._warn_oversubscribed(client)
        assert f"run polars with {pl.thread_pool_size()} threads for 1 task thread(s): start them with " \
               "POLARS_MAX_THREADS=1" in caplog.text


def test_a_worker_the_nanny_restarts_forks_as_the_first_did_with_the_workers_environment():
    # A worker that dies (killed, out of memory) is started again by its nanny: forked from the workers'
    # forkserver, not spawned here (every import again, and polars on every core beside the other workers).
    def only(values: dict) -> Any:
        (value,) = values.values()
        return value

    def restarted(client: Client, worker: int) -> None:
        os.kill(worker, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with suppress(Exception):
                if only(client.run(os.getpid)) != worker:
                    return
            time.sleep(0.2)
        raise AssertionError("the nanny did not start the worker again in 60 s")

    with runners.new_worker_cluster(1) as started, Client(started, set_as_default=False) as client:
        forkserver = only(client.run(os.getppid))
        assert forkserver != os.getpid()
        restarted(client, only(client.run(os.getpid)))
        assert only(client.run(os.getppid)) == forkserver
        assert only(client.run(pl.thread_pool_size)) == 1
        # A forkserver that died comes back with this process's own environment: the worker takes its
        # environment again as it starts, before polars loads.
        os.kill(forkserver, signal.SIGKILL)
        try:
            restarted(client, only(client.run(os.getpid)))
            assert only(client.run(os.getppid)) not in (forkserver, os.getpid())
            assert only(client.run(os.getenv, "POLARS_MAX_THREADS")) == "1"
            assert only(client.run(os.getenv, "OMP_NUM_THREADS")) == "1"  # Dask's own worker variables too
            assert only(client.run(pl.thread_pool_size)) == 1
        finally:  # the later tests' workers fork from a forkserver with the workers' environment again
            os.kill(only(client.run(os.getppid)), signal.SIGKILL)
            runners.worker_forkserver.__wrapped__()
