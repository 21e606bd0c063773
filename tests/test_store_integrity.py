"""The store defends itself, on every backend (tests/backends.py): manifests are checked against one
schema when read, damage is found where data is used (sizes on reuse, Parquet page checksums and
SHA-256 on read), symbolic links are reported and never exported, and `rm`/`gc` repair the store
and keep it small. Damaged stores are made here, by hand, as a disk or a person would damage them."""

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
from lexiflow.flows.cli import main
from lexiflow.storage import ArtifactStore, Catalog
from lexiflow.storage.formats import read_rows
from lexiflow.storage.manifests import ArtifactDamaged, manifest_problems
from lexiflow.tasks.stage import reusable

from benchmarks.hostile import flip_byte, rewrite_manifest
from tests.test_store import V1, V2, V3, files, publish, put

V4, V5 = "00000000000000bb", "00000000000000cc"


@pytest.mark.parametrize("damage, problem", [
    (lambda m: m.pop("created"), "manifest field 'created' is missing or not a str"),
    (lambda m: m.pop("inputs"), "manifest field 'inputs' is missing or not a dict"),
    (lambda m: m.update(inputs={"corpus": {"kind": "corpus"}}), "invalid input 'corpus'"),
    (lambda m: m.update(created="yesterday"), "manifest 'created' is not an ISO-8601 time"),
    (lambda m: m.update(version=V3), f"manifest describes 'corpus':'{V3}'"),
    (lambda m: m["files"][0].update(sha256="abc"), "invalid file entry"),
    (lambda m: m.update(schema_version=True), "manifest field 'schema_version' is missing or not a int"),
])
def test_a_manifest_breaking_the_schema_is_named_skipped_by_listings_and_reported_by_verify(
        store_url, capsys, damage, problem):
    store = ArtifactStore(store_url)
    publish(store, "corpus", V1)
    publish(store, "corpus", V2)
    rewrite_manifest(store, "corpus", V2, damage)
    catalog = Catalog(store_url)
    assert [m["version"] for m in catalog.list()] == [V1]  # never a KeyError, and the others still listed
    assert len(catalog.left_out) == 1 and catalog.left_out[0].startswith(f"corpus:{V2}: ") and problem in \
        catalog.left_out[0]
    with pytest.raises(ArtifactDamaged, match=problem.replace("(", r"\(").replace("'", "'")):
        store.manifest("corpus", V2)
    assert main(["artifacts", "list", "--store", store_url]) == 0
    out = capsys.readouterr()
    assert V1 in out.out and V2 not in out.out
    assert out.err.strip().startswith(f"warning: left out: corpus:{V2}: ") and problem in out.err
    assert main(["artifacts", "verify", "--store", store_url]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith(f"corpus:{V2}: ") and problem in lines[0]
    assert lines[1] == "2 artifacts checked (sizes), 1 problems"


def test_every_manifest_the_writer_publishes_follows_the_schema(store_url):
    store = ArtifactStore(store_url)
    publish(store, "corpus", V1)
    publish(store, "tokenizer", V2, inputs={"corpus": store.ref("corpus", V1)})
    for kind, version in (("corpus", V1), ("tokenizer", V2)):
        raw = json.loads(store.fs.cat_file(store.path(kind, version, "manifest.json")))
        assert manifest_problems(raw, kind, version) == []


def test_a_flipped_byte_in_a_parquet_table_is_refused_when_read_naming_the_artifact_and_the_repair(store_url):
    store = ArtifactStore(store_url)
    with store.writer("ppmi", V1) as out:
        out.write_parquet("matrix.parquet", pl.DataFrame({"value": [float(i) for i in range(20_000)]}),
                          row_group_size=5_000)
    flip_byte(store, "ppmi", V1, "matrix.parquet", where=0.3)
    assert store.verify("ppmi", V1) == []  # same size: reuse lets it through, the read must not
    repair = f"remove it with `lexiflow artifacts rm ppmi:{V1} --force` and run again to rebuild it"
    for read in (lambda: store.read_parquet("ppmi", V1, "matrix.parquet"),
                 lambda: read_rows(store.ref("ppmi", V1), "matrix.parquet", 0, 20_000)):
        with pytest.raises(ArtifactDamaged) as info:
            read()
        message = str(info.value)
        assert message.startswith(f"ppmi:{V1}/matrix.parquet: damaged (") and message.endswith(repair), message
        assert "checksum" in message and "\n" not in message
    assert store.verify("ppmi", V1, full=True) == [f"ppmi:{V1}/matrix.parquet: checksum differs from the manifest"]


def test_files_read_whole_are_checked_against_their_checksums(store_url):
    store = ArtifactStore(store_url)
    publish(store, "lm", V1)
    path = store.path("lm", V1, "config.json")
    store.fs.pipe_file(path, store.fs.cat_file(path).replace(b"3", b"4"))  # same size
    with pytest.raises(ArtifactDamaged, match=f"lm:{V1}/config.json: checksum differs from the manifest; remove it"):
        with store.local_dir("lm", V1):
            pass
    with pytest.raises(ArtifactDamaged, match="checksum differs"):
        with store.local_copy("lm", V1, "config.json"):
            pass
    with store.local_copy("lm", V1, "table.parquet") as local:  # the sound file of the same artifact
        assert pl.read_parquet(local)["x"].to_list() == [0, 1, 2]


def test_reuse_checks_what_it_reuses_and_a_damaged_artifact_is_removed_to_be_rebuilt(store_url, caplog):
    store = ArtifactStore(store_url)
    publish(store, "corpus", V1)
    assert reusable(store, "corpus", V1) and not reusable(store, "corpus", V2)  # V2: never built
    store.fs.rm(store.path("corpus", V1, "table.parquet"))  # a deleted data file
    assert not reusable(store, "corpus", V1)  # without the build lock: only the answer
    assert store.exists("corpus", V1)
    with caplog.at_level(logging.WARNING, logger="test"):
        assert not reusable(store, "corpus", V1, logging.getLogger("test"))
    assert f"corpus:{V1}: damaged (corpus:{V1}/table.parquet: missing); rebuilding it" in caplog.text
    assert not store.exists("corpus", V1) and files(store) == []
    publish(store, "corpus", V1)
    assert reusable(store, "corpus", V1)
    rewrite_manifest(store, "corpus", V1, lambda m: m.pop("inputs"))  # a damaged manifest: rebuilt too
    assert not reusable(store, "corpus", V1, logging.getLogger("test")) and not store.exists("corpus", V1)


def test_rm_refuses_an_artifact_others_were_built_from_unless_forced_and_says_what_follows(store_url, capsys):
    store = ArtifactStore(store_url)
    corpus = publish(store, "corpus", V1)
    publish(store, "tokenizer", V2, inputs={"corpus": corpus})
    assert main(["artifacts", "rm", f"corpus:{V1}", "--store", store_url]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"error: corpus:{V1}: 1 artifact(s) were built from it (tokenizer:{V2}); remove them first, or "
                   "add --force (they stay usable, their lineage then names a missing input)")
    assert store.exists("corpus", V1)
    assert main(["artifacts", "rm", f"corpus:{V1}", "--force", "--store", store_url]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"removed corpus:{V1}" and f"tokenizer:{V2}" in out[1] and "rebuilds it" in out[1]
    assert not store.exists("corpus", V1)
    assert Catalog(store_url).lineage(V2)["inputs"]["corpus"] == {"kind": "corpus", "version": V1, "missing": True}
    assert main(["artifacts", "rm", f"tokenizer:{V2}", "--store", store_url]) == 0  # nothing built from it
    assert files(store) == []
    assert main(["artifacts", "rm", "tokenizer", "--store", store_url]) == 2
    assert "give KIND:VERSION" in capsys.readouterr().err


def lineage_store(store_url) -> ArtifactStore:
    """Two runs' worth: corpus V1 → tokenizer V2 → report V3 (older), and corpus V1 → tokenizer V4 →
    report V5 (newer), plus the older run's leftovers."""
    store = ArtifactStore(store_url)
    corpus = publish(store, "corpus", V1)
    old_tok = publish(store, "tokenizer", V2, inputs={"corpus": corpus})
    publish(store, "report", V3, inputs={"tokenizer": old_tok})
    time.sleep(0.01)  # `created` orders them
    new_tok = publish(store, "tokenizer", V4, inputs={"corpus": corpus})
    publish(store, "report", V5, inputs={"tokenizer": new_tok})
    return store


def test_gc_keeps_the_newest_of_each_kind_and_their_whole_lineage(store_url, capsys):
    store = lineage_store(store_url)
    # corpus V1: an input of the kept tokenizer
    assert Catalog(store).unreferenced(1) == [("report", V3), ("tokenizer", V2)]
    assert Catalog(store).unreferenced(2) == []
    before = files(store)
    assert main(["artifacts", "gc", "--keep", "1", "--dry-run", "--store", store_url]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == [f"would remove report:{V3}", f"would remove tokenizer:{V2}"]
    assert files(store) == before
    assert main(["artifacts", "gc", "--keep", "1", "--store", store_url]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == ("removed 0 leftovers of killed writers and 2 artifacts "
                                                         "(keeping the 1 newest of each kind, the released ones "
                                                         "and what they were built from)")
    assert sorted(v for _, v in Catalog(store_url).entries()) == sorted([V1, V4, V5])
    assert main(["artifacts", "verify", "--store", store_url]) == 0


WRITER = """
import sys, time
from lexiflow.storage import ArtifactStore
from lexiflow.storage.files import register_storage_options
import json
register_storage_options(sys.argv[1], json.loads(sys.argv[2]) or None)
with ArtifactStore(sys.argv[1]).writer("corpus", "{version}") as out:
    out.write_text("a.txt", "partial")
    out.work.mkdir()
    print("staged", flush=True)
    time.sleep(600)
"""


def start_writer(store: ArtifactStore, version: str) -> subprocess.Popen:
    options = json.dumps(store.fs.storage_options if not store.is_local else {})
    writer = subprocess.Popen([sys.executable, "-c", WRITER.format(version=version), store.url, options],
                              stdout=subprocess.PIPE, text=True)
    assert writer.stdout.readline().strip() == "staged"
    return writer


def staged(store: ArtifactStore) -> list[str]:
    """This store's staging entries: `<root>/.staging/` or, for object stores, the temp folder."""
    folder = Path(store.root) / ".staging" if store.is_local else Path(os.environ.get("TMPDIR", "/tmp"))
    prefix = "" if store.is_local else f"lexiflow-{store._store_id()}-"
    return sorted(p.name[len(prefix):] for p in folder.iterdir() if p.name.startswith(prefix)) \
        if folder.is_dir() else []


def test_gc_removes_what_killed_writers_left_and_never_touches_a_live_one(store_url, capsys):
    store = ArtifactStore(store_url)
    killed, live = start_writer(store, V1), start_writer(store, V2)
    try:
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait()
        left = staged(store)
        assert sum(name.startswith(f"corpus-{V1}-") for name in left) == 3  # folder, work folder, lock file
        if not store.is_local:  # and an upload that never reached its commit point, old enough
            put(store, store.path("corpus", V3, "a.txt"), b"uploaded")
        assert main(["artifacts", "gc", "--dry-run", "--older-than", "0", "--store", store_url]) == 0
        assert staged(store) == left
        assert main(["artifacts", "gc", "--older-than", "0", "--store", store_url]) == 0
        out = capsys.readouterr().out
        assert f"removed {3 + (not store.is_local)} leftovers of killed writers and 0 artifacts" in out
        assert all(name.startswith(f"corpus-{V2}-") for name in staged(store)) and len(staged(store)) == 3
        assert [f for f in files(store) if not f.startswith(".staging/")] == []  # the upload too
    finally:
        live.kill()
        live.wait()


def test_verify_reports_symlinks_and_export_never_follows_them(tmp_path, capsys):
    store = ArtifactStore(tmp_path / "store")
    publish(store, "corpus", V1)
    secret = tmp_path / "secret.txt"
    secret.write_text("outside the store")
    folder = Path(store.path("corpus", V1))
    (folder / "extra.txt").symlink_to(secret)  # a link beside the listed files
    (folder / "config.json").unlink()
    (folder / "config.json").symlink_to(secret)  # a listed file replaced by a link
    problems = store.verify("corpus", V1)
    assert problems == [f"corpus:{V1}/config.json: a symbolic link to {str(secret)!r}; artifacts hold plain files "
                        "only (export never follows links)",
                        f"corpus:{V1}/extra.txt: a symbolic link to {str(secret)!r}; artifacts hold plain files "
                        "only (export never follows links)"]
    dest = tmp_path / "out"
    assert main(["artifacts", "export", f"corpus:{V1}", str(dest), "--store", store.url]) == 2
    assert capsys.readouterr().err.strip() == (f"error: corpus:{V1}/config.json: a symbolic link, not exported "
                                               "(artifacts hold plain files only); run `lexiflow artifacts verify`")
    assert not dest.exists()
