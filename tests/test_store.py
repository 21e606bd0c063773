"""The artifact store on every backend (`backend`: a local folder, and S3 served by moto on
loopback, tests/backends.py): atomic publish, verification, names, the catalog, concurrent
writers, crash leftovers and resumable scratch state."""

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import polars as pl
import pytest
from lexiflow.storage import ArtifactStore, Catalog, StoreError, content_version

V1, V2, V3 = "0123456789abcdef", "fedcba9876543210", "00000000000000aa"


def publish(store, kind, version, rows=3, inputs=None, fail=False):
    with store.writer(kind, version, inputs=inputs or {}, parameters={"rows": rows}, code_version="c1") as out:
        out.write_parquet("table.parquet", pl.DataFrame({"x": list(range(rows))}))
        out.write_json("config.json", {"rows": rows})
        out.metrics["rows"] = rows
        if fail:
            raise RuntimeError("builder crashed")
    return store.ref(kind, version)


def files(store) -> list[str]:
    """Every file in the store, relative to its root (folders are not files on any backend)."""
    store.refresh()
    return sorted(path[len(store.root) + 1:] for path in store.fs.find(store.root))


def put(store, path, data: bytes) -> None:
    """Write one file into the store behind its back (folders made first, as local files need)."""
    store.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    store.fs.pipe_file(path, data)


def test_publish_writes_files_then_manifest_with_checksums(store_url):
    store = ArtifactStore(store_url)
    ref = publish(store, "corpus", V1)
    manifest = store.manifest("corpus", V1)
    assert manifest["kind"] == "corpus" and manifest["version"] == V1 and manifest["schema_version"] == 1
    assert manifest["metrics"] == {"rows": 3} and manifest["parameters"] == {"rows": 3}
    names = {f["name"]: f for f in manifest["files"]}
    assert set(names) == {"table.parquet", "config.json"}
    assert names["config.json"]["size"] == store.fs.size(store.path("corpus", V1, "config.json")) == len(
        json.dumps({"rows": 3}, indent=2))
    assert len(names["table.parquet"]["sha256"]) == 64
    assert store.read_parquet("corpus", V1, "table.parquet")["x"].to_list() == [0, 1, 2]
    assert store.verify("corpus", V1, full=True) == []
    assert ref.path == store.path("corpus", V1)
    # Nothing else in the store: no staging leftovers, no scratch.
    assert files(store) == [f"corpus/{V1}/config.json", f"corpus/{V1}/manifest.json", f"corpus/{V1}/table.parquet"]


def test_local_refs_point_at_the_folder(tmp_path):
    assert ArtifactStore(tmp_path).ref("corpus", V1).path == str(tmp_path / "corpus" / V1)


def test_a_failed_builder_leaves_no_artifact_and_no_staging(store_url):
    store = ArtifactStore(store_url)
    with pytest.raises(RuntimeError):
        publish(store, "corpus", V1, fail=True)
    assert not store.exists("corpus", V1)
    assert files(store) == []
    assert Catalog(store).list() == []


def strict(text) -> object:
    """Parse as strict JSON parsers do (jq, JSON.parse): NaN and Infinity are no JSON."""
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")
    return json.loads(text, parse_constant=refuse)


def test_manifest_is_strict_json_with_non_finite_metrics_by_the_convention(store_url):
    import numpy as np

    store = ArtifactStore(store_url)
    with store.writer("evaluation", V1, parameters={"bound": float("inf")}) as out:
        out.write_json("config.json", {})
        out.metrics.update({"spearman": float("nan"), "perplexity": float("inf"), "gain": float("-inf"),
                            "per_split": {"valid": [1.5, np.float32("nan")]}, "n": 3, "x": 0.25})
    manifest = strict(store.fs.cat_file(store.path("evaluation", V1, "manifest.json")))
    assert manifest["metrics"] == {"spearman": None, "perplexity": "Infinity", "gain": "-Infinity",
                                   "per_split": {"valid": [1.5, None]}, "n": 3, "x": 0.25}
    assert manifest["parameters"] == {"bound": "Infinity"}
    assert store.manifest("evaluation", V1)["metrics"] == manifest["metrics"]
    assert float(manifest["metrics"]["perplexity"]) == float("inf")  # Python, JavaScript and pandas parse it


