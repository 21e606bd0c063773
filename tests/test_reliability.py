"""Crashes, concurrent runs, flaky storage and hostile input through the whole pipeline, against
one real Prefect server shared by this module's child processes (see benchmarks/chaos.py).

Whatever stages `pipeline` runs are covered: the runs go through `lexiflow run`, and the checks
read the store's manifests, not a list of stages.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
from lexiflow.storage import ArtifactStore, Catalog
from lexiflow.tasks.corpus import ingest_corpus
from prefect import flow

from benchmarks.chaos import (
    SMALL_RUN,
    Zygote,
    audit,
    concurrent_runs,
    crash_loop,
    neural_crash_loop,
    prefect_server,
)
from benchmarks.hostile import hostile_directory

pytestmark = [pytest.mark.prefect, pytest.mark.slow]
KILLS = int(os.environ.get("LEXIFLOW_CRASH_KILLS", "20"))
NEURAL_KILLS = int(os.environ.get("LEXIFLOW_NEURAL_KILLS", "2"))
FAULT_RATE, OUTAGE_RATE, FAULT_SEED = 0.15, 0.02, 3


@pytest.fixture(scope="module")
def server_env(tmp_path_factory):
    with prefect_server(tmp_path_factory.mktemp("prefect-home")) as env:
        yield env


@pytest.fixture(scope="module")
def zygote(server_env, tmp_path_factory):
    with Zygote(server_env, tmp_path_factory.mktemp("runs")) as z:
        yield z


def test_prefect_server_listens_on_loopback_only(server_env):
    """Servers bind to 127.0.0.1 unless configured otherwise: the one lexiflow's tests start, and
    Prefect's default for `prefect server start` / the ephemeral server."""
    from prefect.settings import get_current_settings

    assert get_current_settings().server.api.host == "127.0.0.1"
    port = int(server_env["PREFECT_SERVER_PORT"])
    listening = listening_addresses(port)
    assert listening == {"127.0.0.1"}, listening


def listening_addresses(port: int) -> set[str]:
    """IPv4/IPv6 addresses with a socket listening on `port` (from /proc/net/tcp*)."""
    found = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        if not os.path.exists(table):
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, port_hex = local.split(":")
            if state == "0A" and int(port_hex, 16) == port:  # 0A: LISTEN
                if width == 8:
                    found.add(".".join(str(b) for b in reversed(bytes.fromhex(address))))
                else:
                    found.add("::" if set(address) == {"0"} else address)
    return found


def test_kill_9_at_random_moments_leaves_only_complete_artifacts(zygote, tmp_path):
    report = crash_loop(zygote, tmp_path, kills=KILLS, seed=20)
    print(f"crash test: {report}")
    assert report.problems == []
    assert report.kills_tried >= KILLS and report.kills_survived == report.kills_tried
    assert report.runs_completed >= 2  # the calibration run and at least one rerun after kills
    # The kills struck at different points: before the first artifact and after several.
    assert len({k.split(",")[0] for k in report.kill_stages}) >= 3, report.kill_stages
    # Staging folders of killed writers are invisible to readers and removable afterwards.
    for store in tmp_path.glob("store-*"):
        ArtifactStore(str(store)).clean_staging()
        assert not any((store / ".staging").iterdir()) if (store / ".staging").exists() else True
        assert audit(store) == []


def test_kill_9_during_neural_lm_training_resumes_from_the_last_checkpoint(zygote, tmp_path):
    report = neural_crash_loop(zygote, tmp_path, kills=NEURAL_KILLS, seed=5)
    print(f"neural crash test: {report}")
    assert report.problems == []
    assert report.kills_tried == NEURAL_KILLS and report.kills_survived == report.kills_tried
    # Each rerun resumed at the checkpoint the kill left (a later one each time) ...
    assert len(report.resumed_at) == NEURAL_KILLS and 0 < report.resumed_at[0] < report.resumed_at[-1] \
        or NEURAL_KILLS == 1
    # ... the completing rerun trained only the remaining steps ...
    assert report.steps_trained[-1] == report.total_steps - report.resumed_at[-1] < report.total_steps
    # ... and ended where the uninterrupted run did (same version; weights equal to float tolerance).
    assert report.max_weight_diff <= 1e-5


