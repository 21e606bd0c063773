"""Reliability figures: kill -9 crashes, concurrent runs, flaky storage, hostile inputs, fuzzing.

Each row is `ours` = survived (or passed), `peer` = tried, so the target is ratio 1. The same
machinery as tests/test_reliability.py (benchmarks/chaos.py), with bigger counts; the 200 MB single
line is measured here only (too slow for CI on two shared cores; CI runs 20 MB).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import Row

NAME = "reliability"


def _row(case: str, metric: str, ours: float, tried: float, notes: str = "") -> Row:
    return Row(NAME, case, metric, float(ours), float(tried), "tried", True, "ratio == 1", ours == tried, notes)


def _crash_and_concurrency(quick: bool, work: Path) -> list[Row]:
    from benchmarks.chaos import Zygote, concurrent_runs, crash_loop, neural_crash_loop, prefect_server

    kills = 3 if quick else 30
    rows = []
    with prefect_server(work / "prefect-home") as env, Zygote(env, work / "runs") as zygote:
        start = time.perf_counter()
        report = crash_loop(zygote, work / "crash", kills=kills, seed=1)
        rows.append(_row(f"kill -9 at random moments ({report.stores} stores, {report.runs_completed} completed "
                         "reruns)", "kills survived", report.kills_survived, report.kills_tried,
                         f"{time.perf_counter() - start:.0f} s; problems: {len(report.problems)}"))
        start = time.perf_counter()
        neural = neural_crash_loop(zygote, work / "neural-crash", kills=2 if quick else 8, seed=2)
        rows.append(_row(f"kill -9 during neural LM training (LSTM, {neural.total_steps} steps, checkpoints every 10; "
                         f"{neural.episodes} store(s))", "kills survived", neural.kills_survived, neural.kills_tried,
                         f"{time.perf_counter() - start:.0f} s; reruns resumed at steps {neural.resumed_at}, the "
                         f"completing rerun trained {neural.steps_trained[-1:]} steps; final weights vs uninterrupted "
                         f"run: max diff {neural.max_weight_diff:.1e}; problems: {len(neural.problems)}"))
        variants = [[], [], ["--set", "svd.dim=21"], ["--set", "vocabulary.min_count=3"]]
        rounds = 1 if quick else 2
        started = completed = problems = 0
        for i in range(rounds):
            result = concurrent_runs(zygote, work / f"concurrent-{i}", variants)
            started, completed, problems = started + result.started, completed + result.completed, \
                problems + len(result.problems)
        rows.append(_row(f"{rounds} × 4 runs at once on one store (2 same, 2 different parameters)",
                         "runs completed, store consistent", completed if not problems else 0, started,
                         f"problems: {problems}"))
        if not quick:
            rows += _flaky(env, work)
    return rows


def _flaky(env: dict[str, str], work: Path) -> list[Row]:
    import logging

    from lexiflow.flows.params import validate
    from lexiflow.flows.pipeline import run_pipeline
    from lexiflow.storage.faults import FlakyFileSystem, flaky_url
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from benchmarks.chaos import audit

    injected = survived = retries = 0
    seeds = (1, 2)

    class Count(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            nonlocal retries
            retries += "Retry " in record.getMessage()

    handler = Count()
    logging.getLogger("prefect.task_runs").addHandler(handler)
    try:
        with temporary_settings(updates={PREFECT_API_URL: env["PREFECT_API_URL"]}):
            for seed in seeds:
                FlakyFileSystem.stats.clear()
                folder = work / f"flaky-{seed}"
                params = validate({"store": flaky_url(str(folder), 0.15, seed, outage=0.02),
                                   "corpus": {"sources": ["builtin:lee"]}, "vocabulary": {"min_count": 2},
                                   "svd": {"dim": 20}, "evaluation": {"analogy_vocabulary": 500}})
                faults = 0
                try:
                    run_pipeline(params)
                    faults = FlakyFileSystem.stats["faults"]
                    ok = audit(folder) == []
                except Exception:  # noqa: BLE001 (a failure is the figure)
                    ok = False
                    faults = FlakyFileSystem.stats["faults"]
                injected += faults
                survived += faults if ok else 0
    finally:
        logging.getLogger("prefect.task_runs").removeHandler(handler)
    return [_row(f"flaky storage, {len(seeds)} pipeline runs (15% of operations fail, 2% start an 8-operation "
                 "outage)", "faults survived", survived, injected, f"{retries} stage retries by Prefect")]


def _hostile(quick: bool, work: Path) -> list[Row]:
    from lexiflow.models.errors import InputError
    from lexiflow.models.ingest import IngestOptions, build_corpus

    from benchmarks.hostile import BOMB_LIMIT, hostile_directory

    expected = hostile_directory(work / "hostile")
    handled = 0
    for name, message in expected.items():
        try:
            build_corpus([work / "hostile" / name], IngestOptions(max_file_bytes=BOMB_LIMIT))
        except InputError as exc:
            handled += message in str(exc) and "\n" not in str(exc) or name == "empty.txt"
        except Exception:  # noqa: BLE001, S112 (anything else is a failure, counted)
            continue
    rows = [_row(f"hostile input files ({len(expected)} kinds), one-line error naming the file/line",
                 "inputs handled", handled, len(expected))]
    if not quick:
        rows += _long_line(work)
    return rows


def _long_line(work: Path) -> list[Row]:
    """One 200 MB line, ingested in a child process: seconds and peak memory."""
    path = work / "long.txt"
    with path.open("w") as f:
        for _ in range(200):
            f.write("word Another. " * 74_899)  # ~1 MB of text per write, sentence breaks included
        f.write("\n")
    code = ("import resource, time; from pathlib import Path; from models.ingest import build_corpus, IngestOptions; "
            f"t = time.perf_counter(); c = build_corpus([Path({str(path)!r})], IngestOptions()); "
            "print(c.stats['documents'], time.perf_counter() - t, "
            "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1])
    size = path.stat().st_size
    if out.returncode != 0:
        return [_row("single 200 MB line", "inputs handled", 0, 1, out.stderr[-300:])]
    documents, seconds, peak = out.stdout.split()
    return [_row(f"single {size / 1e6:.0f} MB line (one document)", "inputs handled", int(documents == "1"), 1,
                 f"{float(seconds):.0f} s, peak memory {int(peak) / 1e9:.2f} GB ({int(peak) / size:.1f}× the line)")]


def _fuzz(quick: bool, work: Path) -> list[Row]:
    """The hypothesis properties of tests/test_fuzz.py, run by pytest with more examples."""
    report = work / "fuzz-examples.json"
    env = {**os.environ, "LEXIFLOW_FUZZ_EXAMPLES": "30" if quick else "500", "LEXIFLOW_FUZZ_REPORT": str(report)}
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_fuzz.py"],
                         cwd=Path(__file__).resolve().parents[1], env=env, capture_output=True, text=True)
    examples = json.loads(report.read_text()) if report.exists() else {}
    failures = [line.split("::")[-1].split(" ")[0] for line in out.stdout.splitlines() if line.startswith("FAILED")]
    properties = len(examples) or 1
    return [_row(f"hypothesis properties ({len(examples)}) on CoNLL-U, MediaWiki, JSONL, any-file ingestion, "
                 "normalizer/sentences/pre-tokenizer, vocabulary, BPE/WordPiece", "fuzz examples passed",
                 sum(examples.values()) * (properties - len(failures)) // properties, sum(examples.values()),
                 "; ".join(failures) or "no failing property")]


def run(quick: bool = False) -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="lexiflow-reliability-") as tmp:
        work = Path(tmp)
        rows = _hostile(quick, work)
        rows += _fuzz(quick, work)
        rows += _crash_and_concurrency(quick, work)
    return rows
