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


WATCHED = """
import os, sys, time
from pathlib import Path
from lexiflow.flows import server
url = server.start_temporary(Path(sys.argv[1]), say=lambda line: None, timeout=300)
print(server._temporary[url].pid, flush=True)
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
    assert capsys.readouterr().err.strip() == f"error: no embeddings artifact with method=sgns in {tmp_path}"
