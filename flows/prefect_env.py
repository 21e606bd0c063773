"""The Prefect settings lexiflow runs with, in one place: quiet, offline and reproducible.

Every entry point applies them as defaults (a value the user set wins): the `lexiflow` CLI
(`apply()` before Prefect is imported), the processes `lexiflow serve` starts (`environment()`),
the test suite (tests/conftest.py) and the chaos harness (tests/chaos.py). No `prefect.toml` is
needed; a deployment's runs inherit these values from the worker that starts them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from pathlib import Path

# Why each: no connection leaves the machine (analytics, DO_NOT_TRACK; offline an ERROR line about
# telemetry appears without both); Prefect's 20 s ephemeral start-up is too tight on 2 busy cores;
# lexiflow's progress lines reach run logs; progress logged outside a flow (lexiflow tag) is no error.
DEFAULTS: dict[str, str] = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "PREFECT_SERVER_UI_SHOW_PROMOTIONAL_CONTENT": "false",
    "PREFECT_LOGGING_EXTRA_LOGGERS": "lexiflow",
    "PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW": "ignore",
}
HOME = ".prefect"  # PREFECT_HOME when unset: a private database beside the work, not ~/.prefect


def default_home() -> Path:
    return Path(os.environ.get("PREFECT_HOME") or HOME).resolve()


def apply(environ: MutableMapping[str, str] = os.environ) -> None:
    """Set every default the environment does not set (call before Prefect is imported)."""
    for key, value in {**DEFAULTS, "PREFECT_HOME": str(Path(HOME).resolve())}.items():
        environ.setdefault(key, value)


def environment(home: str | os.PathLike[str], api_url: str | None = None,
                extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a Prefect process lexiflow starts: this one's, the defaults where unset,
    its own PREFECT_HOME and server (none: the child picks its own), then `extra`."""
    env = dict(os.environ)
    apply(env)
    env["PREFECT_HOME"] = str(home)
    env.pop("PREFECT_API_URL", None)
    if api_url:
        env["PREFECT_API_URL"] = api_url
    return {**env, **(extra or {})}
