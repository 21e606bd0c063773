"""The corpus stage through Prefect on the threads runner with small shards: a Wikipedia multistream
dump sharded by its bz2 streams and a compressed text file streamed in spilled batches publish the
artifact (version, bytes, stats) that one process reading every file whole publishes."""

import pytest
from lexiflow.models.ingest import IngestOptions, plan_shards
from lexiflow.models.ingest.multistream import Streams
from lexiflow.storage import ArtifactStore
from lexiflow.tasks.corpus import ingest_corpus
from lexiflow.tasks.params import CorpusParams, ParallelParams
from prefect import flow
from prefect.testing.utilities import prefect_test_harness

from tests.test_sharding import assert_same_artifacts
from tests.test_streaming import compressed, multistream  # noqa: F401 - fixtures

pytestmark = [pytest.mark.prefect, pytest.mark.slow]


@pytest.fixture(scope="module", autouse=True)
def prefect_server():
    with prefect_test_harness(server_startup_timeout=120):
        yield


@flow
def corpus_flow(store: str, paths: list[str], parallel: ParallelParams):
    return ingest_corpus(store, params=CorpusParams(sources=paths), parallel=parallel)


def test_sharded_streams_and_spilled_batches_publish_the_whole_readings_corpus(tmp_path, multistream,  # noqa: F811
                                                                               compressed):  # noqa: F811
    dump, _index, _single = multistream
    sources = [str(dump), str(compressed["gz"])]
    whole = corpus_flow(str(tmp_path / "whole"), sources, ParallelParams(runner="local"))  # 64 MiB: both whole
    small = ParallelParams(runner="threads", workers=2, shard_bytes=300_000)  # ~6 stream shards, 4 batches
    sharded = corpus_flow(str(tmp_path / "threads"), sources, small)
    assert_same_artifacts({"corpus": whole}, {"corpus": sharded}, same_shards=False)  # the same rows and version
    alone = corpus_flow(str(tmp_path / "alone"), sources, small.model_copy(update={"runner": "local"}))
    assert_same_artifacts({"corpus": alone}, {"corpus": sharded})  # the same shards in one process: the same bytes
    assert ArtifactStore(tmp_path / "whole").manifest("corpus", whole.version)["metrics"]["documents"] > 2000
    shards = plan_shards([dump, compressed["gz"]], IngestOptions(), small.shard_bytes)
    assert len(shards) >= 6 and isinstance(shards[0][0], Streams) and shards[-1][-1].stop is None
