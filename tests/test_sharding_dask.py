"""The sharded stages on real task runners through Prefect: a Dask LocalCluster with 2 workers and
a thread pool publish the same artifacts, with the same versions, as the local runner; a rerun
with another runner reuses them (the version does not depend on where the work ran)."""

import concurrent.futures
import logging
import threading

import pytest
import scipy.sparse as sp
from distributed import LocalCluster
from lexiflow.models.threads import machine_cores
from lexiflow.storage import ArtifactStore
from lexiflow.tasks import runners
from lexiflow.tasks.corpus import ingest_corpus
from lexiflow.tasks.matrices import count_cooccurrence
from lexiflow.tasks.parallel import map_shards, reduce_partitioned, stream_shards
from lexiflow.tasks.params import CooccurrenceParams, CorpusParams, ParallelParams, VocabularyParams
from lexiflow.tasks.parts import deliver_partitions
from lexiflow.tasks.vocabulary import encode_corpus, learn_vocabulary
from prefect import flow, get_client, task
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, LogFilter, LogFilterTaskRunId
from prefect.logging.handlers import APILogHandler
from prefect.testing.utilities import prefect_test_harness

from tests.test_sharding import assert_same_artifacts, files, sources  # noqa: F401 - fixtures

pytestmark = pytest.mark.prefect


@pytest.fixture(scope="module", autouse=True)
def prefect_server():
    with prefect_test_harness(server_startup_timeout=120):
        yield


@flow
def counts_flow(store: str, paths: list[str], parallel: ParallelParams) -> dict:
    corpus = CorpusParams(sources=paths, valid_fraction=0.2, test_fraction=0.2)
    docs = ingest_corpus(store, params=corpus, parallel=parallel)
    words = learn_vocabulary(store, corpus=docs, params=VocabularyParams(min_count=1), parallel=parallel)
    tokens = encode_corpus(store, corpus=docs, tokenizer=words, parallel=parallel)
    counts = count_cooccurrence(store, tokens=tokens, tokenizer=words, params=CooccurrenceParams(window=3),
                                parallel=parallel)
    return {ref.kind: ref for ref in (docs, words, tokens, counts)}


def test_dask_threads_and_processes_publish_what_one_process_does_and_reruns_reuse_it(tmp_path, sources,  # noqa: F811
                                                                                      monkeypatch):
    shards = {"shard_bytes": 5000, "shard_rows": 150}
    local = counts_flow(str(tmp_path / "local"), sources, ParallelParams(runner="local", **shards))
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        dask = ParallelParams(runner="dask", dask_address=cluster.scheduler_address, **shards)
        on_dask = counts_flow(str(tmp_path / "dask"), sources, dask)
        # The shards went through parts (a process boundary), now cleaned up.
        assert not [p for hidden in (".scratch", ".staging") for p in (tmp_path / "dask" / hidden).rglob("*.arrow")]
    assert_same_artifacts(local, on_dask)
    threads = ParallelParams(workers=2, **shards)
    assert_same_artifacts(local, counts_flow(str(tmp_path / "threads"), sources, threads))
    # Every stage on one pool of spawned processes, started at the first (each process imports the shard
    # modules once a run, not once a stage).
    started = []
    monkeypatch.setattr(runners, "_process_pools", {})
    monkeypatch.setattr(runners, "ProcessPoolExecutor", lambda **options: started.append(options) or
                        concurrent.futures.ProcessPoolExecutor(**options))
    processes = ParallelParams(runner="processes", workers=2, **shards)
    assert_same_artifacts(local, counts_flow(str(tmp_path / "processes"), sources, processes))
    assert len(started) == 1 and started[0]["mp_context"].get_start_method() == "spawn"

    store = ArtifactStore(tmp_path / "dask")
    created = {kind: store.manifest(kind, ref.version)["created"] for kind, ref in on_dask.items()}
    again = counts_flow(str(tmp_path / "dask"), sources, ParallelParams(runner="local"))
    assert {k: r.version for k, r in again.items()} == {k: r.version for k, r in on_dask.items()}
    assert {kind: store.manifest(kind, ref.version)["created"] for kind, ref in again.items()} == created