def test_verify_detects_tampering(store_url):
    store = ArtifactStore(store_url)
    publish(store, "corpus", V1)
    path = store.path("corpus", V1, "config.json")
    store.fs.pipe_file(path, store.fs.cat_file(path).replace(b"3", b"4"))  # same size, other content
    assert store.verify("corpus", V1) == []
    assert store.verify("corpus", V1, full=True) == [f"corpus:{V1}/config.json: checksum differs from the manifest"]
    store.fs.pipe_file(path, b"{}")
    assert store.verify("corpus", V1) == [f"corpus:{V1}/config.json: size differs from the manifest"]
    store.fs.rm(path)
    assert store.verify("corpus", V1) == [f"corpus:{V1}/config.json: missing"]


@pytest.mark.parametrize("kind, version, name", [
    ("../etc", V1, None), ("Corpus", V1, None), ("corpus", "../../x", None), ("corpus", V1[:-1], None),
    ("corpus", V1, "../manifest.json"), ("corpus", V1, "a/b"), ("corpus", V1, ".hidden"),
])
def test_names_are_validated_against_traversal(store_url, kind, version, name):
    with pytest.raises(StoreError):
        ArtifactStore(store_url).path(kind, version, name)


def test_catalog_lists_latest_and_lineage(store_url):
    store = ArtifactStore(store_url)
    corpus = publish(store, "corpus", V1)
    vocab = publish(store, "tokenizer", V2, inputs={"corpus": corpus})
    publish(store, "embeddings", V3, inputs={"tokenizer": vocab, "corpus": corpus})
    catalog = Catalog(store_url)
    assert [m["kind"] for m in catalog.list()] == ["corpus", "tokenizer", "embeddings"]
    assert catalog.latest("tokenizer")["version"] == V2
    assert catalog.latest("lm") is None
    lineage = catalog.lineage(V3)
    assert lineage["inputs"]["tokenizer"]["inputs"]["corpus"]["version"] == V1
    assert catalog.kinds() == ["corpus", "embeddings", "tokenizer"]
    store.delete("tokenizer", V2)
    assert [m["kind"] for m in catalog.list()] == ["corpus", "embeddings"]
    assert not store.fs.exists(store.path("tokenizer", V2, "table.parquet"))


def test_a_damaged_manifest_is_left_out_of_the_catalog_and_hides_nothing_else(store_url, caplog):
    store = ArtifactStore(store_url)
    publish(store, "evaluation", V1)
    publish(store, "evaluation", V2)
    put(store, store.path("evaluation", V2, "manifest.json"), b"{not json")  # the newest one, damaged
    catalog = Catalog(store_url)
    assert [m["version"] for m in catalog.list()] == [V1]
    assert catalog.latest("evaluation")["version"] == V1
    assert f"evaluation:{V2}: manifest is not valid JSON" in caplog.text
    assert Catalog(store_url).audit()[1]  # verify still reports it


def test_a_catalog_sees_what_another_client_published_after_it_listed(store_url):
    """Two stores on separate filesystem clients (as two processes have): the reader's listing
    cache must not hide an artifact the writer published after the reader first listed."""
    reader, catalog = ArtifactStore(store_url), Catalog(store_url)
    publish(reader, "corpus", V1)
    assert [m["version"] for m in catalog.list()] == [V1] and catalog.latest("tokenizer") is None
    assert not reader.exists("corpus", V2)
    writer = ArtifactStore(store_url, storage_options={**reader.fs.storage_options, "skip_instance_cache": True})
    assert writer.fs is not reader.fs
    publish(writer, "corpus", V2)
    publish(writer, "tokenizer", V3, inputs={"corpus": writer.ref("corpus", V2)})
    assert reader.exists("corpus", V2) and reader.verify("corpus", V2, full=True) == []
    assert sorted(m["version"] for m in catalog.list()) == sorted([V1, V2, V3])
    assert catalog.lineage(V3)["inputs"]["corpus"]["version"] == V2
    writer.delete("corpus", V1)
    assert [v for _, v in catalog.entries("corpus")] == [V2] and not reader.exists("corpus", V1)


