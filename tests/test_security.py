"""Security: no pickle anywhere artifacts are written or read, names validated against path
traversal, `lexiflow artifacts verify [--full]` catches tampering; store tests run on a local folder and
on S3 (moto on loopback, tests/backends.py). (Servers binding to 127.0.0.1:
tests/test_reliability.py::test_prefect_server_listens_on_loopback_only.)"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from lexiflow.flows.cli import main
from lexiflow.storage import ArtifactRef, ArtifactStore, Catalog, StoreError
from lexiflow.storage.manifests import validate_file_name, validate_kind, validate_version

ROOT = Path(__file__).resolve().parents[1]
V1, V2 = "0123456789abcdef", "fedcba9876543210"
TRAVERSALS = ["..", "../x", "../../etc/passwd", "/etc/passwd", "a/b", "a\\b", ".staging", ".hidden", "", " ",
              "x\x00y", "C:\\x", "%2e%2e", "kind\n", "~root"]


def test_no_pickle_in_code_that_writes_or_reads_artifacts():
    """Artifacts are Parquet, JSON, text or safetensors: no module that handles them unpickles."""
    forbidden = re.compile(r"\bimport pickle\b|\bpickle\.|\bcloudpickle\b|\bdill\b|\bjoblib\b|allow_pickle\s*=\s*True"
                           r"|torch\.load\((?![^)]*weights_only\s*=\s*True)")
    # The one exception, never near an artifact: the Dask probe (tasks/runners.py: _probe) serializes a
    # shard task's message with cloudpickle, as Dask itself does for every task, and loads it on a worker.
    allowed = {("tasks/runners.py", "cloudpickle")}
    offenders = []
    for folder in ("storage", "tasks", "flows", "models"):
        for path in (ROOT / folder).rglob("*.py"):
            name = str(path.relative_to(ROOT))
            for number, line in enumerate(path.read_text().splitlines(), start=1):
                match = forbidden.search(line)
                if match and (name, match.group(0)) not in allowed:
                    offenders.append(f"{name}:{number}: {line.strip()}")
    assert offenders == []


def test_prefect_results_of_stages_are_json_not_pickle():
    from lexiflow.tasks.corpus import ingest_corpus
    from lexiflow.tasks.embeddings import svd_embeddings
    from prefect.serializers import JSONSerializer

    for stage_task in (ingest_corpus, svd_embeddings):
        assert isinstance(stage_task.result_serializer, JSONSerializer) or stage_task.result_serializer == "json"


@pytest.mark.parametrize("name", TRAVERSALS)
def test_kinds_versions_and_file_names_reject_traversal(name, store_url):
    for validate in (validate_kind, validate_version, validate_file_name):
        with pytest.raises(StoreError):
            validate(name)
    store = ArtifactStore(store_url)
    with pytest.raises(StoreError):
        store.path(name, V1)
    with pytest.raises(StoreError):
        store.path("corpus", name)
    with pytest.raises(StoreError):
        store.path("corpus", V1, name)
    with pytest.raises(StoreError):
        _ = ArtifactRef(store=store_url, kind=name, version=V1).path
    with pytest.raises(StoreError):
        Catalog(store).get("corpus", name)
    with pytest.raises(StoreError):
        Catalog(store).find(name)


def make_store(url: str) -> ArtifactStore:
    store = ArtifactStore(url)
    for version in (V1, V2):
        with store.writer("corpus", version, parameters={"n": 1}) as out:
            out.write_parquet("documents.parquet", pl.DataFrame({"text": ["a b c", "d e"]}))
            out.write_json("config.json", {"version": version})
    return store


def test_writer_refuses_links_out_of_the_artifact(tmp_path, store_url):
    store = ArtifactStore(store_url)
    secret = tmp_path / "secret.txt"
    secret.write_text("outside the store")
    with pytest.raises(StoreError, match="plain files"):
        with store.writer("corpus", V1) as out:
            out.path("link.txt").symlink_to(secret)
    assert Catalog(store).entries() == []


def test_a_tampered_manifest_cannot_steer_reads_outside_the_artifact(store_url):
    store = make_store(store_url)
    manifest = store.manifest("corpus", V1)
    manifest["files"].append({"name": "../../../etc/passwd", "size": 1, "sha256": "0" * 64})
    store.fs.pipe_file(store.path("corpus", V1, "manifest.json"), json.dumps(manifest).encode())
    problems = store.verify("corpus", V1, full=True)
    assert problems == [f"corpus:{V1}: invalid file entry {manifest['files'][-1]!r} in the manifest"]


def test_cli_verify_reports_a_file_entry_without_size_as_a_problem_of_its_artifact(store_url, capsys):
    store = make_store(store_url)
    manifest = store.manifest("corpus", V1)
    entry = manifest["files"][0]
    del entry["size"]
    store.fs.pipe_file(store.path("corpus", V1, "manifest.json"), json.dumps(manifest).encode())
    assert main(["artifacts", "verify", "--store", store_url]) == 1
    assert capsys.readouterr().out.strip().splitlines() == [
        f"corpus:{V1}: invalid file entry {entry!r} in the manifest", "2 artifacts checked (sizes), 1 problems"]


def test_cli_show_rejects_traversal_with_one_line(store_url, capsys):
    make_store(store_url)
    assert main(["artifacts", "show", "../../etc:passwd", "--store", store_url]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: invalid artifact ") and "\n" not in err
    assert main(["artifacts", "show", f"../../etc:{V1}", "--store", store_url]) == 2
    assert capsys.readouterr().err.strip() == ("error: invalid artifact kind '../../etc': use lowercase letters, "
                                               "digits and '_'")


def test_cli_verify_sizes_and_checksums(store_url, capsys):
    store = make_store(store_url)
    fs = store.fs

    def put(path: str, data: bytes) -> None:
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        fs.pipe_file(path, data)

    assert main(["artifacts", "verify", "--store", store_url, "--full"]) == 0
    assert capsys.readouterr().out.strip() == "2 artifacts checked (checksums), 0 problems"

    # Same size, one byte changed: only the checksum (--full) notices.
    config = store.path("corpus", V1, "config.json")
    data = bytearray(fs.cat_file(config))
    data[-2] = ord("X") if data[-2] != ord("X") else ord("Y")
    put(config, bytes(data))
    assert main(["artifacts", "verify", "--store", store_url]) == 0
    assert capsys.readouterr().out.strip() == "2 artifacts checked (sizes), 0 problems"
    assert main(["artifacts", "verify", "--store", store_url, "--full"]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [f"corpus:{V1}/config.json: checksum differs from the manifest",
                   "2 artifacts checked (checksums), 1 problems"]

    # Truncated file and missing file: sizes are enough.
    docs = store.path("corpus", V2, "documents.parquet")
    put(docs, fs.cat_file(docs)[:-10])
    fs.rm(store.path("corpus", V1, "documents.parquet"))
    assert main(["artifacts", "verify", "--store", store_url]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [f"corpus:{V1}/documents.parquet: missing",
                   f"corpus:{V2}/documents.parquet: size differs from the manifest",
                   "2 artifacts checked (sizes), 2 problems"]

    # A corrupt manifest is a reported problem, not a crash; staging leftovers are not artifacts.
    put(store.path("corpus", V2, "manifest.json"), b"{not json")
    put(f"{store.root}/.staging/corpus-{V1}-crashed/manifest.json", b"{}")
    assert main(["artifacts", "verify", "--store", store_url]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1] == "2 artifacts checked (sizes), 2 problems"
    assert out[1].startswith(f"corpus:{V2}: manifest is not valid JSON")


def test_cli_reaches_an_s3_store_through_the_standard_aws_variables(moto_s3, tmp_path):
    """The documented way for processes that do not share ours (CLI, Prefect workers): endpoint and
    credentials from AWS_* variables, the store as `--store s3://bucket/prefix`."""
    url = moto_s3.new_url()
    make_store(url)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "FSSPEC_"))}
    env.update(AWS_ENDPOINT_URL=moto_s3.endpoint, AWS_ACCESS_KEY_ID="lexiflow-test",
               AWS_SECRET_ACCESS_KEY="lexiflow-test", AWS_DEFAULT_REGION="eu-west-1", HOME=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", "import sys; from flows.cli import main; sys.exit(main(sys.argv[1:]))",
                          "artifacts", "verify", "--full", "--store", url],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert (out.returncode, out.stdout.strip()) == (0, "2 artifacts checked (checksums), 0 problems"), out.stderr