FIRST_RECEIVED = threading.Event()


def waits_for_the_first(i: int, part: str | None) -> tuple[int, bool]:
    """Shard 0 returns at once; shard 1 returns once the caller has received shard 0's result (or after 30 s)."""
    return i, FIRST_RECEIVED.wait(30) if i == 1 else True


def test_streamed_results_reach_the_caller_in_order_while_later_shards_still_run(tmp_path):
    # A merge that streams (corpus, encoding) works on shard 0 while shard 1 is still running: shard 1 only
    # finishes once shard 0's result has been handed over.
    FIRST_RECEIVED.clear()
    with ArtifactStore(tmp_path).writer("corpus", "ab" * 8) as out:
        got = []
        for result in stream_shards(waits_for_the_first, [{"i": i} for i in range(4)], ParallelParams(workers=2),
                                    "streaming", out):
            got.append(result)
            FIRST_RECEIVED.set()
    assert got == [(0, True), (1, True), (2, True), (3, True)]


def counts_waiting_for_the_first(i: int, partitions: int, part: str | None) -> tuple:
    """One count at (i, i) in its key partitions; shard 1 returns once the caller has consumed shard 0's rest."""
    counts = sp.csr_matrix(([1], ([i], [i])), shape=(4, 4))
    blocks = [counts if i % partitions == p else sp.csr_matrix((4, 4), dtype=counts.dtype) for p in range(partitions)]
    return deliver_partitions(blocks, part, "pairs"), i, FIRST_RECEIVED.wait(30) if i == 1 else True


def test_a_partitioned_reduction_hands_each_shards_rest_over_while_later_shards_still_run(tmp_path):
    # The co-occurrence stage writes shard 0's term–document rows while shard 1 is still running.
    FIRST_RECEIVED.clear()

    def consume(rests):
        got = []
        for rest in rests:
            got.append(rest)
            FIRST_RECEIVED.set()
        return got

    with ArtifactStore(tmp_path).writer("cooccurrence", "ab" * 8) as out:
        merged, rests, threads = reduce_partitioned(counts_waiting_for_the_first, [{"i": i} for i in range(4)],
                                                    lambda blocks: sum(blocks).tocsr(), ParallelParams(workers=2),
                                                    "streaming", out, consume)
    assert rests == [(0, True), (1, True), (2, True), (3, True)]
    assert threads == min(2, machine_cores())  # the pool's two threads, idle once the merges are done
    assert (sum(merged) != sp.identity(4)).nnz == 0  # every count, in its partition


def square(i: int, part: str | None) -> int:
    logging.getLogger("lexiflow.squares").info("square of %d", i)
    return i * i


@task
def squares_stage(store: str, address: str) -> list[int]:
    with ArtifactStore(store).writer("corpus", "cd" * 8) as out:
        return map_shards(square, [{"i": i} for i in range(3)], ParallelParams(runner="dask", dask_address=address),
                          "squares", out)


@flow
def squares_flow(store: str, address: str) -> list[int]:
    return squares_stage(store, address)


def test_shards_are_plain_dask_tasks_whose_log_lines_reach_the_stages_run(tmp_path):
    """The stage is the Prefect task run; its shards are plain Dask tasks (a task run each cost ~0.12 s of Prefect
    bookkeeping, and loading the flow's context imported every model on a worker), and the log lines they make
    on the workers are logged in the stage's run, where the user reads them."""
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        state = squares_flow(str(tmp_path), cluster.scheduler_address, return_state=True)
    assert state.result() == [0, 1, 4]
    APILogHandler().flush()  # the stage's log lines are sent now, not in the next batch
    with get_client(sync_client=True) as client:
        flow_run = FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id]))
        (stage,) = client.read_task_runs(flow_run_filter=flow_run)
        logs = client.read_logs(LogFilter(task_run_id=LogFilterTaskRunId(any_=[stage.id])))
    assert stage.name.startswith("squares_stage")
    assert sorted(log.message for log in logs if log.message.startswith("square of")) == \
        ["square of 0", "square of 1", "square of 2"]