def test_files_without_a_manifest_are_no_artifact_and_the_next_publish_replaces_them(store_url):
    """What an interrupted upload leaves (data files, no manifest: the commit point never came)."""
    store = ArtifactStore(store_url)
    put(store, store.path("corpus", V1, "table.parquet"), b"half an upload")
    assert not store.exists("corpus", V1) and Catalog(store).entries() == []
    with pytest.raises(StoreError, match="no artifact"):
        Catalog(store).get("corpus", V1)
    publish(store, "corpus", V1)
    assert store.verify("corpus", V1, full=True) == []
    assert store.read_parquet("corpus", V1, "table.parquet")["x"].to_list() == [0, 1, 2]


def test_a_second_publish_of_a_version_keeps_the_first_manifest(store_url):
    store = ArtifactStore(store_url)
    publish(store, "corpus", V1)
    first = store.manifest("corpus", V1)
    publish(ArtifactStore(store_url), "corpus", V1)
    assert store.manifest("corpus", V1) == first  # same `created`: the catalog order is stable


def test_concurrent_writers_of_one_version_publish_it_once(store_url):
    store = ArtifactStore(store_url)
    errors = []

    def write(i):
        try:
            publish(ArtifactStore(store_url), "corpus", V1 if i % 2 else V2, rows=5)
        except Exception as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(m["version"] for m in Catalog(store).list()) == [V1, V2]
    assert store.verify("corpus", V1, full=True) == [] and store.verify("corpus", V2, full=True) == []
    assert store.manifest("corpus", V1)["metrics"] == {"rows": 5}
    assert len(files(store)) == 6


def test_two_writers_of_different_bytes_for_one_version_leave_a_sound_artifact(store_url):
    """A builder that is not deterministic (it should be): whichever writer's manifest stands,
    it describes the files that are there."""
    barrier = threading.Barrier(2)
    errors = []

    def write(rows):
        try:
            store = ArtifactStore(store_url)
            with store.writer("corpus", V1) as out:
                out.write_parquet("table.parquet", pl.DataFrame({"x": list(range(rows))}))
                out.write_text("rows.txt", "r" * rows)
                barrier.wait(timeout=30)  # both finish building before either publishes
        except Exception as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(rows,)) for rows in (3, 7)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    store = ArtifactStore(store_url)
    assert errors == [] and store.verify("corpus", V1, full=True) == []
    rows = store.read_parquet("corpus", V1, "table.parquet").height
    assert rows in (3, 7) and store.read_text("corpus", V1, "rows.txt") == "r" * rows


def test_content_version_depends_on_every_input():
    base = content_version("ppmi", {"cooccurrence": V1}, {"alpha": 0.75}, "code")
    assert base == content_version("ppmi", {"cooccurrence": V1}, {"alpha": 0.75}, "code")
    assert len({base,
                content_version("ppmi", {"cooccurrence": V2}, {"alpha": 0.75}, "code"),
                content_version("ppmi", {"cooccurrence": V1}, {"alpha": 1.0}, "code"),
                content_version("ppmi", {"cooccurrence": V1}, {"alpha": 0.75}, "code2"),
                content_version("svd", {"cooccurrence": V1}, {"alpha": 0.75}, "code")}) == 5