def test_four_concurrent_runs_on_one_store(zygote, tmp_path):
    store = tmp_path / "store"
    variants = [[], [], ["--set", "svd.dim=21"], ["--set", "vocabulary.min_count=3"]]
    report = concurrent_runs(zygote, store, variants)
    assert report.problems == [] and report.completed == report.started == 4
    kinds = {}
    for kind, version in Catalog(str(store)).entries():
        kinds.setdefault(kind, []).append(version)
    # Same inputs → one artifact; svd.dim 21 → a second embeddings and evaluation; min_count 3 →
    # a second tokenizer and everything downstream of it.
    assert len(kinds["corpus"]) == 1 and len(kinds["tokenizer"]) == 2 and len(kinds["embeddings"]) == 3
    assert_no_pickle(store)


def assert_no_pickle(store: Path) -> None:
    """Every file in the store is an open format: Parquet, JSON, text/markdown, word2vec binary or safetensors,
    and Arrow IPC for the pieces' partial results (docs/design.md, "Incremental rebuilds")."""
    allowed = {".parquet", ".json", ".md", ".txt", ".bin", ".safetensors", ".png", ".arrow"}
    files = [p for p in store.rglob("*") if p.is_file() and ".staging" not in p.parts]
    assert files
    for path in files:
        assert path.suffix in allowed, path
        head = path.read_bytes()[:2]
        assert not (head[:1] == b"\x80" and head[1:2] in {b"\x02", b"\x03", b"\x04", b"\x05"}), f"pickle: {path}"
        if path.suffix == ".parquet":
            assert path.read_bytes()[:4] == b"PAR1"


@pytest.fixture
def api(server_env):
    """This process talks to the module's Prefect server too (for the in-process runs below)."""
    from prefect.logging.handlers import APILogHandler
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: server_env["PREFECT_API_URL"]}):
        yield
        APILogHandler().flush()  # send this test's run logs while the server is still up


