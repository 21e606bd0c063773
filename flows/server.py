"""The Prefect server a `lexiflow run` reports to, and the temporary one it starts when there is none.

In order: the server in `PREFECT_API_URL` (configured by the user); the server of a `lexiflow serve`
running from the same `PREFECT_HOME` (its runs then show in that UI); else a temporary server, started
here, that lives as long as this process (`lexiflow run` asks for one only when a stage must run:
`running` says whether there is a server without starting one). Its start-up (about 18 s on 2 cores, most of
it importing Prefect's server) can overlap the run's own imports and checks (about 20 s): `prestart` starts it
without waiting, on a first run into a store, where every stage must run; `choose` then waits for it, or
stops it unused when it finds the user's server. Prefect's own temporary server would
outlive a killed parent (re-parented to PID 1, one leaked server per kill) and end a slow start in a
RuntimeError traceback; this one is tied to its parent three ways: SIGTERM when the parent dies (Linux
`PR_SET_PDEATHSIG`, set by the child itself, so no `preexec_fn`), a watchdog thread for other systems, and
a stop at exit.
A slow start prints a progress line every 15 s and gives up with one line naming the setting to raise.

`python -m lexiflow.flows.server PARENT_PID uvicorn-arguments...` is the child's entry point.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from lexiflow.deployments.serve_state import SERVE_STATE, Started, free_port, is_running, read_state
from lexiflow.models.errors import LexiflowError

STARTUP_SETTING = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"  # Prefect's own name for this wait
_PR_SET_PDEATHSIG = 1
_temporary: dict[str, tuple[subprocess.Popen, float, Path]] = {}  # api url -> server, start time, log


class ServerError(LexiflowError):
    """The temporary server did not start: the message names the setting to raise or the log to read."""


def healthy(api_url: str, timeout: float = 5.0) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def serve_api_url(home: Path) -> str | None:
    """The API of a `lexiflow serve` running from `home` whose server answers, else None."""
    try:
        state = read_state(home)
    except LexiflowError:
        return None  # a damaged state file: `serve` itself reports it
    if not state or not any(p["name"] == "server" and is_running(Started(**p))
                            for p in state["processes"]):
        return None
    return state["api_url"] if healthy(state["api_url"]) else None


def user_api_url() -> str | None:
    """The user's server: the environment, a Prefect profile, or a settings context (a test harness)."""
    from prefect.settings import get_current_settings

    return os.environ.get("PREFECT_API_URL") or get_current_settings().api.url


def running(home: Path) -> str | None:
    """The API URL of a server a run can report to without starting one: the user's, or a `lexiflow serve`'s."""
    return user_api_url() or serve_api_url(home)


def choose(home: Path, say: Callable[[str], None]) -> str:
    """The API URL the run reports to (see the module docstring); starts a temporary server if needed."""
    if url := user_api_url():
        stop_temporary()  # one `prestart` began: not needed
        return url
    if url := serve_api_url(home):
        stop_temporary()
        say(f"Using the Prefect server of `lexiflow serve` ({url.removesuffix('/api')}): this run shows in its UI")
        return url
    if _temporary:
        return wait_until_healthy(next(iter(_temporary)), say)
    return start_temporary(home, say)


def prestart(home: Path, store: str) -> None:
    """Start the temporary server now, without waiting for it, when `store` is a local folder that does not
    exist yet or is empty (every stage will run) and no server is configured or served from `home`.
    Cheap: Prefect's own settings (a profile's or a settings context's server) are read only when Prefect is
    imported already; else `choose` finds them, and stops this server."""
    folder = Path(store)
    fresh = "://" not in store and (not folder.exists() or (folder.is_dir() and not any(folder.iterdir())))
    configured = user_api_url() if "prefect.settings" in sys.modules else os.environ.get("PREFECT_API_URL")
    if fresh and not _temporary and not configured and not (home / SERVE_STATE).exists():
        spawn_temporary(home)


def start_temporary(home: Path, say: Callable[[str], None], timeout: float | None = None) -> str:
    """A temporary server on a free loopback port (database and log in `home`), stopped when this process
    ends however it ends; its API URL once it answers."""
    return wait_until_healthy(spawn_temporary(home), say, timeout)


def spawn_temporary(home: Path) -> str:
    """Start a temporary server (see `start_temporary`) and return its API URL at once."""
    from lexiflow.flows import prefect_env

    port = free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    log = home / "logs" / "temporary-server.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    # What Prefect's own temporary server runs: the API without the UI, on uvicorn. Prefect's folder is
    # found without importing Prefect (seconds the server then overlaps).
    prefect_dir = Path(next(iter(importlib.util.find_spec("prefect").submodule_search_locations)))
    argv = [sys.executable, "-m", "lexiflow.flows.server", str(os.getpid()), "--app-dir",
            str(prefect_dir.parent), "--factory", "prefect.server.api.server:create_app",
            "--host", "127.0.0.1", "--port", str(port), "--log-level", "error", "--lifespan", "on"]
    env = prefect_env.environment(home, extra={"PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
                                               "PREFECT__SERVER_FINAL": "1"})
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    _temporary[api_url] = (proc, time.monotonic(), log)
    atexit.register(stop_temporary)
    return api_url


def wait_until_healthy(api_url: str, say: Callable[[str], None], timeout: float | None = None) -> str:
    """`api_url` once its temporary server answers; stopped, with one line, if it exits first or takes longer
    than `timeout` (PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS) from its start."""
    timeout = float(timeout if timeout is not None else os.environ.get(STARTUP_SETTING, "120"))
    proc, started, log = _temporary[api_url]
    next_line = started + 15
    while not healthy(api_url, timeout=2):
        waited = time.monotonic() - started
        if proc.poll() is not None:
            stop_temporary()
            raise ServerError(f"the temporary Prefect server exited with status {proc.returncode} before it "
                              f"answered; see {log}")
        if waited > timeout:
            stop_temporary()
            raise ServerError(f"the temporary Prefect server did not answer within {timeout:.0f} s (a busy "
                              f"machine): raise {STARTUP_SETTING} (e.g. {STARTUP_SETTING}={int(timeout * 3)}), "
                              f"or start one with `lexiflow serve` and run again")
        if time.monotonic() >= next_line:
            say(f"waiting for the temporary Prefect server to start: {waited:.0f} s of at most {timeout:.0f} s "
                f"({STARTUP_SETTING})")
            next_line += 15
        time.sleep(0.25)
    return api_url


def stop_temporary() -> None:
    """Stop the temporary servers this process started (SIGTERM, then SIGKILL after 10 s)."""
    while _temporary:
        _, (proc, *_) = _temporary.popitem()
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _die_with(parent: int) -> None:
    """In the server: SIGTERM to this process when `parent` dies (kill -9 included)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)  # Linux

    def watch() -> None:  # other systems (and a parent that died before prctl): poll for re-parenting
        while os.getppid() == parent:
            time.sleep(1)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


if __name__ == "__main__":
    _die_with(int(sys.argv[1]))
    import runpy

    sys.argv = ["uvicorn", *sys.argv[2:]]
    runpy.run_module("uvicorn", run_name="__main__", alter_sys=True)
