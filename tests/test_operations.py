"""Operations as a production user meets them (issue 26): Prefect settings in one place, the server
`lexiflow run` uses, device records, artifact selection and links, reports for people."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from lexiflow.flows import prefect_env

ROOT = Path(__file__).resolve().parents[1]


def test_prefect_settings_are_written_down_once_and_a_users_own_value_wins(tmp_path):
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    copies = [name for name in tracked.split() if name.endswith((".py", ".toml", "Makefile"))
              and name not in ("flows/prefect_env.py", "tests/test_operations.py") and (ROOT / name).is_file()
              and re.search(r"DO_NOT_TRACK|PREFECT_SERVER_ANALYTICS_ENABLED", (ROOT / name).read_text())]
    assert copies == [], "Prefect defaults belong in flows/prefect_env.py only"
    assert not (ROOT / "prefect.toml").exists()
    environ = {"DO_NOT_TRACK": "0"}
    prefect_env.apply(environ)
    assert environ["DO_NOT_TRACK"] == "0" and environ["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false"
    child = prefect_env.environment(tmp_path / "home", "http://127.0.0.1:1/api", {"CUDA_VISIBLE_DEVICES": ""})
    assert child["PREFECT_HOME"] == str(tmp_path / "home") and child["PREFECT_API_URL"] == "http://127.0.0.1:1/api"
    assert child["PREFECT_LOGGING_EXTRA_LOGGERS"] == "lexiflow" and child["CUDA_VISIBLE_DEVICES"] == ""


def test_a_slow_temporary_server_is_refused_in_one_line_naming_the_setting(tmp_path, monkeypatch, capsys):
    from lexiflow.flows import server
    from lexiflow.flows.cli import main

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv(server.STARTUP_SETTING, "1")  # no server answers that fast here
    assert main(["run", "--store", str(tmp_path / "store"), "--corpus", "builtin:lee"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: the temporary Prefect server did not answer within 1 s")
    assert f"raise {server.STARTUP_SETTING}" in err[0]
    assert server._temporary == {}  # and it was stopped


def test_a_first_run_into_a_store_starts_its_temporary_server_early_and_only_then(tmp_path, monkeypatch):
    """`prestart` (the overlap of the server's start-up with the run's imports) spawns only for a local store
    that is new or empty, with no server configured or served; `choose` stops an early server it then finds
    it does not need."""
    from lexiflow.flows import server

    spawned = []

    def spawn(home):  # a stand-in server process: `choose` must stop it
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        spawned.append(proc)
        server._temporary["http://127.0.0.1:1/api"] = (proc, time.monotonic(), home / "log")

    monkeypatch.setattr(server, "spawn_temporary", spawn)
    configured = {"url": None}  # the server Prefect's settings name (the environment, a profile, a context)
    monkeypatch.setattr(server, "user_api_url", lambda: configured["url"])
    home, used = tmp_path / "home", tmp_path / "used"
    home.mkdir()
    (used / "corpus").mkdir(parents=True)
    for store in (str(used), "s3://bucket/store"):
        server.prestart(home, store)
    assert spawned == []
    (home / server.SERVE_STATE).write_text("{}")  # a `lexiflow serve` from this home: its server is used
    server.prestart(home, str(tmp_path / "new"))
    assert spawned == []
    (home / server.SERVE_STATE).unlink()
    configured["url"] = "http://127.0.0.1:2/api"
    server.prestart(home, str(tmp_path / "new"))
    assert spawned == []
    configured["url"] = None
    (tmp_path / "empty").mkdir()
    for store in (tmp_path / "new", tmp_path / "empty"):
        server.prestart(home, str(store))
        assert len(spawned) == 1  # one at most
    # the user's server turns up (a Prefect profile, which only Prefect reads): the early one is stopped
    configured["url"] = "http://127.0.0.1:3/api"
    assert server.choose(home, say=print) == "http://127.0.0.1:3/api"
    assert server._temporary == {} and spawned[0].wait(10) is not None


def test_bad_parameters_found_after_the_early_start_stop_its_server_at_once(tmp_path, monkeypatch, capsys):
    from lexiflow.flows import server
    from lexiflow.flows.cli import main

    spawned = []

    def spawn(home):
        spawned.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))
        server._temporary["http://127.0.0.1:1/api"] = (spawned[-1], time.monotonic(), home / "log")

    monkeypatch.setattr(server, "spawn_temporary", spawn)
    monkeypatch.setattr(server, "user_api_url", lambda: None)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "home"))
    assert main(["run", "--store", str(tmp_path / "new"), "--set", "svd.dim=-1"]) == 2
    assert "svd.dim" in capsys.readouterr().err
    assert len(spawned) == 1 and server._temporary == {} and spawned[0].wait(10) is not None


WATCHED = """
import os, sys, time
from pathlib import Path
from lexiflow.flows import server
url = server.start_temporary(Path(sys.argv[1]), say=lambda line: None, timeout=300)
print(server._temporary[url][0].pid, flush=True)
time.sleep(600)
"""


@pytest.mark.slow
def test_the_temporary_server_dies_with_its_parent_even_on_kill_9(tmp_path):
    parent = subprocess.Popen([sys.executable, "-c", WATCHED, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                              env={k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"})
    try:
        child = int(parent.stdout.readline())
        assert Path(f"/proc/{child}").exists()
        parent.kill()  # SIGKILL: no atexit, no signal handler runs in the parent
        parent.wait()
        deadline = time.monotonic() + 60
        while Path(f"/proc/{child}").exists() and "Z" not in Path(f"/proc/{child}/stat").read_text().split()[2]:
            assert time.monotonic() < deadline, "the temporary server outlived its parent"
            time.sleep(0.5)
    finally:
        parent.kill()


def test_artifacts_of_one_kind_are_told_apart_and_selected_by_their_tag(tmp_path, capsys):
    import json

    from lexiflow.flows.cli import main
    from lexiflow.storage import ArtifactStore, Catalog

    store = ArtifactStore(tmp_path)
    for kind, version, metrics in (("tokenizer", "a" * 16, {"kind": "word"}), ("tokenizer", "b" * 16, {"kind": "bpe"}),
                                   ("embeddings", "c" * 16, {"method": "svd"}),
                                   ("embeddings", "d" * 16, {"method": "glove"})):
        with store.writer(kind, version) as out:
            out.write_json("config.json", {})
            out.metrics.update(metrics)
    catalog = Catalog(tmp_path)
    assert catalog.latest("tokenizer", kind="word")["version"] == "a" * 16
    assert catalog.latest("embeddings", method="svd")["version"] == "c" * 16
    assert catalog.latest("embeddings", method="sgns") is None
    assert main(["artifacts", "list", "--store", str(tmp_path)]) == 0
    rows = {line.split()[1]: line.split()[2] for line in capsys.readouterr().out.splitlines()}
    assert rows == {"a" * 16: "word", "b" * 16: "bpe", "c" * 16: "svd", "d" * 16: "glove"}
    assert main(["artifacts", "show", "tokenizer:word", "--store", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out)["version"] == "a" * 16
    assert main(["artifacts", "show", "embeddings:sgns", "--store", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == (f"error: no embeddings artifact with method=sgns in {tmp_path}; build "
                                               f"one: lexiflow run --store {tmp_path} --set 'embeddings=[\"sgns\"]'")


def _recording_progress(monkeypatch):
    """Every Progress update (name, n) and every close, however often the log lines are written."""
    from lexiflow.models import progress

    calls: list[tuple[str, float]] = []
    update, close = progress.Progress.update, progress.Progress.close
    monkeypatch.setattr(progress.Progress, "update", lambda self, n=1: (calls.append((self.name, n)), update(self, n)))
    monkeypatch.setattr(progress.Progress, "close", lambda self: (calls.append((self.name, "close")), close(self)))
    return calls


def test_glove_reports_progress_within_each_epoch(monkeypatch):
    import numpy as np
    import scipy.sparse as sp
    from lexiflow.models.glove import GloVe

    calls = _recording_progress(monkeypatch)
    rng = np.random.default_rng(0)
    counts = sp.coo_matrix(rng.integers(0, 3, (30, 30)).astype(np.float64))
    GloVe(dim=4, epochs=2, batch_size=16, negative=0).fit(counts)
    updates = [n for name, n in calls if name == "glove" and n != "close"]
    assert len(updates) == 2 * -(-counts.nnz // 16) and sum(updates) == 2 * counts.nnz  # one per batch


def test_svd_and_the_analogies_report_progress_with_rate_and_an_end(caplog):
    import logging

    import numpy as np
    import scipy.sparse as sp
    from lexiflow.models import evaluation, vectors
    from lexiflow.models.svd import svd_vectors

    seen: list[float | None] = []
    matrix = sp.random(300, 300, density=0.05, random_state=0, format="csr")
    with caplog.at_level(logging.INFO, logger="lexiflow"):
        svd_vectors(matrix, dim=8, n_iter=2, progress=seen.append)
    assert seen[-1] == 1.0
    assert any(r.name == "lexiflow.svd" and "100%" in r.message and "/s" in r.message for r in caplog.records)
    words = ["king", "queen", "man", "woman", "paris", "france", "rome", "italy"]
    kv = vectors.keyed_vectors(words, np.random.default_rng(0).normal(size=(8, 5)).astype(np.float32))
    seen.clear()
    evaluation.analogies(kv, questions=evaluation.read_analogies().head(200), batch=8, progress=seen.append)
    assert seen[-1] == 1.0


def test_a_hand_started_training_takes_missing_inputs_from_the_lineage_of_those_given(tmp_path):
    from lexiflow.flows.training import LM_TRAINERS, _resolve_inputs
    from lexiflow.storage import ArtifactStore

    store = ArtifactStore(tmp_path)
    for version in ("0" * 16, "1" * 16):  # the tokens' own tokenizer, then a newer one (the latest)
        with store.writer("tokenizer", version) as out:
            out.write_json("config.json", {})
    with store.writer("tokenized_corpus", "2" * 16, inputs={"tokenizer": store.ref("tokenizer", "0" * 16)}) as out:
        out.write_json("config.json", {})
    inputs = _resolve_inputs(LM_TRAINERS["lstm"], store.url, {"tokens": "2" * 16})
    assert inputs == {"tokens": store.ref("tokenized_corpus", "2" * 16), "tokenizer": store.ref("tokenizer", "0" * 16)}
    given = _resolve_inputs(LM_TRAINERS["lstm"], store.url, {"tokens": "2" * 16, "tokenizer": "1" * 16})
    assert given["tokenizer"].version == "1" * 16  # what the user names wins (the stage then says they disagree)
