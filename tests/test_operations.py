"""Operations as a production user meets them (issue 26): Prefect settings in one place, the server
`lexiflow run` uses, device records, artifact selection and links, reports for people."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

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