def test_clean_staging_removes_crash_leftovers(store_url):
    store = ArtifactStore(store_url)
    publish(store, "corpus", V2)
    # What crashed writers leave: a staging folder, and files of an upload that never committed.
    put(store, f"{store.root}/.staging/corpus-{V1}-x/table.parquet", b"staged")
    put(store, store.path("corpus", V1, "table.parquet"), b"uploaded")
    assert store.clean_staging(older_than=3600) == 0  # fresh: could be a writer at work
    assert store.clean_staging() == (1 if store.is_local else 2)
    left = [f"corpus/{V1}/table.parquet"] if store.is_local else []  # local writers only ever rename whole folders
    published = [f"corpus/{V2}/{n}" for n in ("config.json", "manifest.json", "table.parquet")]
    assert files(store) == sorted(left + published)
    assert [m["version"] for m in Catalog(store).list()] == [V2]


def test_scratch_state_survives_a_failed_build_and_goes_with_the_publish(store_url):
    """Resumable state (checkpoints) outlives a failed attempt, also on another machine for object
    stores (the local copy is gone; the store's `.scratch` copy comes back), and is removed once
    the artifact is published."""
    store = ArtifactStore(store_url)
    with pytest.raises(RuntimeError):
        with store.writer("lm", V1) as out:
            (out.scratch / "ckpt").mkdir(parents=True)
            (out.scratch / "ckpt" / "step-10.json").write_text('{"step": 10}')
            raise RuntimeError("killed mid-training")
    assert not store.exists("lm", V1)
    if not store.is_local:
        shutil.rmtree(store._scratch("lm", V1))  # another worker: nothing local
    with store.writer("lm", V1) as out:
        assert (out.scratch / "ckpt" / "step-10.json").read_text() == '{"step": 10}'
        out.write_json("config.json", {"resumed_from": 10})
    assert not store._scratch("lm", V1).exists()
    assert files(store) == [f"lm/{V1}/config.json", f"lm/{V1}/manifest.json"]


def test_concurrent_writers_of_one_version_keep_their_own_work_files(store_url):
    """Shard results and DDP jobs go to the writer's own work folder: a second build of the same
    version (another run) neither clears them when it starts nor removes them when it publishes."""
    store = ArtifactStore(store_url)
    with store.writer("corpus", V1) as first:
        (first.work / "shards").mkdir(parents=True)
        (first.work / "shards" / "000000.parquet").write_text("first's shard")
        with ArtifactStore(store_url).writer("corpus", V1) as second:
            assert second.work != first.work
            (second.work / "shards").mkdir(parents=True)
            second.write_json("config.json", {"by": "second"})
        assert (first.work / "shards" / "000000.parquet").read_text() == "first's shard"
        first.write_json("config.json", {"by": "second"})
    assert not first.work.exists() and not second.work.exists()
    assert files(store) == [f"corpus/{V1}/config.json", f"corpus/{V1}/manifest.json"]


