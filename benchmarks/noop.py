"""What a run that has nothing to do costs, as a user meets it: `lexiflow --help`, then `lexiflow run` cold into
a new store (its temporary Prefect server included) and again on the fully cached store, each a fresh process
of the installed command, the cached run and `--help` repeated (minimum and median). Targets (issue 61):
`--help` <= 1 s; the cached run <= 3 s and <= 10 % of the cold one.

Options: `repeats=N` (default 5), `corpus=SOURCE` (default: the pipeline's, builtin:enwiki; --quick: builtin:lee
with small settings).
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import Row

QUICK = ["--corpus", "builtin:lee", "--set", "svd.dim=50", "--set", 'embeddings=["svd"]', "--set", "lm=[]"]


def _command() -> list[str]:
    """The installed `lexiflow` beside this interpreter (what `make run` runs), else the CLI module."""
    script = Path(sys.executable).with_name("lexiflow")
    return [str(script)] if script.exists() else [sys.executable, "-m", "lexiflow.flows.cli"]


def _timed(argv: list[str], cwd: str, env: dict[str, str]) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr[-2000:]}")
    return seconds, done.stdout


def _summary(stdout: str) -> str:
    """The run's summary from "Artifacts in" on: what a cached run must print alike."""
    return stdout[stdout.find("Artifacts in"):]


def run(quick: bool = False, repeats: int | str = 5, corpus: str = "") -> list[Row]:
    repeats = int(repeats)
    lexiflow = _command()
    options = QUICK if quick else (["--corpus", corpus] if corpus else [])
    case = "builtin:lee, svd only, no LM" if quick else f"{corpus or 'builtin:enwiki'}, default parameters"
    with tempfile.TemporaryDirectory(prefix="noop-bench-") as work:
        env = {**os.environ, "PREFECT_HOME": str(Path(work) / "prefect")}  # no server of the user's, none running
        env.pop("PREFECT_API_URL", None)
        env.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "600")  # a busy machine: slow, not failed
        helps = [_timed([*lexiflow, "--help"], work, env)[0] for _ in range(repeats)]
        argv = [*lexiflow, "run", "--store", str(Path(work) / "store"), *options]
        cold, first = _timed(argv, work, env)
        cached = []
        for _ in range(repeats):
            seconds, stdout = _timed(argv, work, env)
            if _summary(stdout) != _summary(first):
                raise RuntimeError(f"the cached run printed another summary:\n{stdout}\n---\n{first}")
            cached.append(seconds)
        shutil.rmtree(Path(work) / "store", ignore_errors=True)
    load = os.getloadavg()[0]
    note = f"min of {repeats}, median {{:.2f}} s; load {load:.1f} on {os.cpu_count()} cores"
    return [
        Row("noop", "lexiflow --help", "seconds", min(helps), None, "", False, "<= 1", min(helps) <= 1,
            note.format(statistics.median(helps))),
        Row("noop", case, "cold run seconds", cold, None, "", False, "", None, f"one run; load {load:.1f}"),
        Row("noop", case, "cached run seconds", min(cached), cold, "cold run", False, "<= 3 and ratio <= 0.1",
            min(cached) <= 3 and min(cached) <= 0.1 * cold, note.format(statistics.median(cached))),
    ]
