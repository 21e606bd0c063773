"""What `lexiflow serve` started (deployments/serve.py), as a run looking for its server reads it
(flows/server.py): the state file `<PREFECT_HOME>/lexiflow-serve.json`, each process's PID and start time in
clock ticks since boot (from /proc), so a process that merely reuses a PID is never taken for it. Both import
this module, which imports neither of them (nor Prefect): the standard library and lexiflow's errors only.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lexiflow.models.errors import InputError

SERVE_STATE = "lexiflow-serve.json"  # what `lexiflow serve` started, in its PREFECT_HOME


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class Started:
    name: str
    pid: int
    start_ticks: int
    log: str


def start_ticks(pid: int) -> int | None:
    """The process's start time (clock ticks since boot), or None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])  # field 22 of proc(5), counted after the command name


def is_running(proc: Started) -> bool:
    ticks = start_ticks(proc.pid)
    if ticks is None or ticks != proc.start_ticks:
        return False
    state = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state != "Z"


def read_state(home: Path) -> dict[str, Any] | None:
    path = home / SERVE_STATE
    if not path.exists():
        return None
    try:
        state = json.loads(path.read_text())
        for record in state["processes"]:
            Started(**record)  # raises on a record that does not name a process
    except (ValueError, KeyError, TypeError) as exc:
        raise InputError(f"{path} is damaged ({type(exc).__name__}: {exc}), so the processes it recorded are "
                         "unknown: stop any `prefect server` / `prefect worker` left running (see `ps`), "
                         "then delete the file") from None
    return state
