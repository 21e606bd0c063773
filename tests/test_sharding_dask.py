"""The sharded stages on real task runners through Prefect: a Dask LocalCluster with 2 workers and
a thread pool publish the same artifacts, with the same versions, as the local runner; a rerun
with another runner reuses them (the version does not depend on where the work ran)."""

import pytest
from distributed import LocalCluster
from lexiflow.storage import ArtifactStore
from lexiflow.tasks.corpus import ingest_corpus
from lexiflow.tasks.matrices import count_cooccurrence
from lexiflow.tasks.params import CooccurrenceParams, CorpusParams, ParallelParams, VocabularyParams
from lexiflow.tasks.vocabulary import encode_corpus, learn_vocabulary
from prefect import flow
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
    local = counts_flow(str(tmp_path / "local"), sources, ParallelParams(runner="local"))
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        dask = ParallelParams(runner="dask", dask_address=cluster.scheduler_address, shard_bytes=5000, shard_rows=150)
        on_dask = counts_flow(str(tmp_path / "dask"), sources, dask)
        # The shards went through Parquet parts (a process boundary), now cleaned up.
        assert not [p for hidden in (".scratch", ".staging") for p in (tmp_path / "dask" / hidden).rglob("*.parquet")]
    assert_same_artifacts(local, on_dask)
    threads = ParallelParams(workers=2, shard_bytes=4000, shard_rows=250)
    assert_same_artifacts(local, counts_flow(str(tmp_path / "threads"), sources, threads))

    store = ArtifactStore(tmp_path / "dask")
    created = {kind: store.manifest(kind, ref.version)["created"] for kind, ref in on_dask.items()}
    again = counts_flow(str(tmp_path / "dask"), sources, ParallelParams(runner="local"))
    assert {k: r.version for k, r in again.items()} == {k: r.version for k, r in on_dask.items()}
    assert {kind: store.manifest(kind, ref.version)["created"] for kind, ref in again.items()} == created