def test_a_second_builder_waits_for_the_first_and_a_killed_holder_releases_it(store_url):
    """`build_lock` is an OS lock: a second build of the version waits while the first holds it
    (here another process), and a holder killed with SIGKILL lets it through."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from storage import ArtifactStore\n"
                               f"with ArtifactStore({store_url!r}).build_lock('lm', {V1!r}):\n"
                               "    print('held', flush=True); time.sleep(120)"],
        cwd=Path(__file__).resolve().parents[1], stdout=subprocess.PIPE)
    assert holder.stdout.readline() == b"held\n"
    entered = threading.Event()

    def second_builder():
        with ArtifactStore(store_url).build_lock("lm", V1):
            entered.set()

    waiter = threading.Thread(target=second_builder)
    waiter.start()
    try:
        assert not entered.wait(1.0)  # the holder is alive: the second builder waits
    finally:
        holder.kill()
        holder.wait()
    assert entered.wait(30)
    waiter.join()
    lock = ArtifactStore(store_url)._scratch("lm", V1).with_name(f"lm-{V1}.lock")
    assert not lock.exists()  # gone after a normal end


def test_a_run_arriving_after_the_lock_file_went_still_waits_for_the_run_holding_it(tmp_path):
    """The first builder removes the lock file when it ends; a builder that was waiting then holds the
    removed file. A newcomer must not lock a fresh file beside it and build at the same time."""
    store = ArtifactStore(tmp_path)
    events = {name: threading.Event() for name in ("a_in", "a_go", "b_in", "b_go", "c_in")}

    def builder(entered: str, leave: str | None) -> None:
        with store.build_lock("lm", V1):
            events[entered].set()
            if leave:
                events[leave].wait(30)

    first = threading.Thread(target=builder, args=("a_in", "a_go"))
    first.start()
    assert events["a_in"].wait(30)
    waiting = threading.Thread(target=builder, args=("b_in", "b_go"))
    waiting.start()
    time.sleep(0.3)  # the second builder has opened the lock file and waits on it
    events["a_go"].set()
    assert events["b_in"].wait(30)
    newcomer = threading.Thread(target=builder, args=("c_in", None))
    newcomer.start()
    try:
        assert not events["c_in"].wait(1.0)  # the second builder still holds the lock
    finally:
        events["b_go"].set()
    assert events["c_in"].wait(30)
    for thread in (first, waiting, newcomer):
        thread.join()


def test_builds_on_two_object_stores_do_not_wait_for_each_other(moto_s3):
    """Object stores keep their lock files in this user's own temp folder, one file per store."""
    first, second = ArtifactStore(moto_s3.new_url()), ArtifactStore(moto_s3.new_url())
    entered = threading.Event()

    def build_on_second() -> None:
        with second.build_lock("corpus", V1):
            entered.set()

    with first.build_lock("corpus", V1):
        other = threading.Thread(target=build_on_second)
        other.start()
        assert entered.wait(30)
        other.join()
    assert first._lock_path("corpus", V1).parent.name == f"lexiflow-locks-{os.getuid()}"


def test_builds_of_one_version_on_two_object_stores_keep_their_own_resumable_state(moto_s3):
    """Their locks differ, so both may train at once on one machine: each store's checkpoints are its
    own (they were one folder, /tmp/lexiflow-scratch/<kind>-<version>, shared by every store and user)."""
    first, second = ArtifactStore(moto_s3.new_url()), ArtifactStore(moto_s3.new_url())
    with pytest.raises(RuntimeError):
        with first.writer("lm", V1) as out:
            out.scratch.mkdir(parents=True)
            (out.scratch / "step-10.json").write_text('{"step": 10}')
            raise RuntimeError("killed mid-training")
    with second.writer("lm", V1) as out:
        assert not out.scratch.exists()  # nothing to resume from: not the other store's checkpoint
        out.write_json("config.json", {})
    with first.writer("lm", V1) as out:  # the second's publish left the first's checkpoint alone
        assert (out.scratch / "step-10.json").read_text() == '{"step": 10}'
        out.write_json("config.json", {})
    assert first._scratch("lm", V1).parent.name == f"lexiflow-scratch-{os.getuid()}"


def test_a_local_publish_is_on_disk_before_its_rename(tmp_path, monkeypatch):
    """A power loss after the rename must not leave a published folder whose files never reached the
    disk: every staged file, the manifest and the folder are flushed before the rename, the folders
    holding the rename after it."""
    import lexiflow.storage.publishing as store_module

    events = []
    monkeypatch.setattr(store_module, "_fsync", lambda path: events.append(("fsync", Path(path).name)))
    real_rename = os.rename
    monkeypatch.setattr(store_module.os, "rename", lambda a, b: (events.append(("rename", "")), real_rename(a, b)))
    publish(ArtifactStore(tmp_path / "store"), "corpus", V1)
    rename = events.index(("rename", ""))
    flushed = {name for _, name in events[:rename]}
    assert {"table.parquet", "config.json", "manifest.json"} < flushed and any(n.startswith("corpus-") for n in flushed)
    assert events[rename + 1:] == [("fsync", "corpus"), ("fsync", "store")]
