import json
import threading

import polars as pl
import pytest

from storage import ArtifactStore, Catalog, StoreError, content_version

V1, V2, V3 = "0123456789abcdef", "fedcba9876543210", "00000000000000aa"


def publish(store, kind, version, rows=3, inputs=None, fail=False):
    with store.writer(kind, version, inputs=inputs or {}, parameters={"rows": rows}, code_version="c1") as out:
        out.write_parquet("table.parquet", pl.DataFrame({"x": list(range(rows))}))
        out.write_json("config.json", {"rows": rows})
        out.metrics["rows"] = rows
        if fail:
            raise RuntimeError("builder crashed")
    return store.ref(kind, version)


def test_publish_writes_files_then_manifest_with_checksums(tmp_path):
    store = ArtifactStore(tmp_path)
    ref = publish(store, "corpus", V1)
    manifest = store.manifest("corpus", V1)
    assert manifest["kind"] == "corpus" and manifest["version"] == V1 and manifest["schema_version"] == 1
    assert manifest["metrics"] == {"rows": 3} and manifest["parameters"] == {"rows": 3}
    names = {f["name"]: f for f in manifest["files"]}
    assert set(names) == {"table.parquet", "config.json"}
    assert names["config.json"]["size"] == (tmp_path / "corpus" / V1 / "config.json").stat().st_size
    assert len(names["table.parquet"]["sha256"]) == 64
    assert store.read_parquet("corpus", V1, "table.parquet")["x"].to_list() == [0, 1, 2]
    assert store.verify("corpus", V1, full=True) == []
    assert ref.path == str(tmp_path / "corpus" / V1)
    assert not any((tmp_path / ".staging").iterdir())


def test_a_failed_builder_leaves_no_artifact_and_no_staging(tmp_path):
    store = ArtifactStore(tmp_path)
    with pytest.raises(RuntimeError):
        publish(store, "corpus", V1, fail=True)
    assert not store.exists("corpus", V1)
    assert not (tmp_path / "corpus" / V1).exists()
    assert not any((tmp_path / ".staging").iterdir())
    assert Catalog(store).list() == []


def test_verify_detects_tampering(tmp_path):
    store = ArtifactStore(tmp_path)
    publish(store, "corpus", V1)
    path = tmp_path / "corpus" / V1 / "config.json"
    path.write_text(path.read_text().replace("3", "4"))  # same size, other content
    assert store.verify("corpus", V1) == []
    assert store.verify("corpus", V1, full=True) == [f"corpus:{V1}/config.json: checksum differs from the manifest"]
    path.unlink()
    assert "missing" in store.verify("corpus", V1)[0]


@pytest.mark.parametrize("kind, version, name", [
    ("../etc", V1, None), ("Corpus", V1, None), ("corpus", "../../x", None), ("corpus", V1[:-1], None),
    ("corpus", V1, "../manifest.json"), ("corpus", V1, "a/b"), ("corpus", V1, ".hidden"),
])
def test_names_are_validated_against_traversal(tmp_path, kind, version, name):
    with pytest.raises(StoreError):
        ArtifactStore(tmp_path).path(kind, version, name)


def test_catalog_lists_latest_and_lineage(tmp_path):
    store = ArtifactStore(tmp_path)
    corpus = publish(store, "corpus", V1)
    vocab = publish(store, "tokenizer", V2, inputs={"corpus": corpus})
    publish(store, "embeddings", V3, inputs={"tokenizer": vocab, "corpus": corpus})
    catalog = Catalog(tmp_path)
    assert [m["kind"] for m in catalog.list()] == ["corpus", "tokenizer", "embeddings"]
    assert catalog.latest("tokenizer")["version"] == V2
    assert catalog.latest("lm") is None
    lineage = catalog.lineage(V3)
    assert lineage["inputs"]["tokenizer"]["inputs"]["corpus"]["version"] == V1
    assert catalog.kinds() == ["corpus", "embeddings", "tokenizer"]
    store.delete("tokenizer", V2)
    assert [m["kind"] for m in catalog.list()] == ["corpus", "embeddings"]


def test_concurrent_writers_of_one_version_publish_it_once(tmp_path):
    store = ArtifactStore(tmp_path)
    errors = []

    def write(i):
        try:
            publish(ArtifactStore(tmp_path), "corpus", V1 if i % 2 else V2, rows=5)
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
    assert json.loads((tmp_path / "corpus" / V1 / "manifest.json").read_text())["metrics"] == {"rows": 5}


def test_content_version_depends_on_every_input():
    base = content_version("ppmi", {"cooccurrence": V1}, {"alpha": 0.75}, "code")
    assert base == content_version("ppmi", {"cooccurrence": V1}, {"alpha": 0.75}, "code")
    assert len({base,
                content_version("ppmi", {"cooccurrence": V2}, {"alpha": 0.75}, "code"),
                content_version("ppmi", {"cooccurrence": V1}, {"alpha": 1.0}, "code"),
                content_version("ppmi", {"cooccurrence": V1}, {"alpha": 0.75}, "code2"),
                content_version("svd", {"cooccurrence": V1}, {"alpha": 0.75}, "code")}) == 5


def test_clean_staging_removes_crash_leftovers(tmp_path):
    store = ArtifactStore(tmp_path)
    (tmp_path / ".staging" / f"corpus-{V1}-x").mkdir(parents=True)
    assert store.clean_staging() == 1
    assert Catalog(store).list() == []
