"""One-box operation: `lexiflow serve` starts a Prefect server on 127.0.0.1, creates the `cpu` and
`gpu` work pools, deploys (deployments/definitions.py), and starts one CPU worker and one GPU
worker per listed GPU (each with its own `CUDA_VISIBLE_DEVICES`). `lexiflow serve --stop` stops
exactly those processes, by PID.

What was started is recorded in `<PREFECT_HOME>/lexiflow-serve.json`: each process's PID and its
start time in clock ticks since boot (from /proc), so `--stop` never signals a process that merely
reuses a PID. Stopping sends SIGTERM, a second SIGTERM after a grace period (a Prefect worker may
hang on the first), and SIGKILL as a last resort; workers go first, the server last.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict
from pathlib import Path
from typing import Any

from lexiflow.deployments.definitions import DeployConfig, check, deploy
from lexiflow.deployments.serve_state import SERVE_STATE, Started, free_port, is_running, read_state, start_ticks
from lexiflow.flows.prefect_env import environment
from lexiflow.models.device import gpu_warning


class ServeError(Exception):
    """Something the user can act on: a port in use, a server that did not come up, a stale state file."""


def wait_healthy(api_url: str, timeout: float = 120.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ServeError(f"the Prefect server exited with status {proc.returncode} before it was healthy")
        try:
            with urllib.request.urlopen(f"{api_url}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise ServeError(f"the Prefect server at {api_url} was not healthy after {timeout:.0f} s")


def _spawn(name: str, argv: list[str], env: dict[str, str], home: Path) -> tuple[Started, subprocess.Popen]:
    log = home / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        # A new session: the processes outlive `lexiflow serve` and ignore its terminal's Ctrl-C.
        proc = subprocess.Popen(argv, env=env, cwd=home, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    ticks = start_ticks(proc.pid)
    return Started(name, proc.pid, ticks if ticks is not None else -1, str(log)), proc


def _note(home: Path, name: str, line: str) -> None:
    log = home / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a", encoding="utf-8") as out:
        out.write(line + "\n")


def _prefect() -> list[str]:
    return [sys.executable, "-m", "prefect"]


def start(home: str | os.PathLike[str], config: DeployConfig, *, port: int | None = None,
          gpus: list[str] | None = None, cpu_limit: int = 2, worker_poll_seconds: float = 5.0,
          startup_timeout: float = 120.0) -> dict[str, Any]:
    """Start server, pools, deployments and workers; returns the recorded state (urls, processes)."""
    check(config)  # a bad --cron or parameter fails now, not after the server has started
    home = Path(home).resolve()
    state = read_state(home)
    if state and any(is_running(Started(**p)) for p in state["processes"]):
        raise ServeError(f"lexiflow serve is already running from {home} ({state['ui_url']}); "
                         f"stop it first with `lexiflow serve --stop --home {home}`")
    if port:  # else the health check below could find another server already on that port, and deploy there
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port))
        except OSError as exc:
            raise ServeError(f"port {port} on 127.0.0.1 is in use ({exc.strerror}): pick another --port, or leave "
                             f"it out for a free one") from None
    home.mkdir(parents=True, exist_ok=True)  # only now: a refused start leaves no folder behind
    port = port or free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    state = {"home": str(home), "api_url": api_url, "ui_url": f"http://127.0.0.1:{port}", "processes": []}
    started: list[Started] = []

    def record(proc: Started) -> None:
        started.append(proc)
        state["processes"] = [asdict(p) for p in started]
        (home / SERVE_STATE).write_text(json.dumps(state, indent=2))  # written at once: --stop can always clean up

    try:
        env = environment(home, api_url)
        server, popen = _spawn("server", [*_prefect(), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                               env, home)
        record(server)
        wait_healthy(api_url, startup_timeout, popen)
        state["deployments"] = deploy_to(api_url, config)
        worker_env = {"PREFECT_WORKER_QUERY_SECONDS": str(worker_poll_seconds),
                      "PREFECT_WORKER_PREFETCH_SECONDS": str(max(worker_poll_seconds, 1.0))}
        record(_spawn("worker-cpu", [*_prefect(), "worker", "start", "--pool", config.cpu_pool, "--type", "process",
                                     "--name", f"cpu-{socket.gethostname()}", "--limit", str(cpu_limit)],
                      environment(home, api_url, {**worker_env, "CUDA_VISIBLE_DEVICES": ""}), home)[0])
        state["warnings"] = []
        for gpu in gpus or ["0"]:
            if warning := gpu_warning({"CUDA_VISIBLE_DEVICES": gpu}):
                state["warnings"].append(f"worker-gpu{gpu}: {warning}")
                _note(home, f"worker-gpu{gpu}", f"lexiflow serve: warning: {warning}")  # first line of its log
            record(_spawn(f"worker-gpu{gpu}", [*_prefect(), "worker", "start", "--pool", config.gpu_pool, "--type",
                                               "process", "--name", f"gpu{gpu}-{socket.gethostname()}",
                                               "--limit", "1"],
                          environment(home, api_url, {**worker_env, "CUDA_VISIBLE_DEVICES": gpu}), home)[0])
        (home / SERVE_STATE).write_text(json.dumps(state, indent=2))
    except BaseException:
        stop(home)
        raise
    return state


def deploy_to(api_url: str, config: DeployConfig) -> dict[str, str]:
    """Pools and deployments on the server at `api_url`, whatever this process's Prefect settings."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: api_url}):
        return deploy(config)


def _signal_and_wait(proc: Started, sig: int, wait: float) -> bool:
    """Send `sig` if it is still our process; True once it is gone."""
    if not is_running(proc):
        return True
    try:
        os.kill(proc.pid, sig)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        _reap(proc.pid)
        if not is_running(proc):
            return True
        time.sleep(0.2)
    return False


def _reap(pid: int) -> None:
    """Collect our own child's exit status (when serve and stop run in one process, as in tests)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def stop(home: str | os.PathLike[str], grace: float = 15.0) -> list[str]:
    """Stop what `start` recorded in `home`, by PID; returns one line per process."""
    home = Path(home).resolve()
    state = read_state(home)
    if state is None:
        return []
    lines = []
    for proc in reversed([Started(**p) for p in state["processes"]]):  # workers first, the server last
        if not is_running(proc):
            lines.append(f"{proc.name} (pid {proc.pid}): not running")
            continue
        how = next((name for sig, name, wait in ((signal.SIGTERM, "SIGTERM", grace),
                                                 (signal.SIGTERM, "second SIGTERM", grace),
                                                 (signal.SIGKILL, "SIGKILL", 5.0))
                    if _signal_and_wait(proc, sig, wait)), None)
        lines.append(f"{proc.name} (pid {proc.pid}): " + (f"stopped ({how})" if how else "still running!"))
    if not any(line.endswith("still running!") for line in lines):
        (home / SERVE_STATE).unlink(missing_ok=True)
    return lines