class Messages(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def small_params(store: str, **corpus):
    from lexiflow.flows.params import validate

    return validate({"store": store, "corpus": {"sources": ["builtin:lee"], **corpus}, "vocabulary": {"min_count": 2},
                     "svd": {"dim": 20}, "embeddings": ["svd"], "lm": ["ngram"],
                     "evaluation": {"analogy_vocabulary": 500, "projection_words": 0}})


def test_flaky_storage_pipeline_completes_through_retries(api, tmp_path):
    from lexiflow.flows.pipeline import run_pipeline
    from lexiflow.storage.faults import FlakyFileSystem, flaky_url

    FlakyFileSystem.stats.clear()
    url = flaky_url(str(tmp_path / "store"), fail=FAULT_RATE, seed=FAULT_SEED, outage=OUTAGE_RATE)
    task_log = Messages()
    logging.getLogger("prefect.task_runs").addHandler(task_log)
    try:
        refs = run_pipeline(small_params(url))
    finally:
        logging.getLogger("prefect.task_runs").removeHandler(task_log)
    stats = dict(FlakyFileSystem.stats)
    task_retries = sum("Retry " in m for m in task_log.messages)
    print(f"flaky storage: {stats}, task retries {task_retries}")
    # Faults struck reads and writes; most were absorbed by the store's own retries of single
    # operations, some exhausted those and failed a whole stage attempt, which Prefect retried.
    assert stats["faults"] >= 10, stats
    assert stats.get("faults_put", 0) + stats.get("faults_write", 0) >= 1
    assert stats.get("faults_read", 0) + stats.get("faults_open", 0) >= 1
    assert task_retries >= 1, task_log.messages
    # Everything the run returned is published and sound, read back without faults.
    clean = ArtifactStore(str(tmp_path / "store"))
    for ref in refs.values():
        assert clean.verify(ref.kind, ref.version, full=True) == []
    assert audit(tmp_path / "store") == []
    assert {ref.kind for ref in refs.values()} == set(Catalog(clean).kinds())


def test_bad_input_is_not_retried_and_transient_errors_are(api, tmp_path, monkeypatch):
    from lexiflow.models import ingest
    from lexiflow.models.errors import InputError
    from lexiflow.storage.faults import flaky_url
    from lexiflow.tasks.params import CorpusParams

    real_build = ingest.ingest_shard
    calls, transient_failures = [], []

    def build(*args, **kwargs):
        calls.append(1)
        if transient_failures:
            raise transient_failures.pop()
        return real_build(*args, **kwargs)

    monkeypatch.setattr(ingest, "ingest_shard", build)

    @flow
    def ingest_flow(store, corpus):  # the corpus stage alone, in a flow
        return ingest_corpus(store, params=corpus)

    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine\nnot \xff utf-8\n")
    url = flaky_url(str(tmp_path / "store"), fail=0.0)
    with pytest.raises(InputError, match=r"bad.txt:2: invalid UTF-8"):
        ingest_flow(url, CorpusParams(sources=[str(bad)]))
    assert len(calls) == 1  # deterministic: failed once, no retry
    assert Catalog(str(tmp_path / "store")).entries() == []

    calls.clear()
    transient_failures.extend([TimeoutError("simulated storage timeout"), OSError(5, "simulated I/O error")])
    good = tmp_path / "good.txt"
    good.write_text("one line of text\nanother line\n")
    ref = ingest_flow(url, CorpusParams(sources=[str(good)]))
    assert len(calls) == 3  # two timeouts retried, the third attempt published
    assert ArtifactStore(str(tmp_path / "store")).verify(ref.kind, ref.version, full=True) == []


def test_a_flow_reads_the_store_through_an_outage(api, tmp_path, monkeypatch):
    # The pipeline flow reads the corpus manifest itself (which sources were skipped). A flow body
    # has no retries: an outage longer than the store's own retries of one operation failed the
    # whole run there (the flaky-storage pipeline above met it). Those reads retry as stages do.
    from lexiflow.tasks.stage import published_manifest
    from prefect import flow

    store = ArtifactStore(str(tmp_path / "store"))
    with store.writer("corpus", "0123456789abcdef") as out:
        out.metrics["skipped"] = []
    real_manifest, outage = ArtifactStore.manifest, [TimeoutError("outage")] * 2

    def manifest(self, kind, version):  # its own retries used up: the outage outlasts them
        if outage:
            raise outage.pop()
        return real_manifest(self, kind, version)

    monkeypatch.setattr(ArtifactStore, "manifest", manifest)

    @flow
    def reads(version: str) -> dict | None:
        return published_manifest(store.ref("corpus", version))

    assert reads("0123456789abcdef")["metrics"] == {"skipped": []} and outage == []
    assert reads("f" * 16) is None  # not published


def test_hostile_directory_through_the_cli(zygote, tmp_path):
    """Default policy: the first bad file stops the run with one line, no traceback, no artifact.
    `corpus.bad_files=skip`: every bad file is skipped and listed in the corpus stats; the run completes."""
    expected = hostile_directory(tmp_path / "hostile")
    store = tmp_path / "store"
    small = [a for a in SMALL_RUN if a != "builtin:lee" and a != "--corpus"]
    run = zygote.start(["run", "--store", str(store), "--corpus", str(tmp_path / "hostile"), *small,
                        "--set", "corpus.max_file_bytes=33554432"])
    assert run.wait() == 2
    output = run.output()
    assert "Traceback" not in output
    errors = [line for line in output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "binary.txt: looks like a binary file" in errors[0]  # files are read in name order
    assert Catalog(str(store)).entries() == [] and audit(store) == []

    good = tmp_path / "hostile" / "good.txt"
    good.write_text("\n".join(f"The cat number {i} sat on the mat. A dog {i % 7} barked." for i in range(300)))
    run = zygote.start(["run", "--store", str(store), "--corpus", str(tmp_path / "hostile"), *small,
                        "--set", "corpus.max_file_bytes=33554432", "--set", "corpus.bad_files=skip",
                        "--set", "vocabulary.min_count=1"])
    assert run.wait() == 0, run.output()[-3000:]
    assert "Traceback" not in run.output()
    corpus = Catalog(str(store)).latest("corpus")["metrics"]
    assert corpus["skipped_inputs"] == len(expected) and corpus["documents"] > 0
    reasons = {Path(s["source"]).name: s["reason"] for s in corpus["skipped"]}
    assert set(reasons) == set(expected)
    for name, message in expected.items():
        assert message in reasons[name] and "\n" not in reasons[name], (name, reasons[name])
    assert audit(store) == []
    print(json.dumps({"hostile_inputs": len(expected)}))
