"""The sharded stages on real task runners through Prefect: a Dask LocalCluster with 2 workers and
a thread pool publish the same artifacts, with the same versions, as the local runner; a rerun
with another runner reuses them (the version does not depend on where the work ran)."""

import threading
from typing import Any

import pytest
import scipy.sparse as sp
from distributed import LocalCluster
from lexiflow.models.threads import machine_cores
from lexiflow.storage import ArtifactStore
from lexiflow.tasks import parallel
from lexiflow.tasks.corpus import ingest_corpus
from lexiflow.tasks.matrices import count_cooccurrence
from lexiflow.tasks.parallel import SHARD_TASK, deliver_partitions, map_shards, reduce_partitioned, stream_shards
from lexiflow.tasks.params import CooccurrenceParams, CorpusParams, ParallelParams, VocabularyParams
from lexiflow.tasks.vocabulary import encode_corpus, learn_vocabulary
from prefect import flow, get_client, task
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
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


def test_dask_and_threads_publish_what_one_process_does_and_reruns_reuse_it(tmp_path, sources):  # noqa: F811
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

    store = ArtifactStore(tmp_path / "dask")
    created = {kind: store.manifest(kind, ref.version)["created"] for kind, ref in on_dask.items()}
    again = counts_flow(str(tmp_path / "dask"), sources, ParallelParams(runner="local"))
    assert {k: r.version for k, r in again.items()} == {k: r.version for k, r in on_dask.items()}
    assert {kind: store.manifest(kind, ref.version)["created"] for kind, ref in again.items()} == created


FIRST_RECEIVED = threading.Event()


@task(**SHARD_TASK)
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


@task(**SHARD_TASK)
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


@task(**SHARD_TASK)
def square(i: int, part: str | None) -> int:
    return i * i


@task
def squares_stage(store: str, address: str) -> list[int]:
    with ArtifactStore(store).writer("corpus", "cd" * 8) as out:
        return map_shards(square, [{"i": i} for i in range(3)], ParallelParams(runner="dask", dask_address=address),
                          "squares", out)


@flow
def squares_flow(store: str, address: str) -> list[int]:
    return squares_stage(store, address)


def _shard_task_runs(flow_run_id) -> tuple[Any, list[Any]]:
    """The flow run's stage task run and its shard task runs, as the Prefect API (and so the UI) has them."""
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    (stage,) = [run for run in runs if run.name.startswith("squares_stage")]
    return stage, [run for run in runs if run.name.startswith("square-")]


def test_shard_task_runs_are_recorded_as_prefect_dask_records_them(tmp_path, monkeypatch):
    """The pool submits task runs itself (the context serialized once per stage, a module-level function on
    the worker): the Prefect API records each shard as prefect_dask's own submission does, a completed task
    run of the flow run whose parent is the stage's task run."""
    from prefect_dask.task_runners import PrefectDaskFuture

    def as_prefect_dask_submits(self, fn, call):
        wrapped = self.runner.client.submit(fn, parameters=call, return_type="state", pure=False)
        return PrefectDaskFuture(wrapped_future=wrapped, task_run_id=wrapped.task_run_id)

    recorded = {}
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        for how in ("lexiflow", "prefect_dask"):
            if how == "prefect_dask":
                monkeypatch.setattr(parallel._Pool, "_submit_task_run", as_prefect_dask_submits)
            state = squares_flow(str(tmp_path / how), cluster.scheduler_address, return_state=True)
            assert state.result() == [0, 1, 4]
            stage, shards = _shard_task_runs(state.state_details.flow_run_id)
            assert len(shards) == 3 and all(run.flow_run_id == state.state_details.flow_run_id for run in shards)
            recorded[how] = [(run.state.type.value, run.run_count, run.task_key,
                              [(parent.input_type, parent.id == stage.id) for parent in run.task_inputs["__parents__"]],
                              sorted(name for name in run.task_inputs if name != "__parents__")) for run in shards]
    assert recorded["lexiflow"] == recorded["prefect_dask"]
    assert recorded["lexiflow"][0][:2] == ("COMPLETED", 1) and recorded["lexiflow"][0][3] == [("task_run", True)]
