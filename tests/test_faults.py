"""The flaky filesystem (storage/faults.py) and the store on top of it, without Prefect: faults are
injected at the chosen rate, the store retries single operations, and a publish that fails for
good leaves no artifact a reader could see. The whole pipeline on flaky storage:
tests/test_reliability.py::test_flaky_storage_pipeline_completes_through_retries."""

from __future__ import annotations

import json

import polars as pl
import pytest
from lexiflow.storage import ArtifactStore, Catalog, StoreError
from lexiflow.storage.faults import FlakyFileSystem, InjectedFault, InjectedTimeout, flaky_url
from lexiflow.storage.formats import read_rows, row_groups

V1 = "0123456789abcdef"
FRAME = pl.DataFrame({"x": list(range(1000))})


def publish(store: ArtifactStore) -> None:
    with store.writer("corpus", V1, parameters={"p": 1}) as out:
        out.write_parquet("a.parquet", FRAME)
        out.write_json("b.json", {"k": 1})


def test_url_settings_and_remote_code_path(tmp_path):
    store = ArtifactStore(flaky_url(str(tmp_path), fail=0.25, seed=9, outage=0.01, outage_ops=7))
    assert isinstance(store.fs, FlakyFileSystem) and not store.is_local  # object-store path: upload, manifest last
    assert (store.fs.fail, store.fs.outage, store.fs.outage_ops) == (0.25, 0.01, 7)
    assert store.root == str(tmp_path)
    with pytest.raises(ValueError, match="fail=1.5"):
        FlakyFileSystem(fail=1.5)


def test_faults_follow_the_rate_and_the_seed(tmp_path):
    (tmp_path / "f").write_bytes(b"x")

    def pattern(seed: int) -> list[str]:
        fs = FlakyFileSystem(fail=0.3, seed=seed, skip_instance_cache=True)
        out = []
        for _ in range(2000):
            try:
                fs.exists(str(tmp_path / "f"))
                out.append("ok")
            except InjectedTimeout:
                out.append("timeout")
            except InjectedFault:
                out.append("io")
        return out

    first = pattern(1)
    assert first == pattern(1) and first != pattern(2)
    assert abs(1 - first.count("ok") / 2000 - 0.3) < 0.04  # the chosen fraction fails
    assert abs(first.count("timeout") - first.count("io")) < 0.2 * first.count("io")  # half TimeoutError, half OSError


def test_outage_fails_consecutive_operations(tmp_path):
    fs = FlakyFileSystem(fail=0.0, seed=0, outage=0.999, outage_ops=6, skip_instance_cache=True)
    results = []
    for _ in range(6):
        try:
            fs.exists(str(tmp_path))
            results.append(True)
        except OSError:
            results.append(False)
    assert results == [False] * 6


def test_store_retries_single_operations_and_data_stays_exact(tmp_path):
    publish(ArtifactStore(str(tmp_path)))
    FlakyFileSystem.stats.clear()
    store = ArtifactStore(flaky_url(str(tmp_path), fail=0.1, seed=4))
    for _ in range(20):  # each read meets faults now and then; the store's retries absorb them
        assert store.read_parquet("corpus", V1, "a.parquet").equals(FRAME)
        assert store.read_json("corpus", V1, "b.json") == {"k": 1}
        assert store.manifest("corpus", V1)["kind"] == "corpus"
        with store.local_copy("corpus", V1, "a.parquet") as path:  # downloads (loaders, word2vec's corpus)
            assert pl.read_parquet(path).equals(FRAME)
        ref = store.ref("corpus", V1)  # row-range reads of shards
        assert sum(rows for rows, _ in row_groups(ref, "a.parquet")) == 1000
        assert read_rows(ref, "a.parquet", 10, 20)["x"].to_list() == list(range(10, 20))
        with store.local_dir("corpus", V1) as folder:
            assert json.loads((folder / "b.json").read_text()) == {"k": 1}
    assert FlakyFileSystem.stats["faults"] >= 8


def test_missing_is_not_transient(tmp_path):
    store = ArtifactStore(flaky_url(str(tmp_path), fail=0.0))
    with pytest.raises(StoreError, match="no artifact"):
        store.manifest("corpus", V1)  # FileNotFoundError → StoreError at once, no retry


def test_publish_through_faults_gives_a_complete_artifact(tmp_path):
    FlakyFileSystem.stats.clear()
    store = ArtifactStore(flaky_url(str(tmp_path), fail=0.3, seed=11))
    publish(store)
    assert FlakyFileSystem.stats["faults_put"] >= 1
    assert ArtifactStore(str(tmp_path)).verify("corpus", V1, full=True) == []


def test_publish_that_fails_for_good_leaves_nothing_visible(tmp_path):
    """An outage longer than the store's retries fails the upload. Data files may have landed, the
    manifest (uploaded last) has not, so readers see no artifact; a later publish completes it."""
    store = ArtifactStore(flaky_url(str(tmp_path), fail=0.0, seed=1, outage=0.999, outage_ops=50))
    with pytest.raises(OSError):
        publish(store)
    local = ArtifactStore(str(tmp_path))
    assert not local.exists("corpus", V1) and Catalog(local).entries() == []
    publish(local)  # the interrupted upload's files are discarded, the artifact published whole
    assert local.verify("corpus", V1, full=True) == [] and local.clean_staging() == 0
