"""The benchmark harness: run one benchmark module, append its rows to the results table.

A benchmark is a module `benchmarks/<name>.py` with `run(quick: bool) -> list[Row]`. Each row
compares our figure with a peer's measured in the same run (`ratio = ours / peer`) and may state
a target. Rows are appended, with machine info and git revision, to
`benchmarks/results/<name>.parquet`; `benchmarks/results/<name>.md` is regenerated from it.
`--quick` runs write to a scratch folder instead, so smoke runs never mix with real figures.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import polars as pl

RESULTS_DIR = Path(__file__).parent / "results"
SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@dataclass
class Row:
    benchmark: str
    case: str  # what was measured, e.g. "window 5, 10M tokens"
    metric: str  # e.g. "tokens/s", "seconds", "WS353 spearman"
    ours: float
    peer: float | None = None
    peer_name: str = ""
    higher_is_better: bool = True
    target: str = ""  # e.g. ">= 5e6" or "ratio <= 3"
    met: bool | None = None
    notes: str = ""

    @property
    def ratio(self) -> float | None:
        return None if not self.peer else self.ours / self.peer


def machine_info() -> dict[str, str]:
    info = {
        "machine": f"{platform.machine()} {os.cpu_count()} cpus",
        "python": platform.python_version(),
    }
    try:
        import torch

        info["torch"] = torch.__version__
        info["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    except ImportError:
        info["device"] = "cpu"
    return info


def git_revision() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
            cwd=Path(__file__).parent, check=True,
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def record(name: str, rows: list[Row], results_dir: Path = RESULTS_DIR) -> pl.DataFrame:
    """Append rows to the results table and rewrite its markdown view."""
    results_dir.mkdir(parents=True, exist_ok=True)
    stamp = {"benchmark_run": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
             "revision": git_revision()}
    new = pl.DataFrame(
        [{**asdict(r), "ratio": r.ratio, **stamp, **machine_info()} for r in rows],
        schema_overrides={"peer": pl.Float64, "ratio": pl.Float64, "met": pl.Boolean, "ours": pl.Float64},
    )
    path = results_dir / f"{name}.parquet"
    table = pl.concat([pl.read_parquet(path), new], how="diagonal_relaxed") if path.exists() else new
    table.write_parquet(path)
    (results_dir / f"{name}.md").write_text(to_markdown(table))
    return new


def to_markdown(table: pl.DataFrame) -> str:
    cols = ["benchmark", "case", "metric", "ours", "peer_name", "peer", "ratio", "target", "met",
            "device", "revision", "benchmark_run"]
    lines = ["# Benchmark results", "", "Appended by `python -m benchmarks NAME`; newest last.", "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in table.select([c for c in cols if c in table.columns]).iter_rows(named=True):
        lines.append("| " + " | ".join(_fmt(row.get(c)) for c in cols) + " |")
    return "\n".join(lines) + "\n"


def _fmt(v: object) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v).replace("|", "/")


def available() -> list[str]:
    here = Path(__file__).parent
    return sorted(p.stem for p in here.glob("*.py") if p.stem not in {"__init__", "__main__", "harness"}
                  and not p.stem.startswith("_"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", help=f"a benchmark ({', '.join(available())}), 'all' or 'list'")
    parser.add_argument("--quick", action="store_true", help="small sizes, to check the benchmark runs")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="a benchmark's own option (its run() keyword; see its docstring); repeatable")
    parser.add_argument("--results", type=Path, default=None,
                        help=f"results folder (default {RESULTS_DIR}, or a scratch folder with --quick)")
    args = parser.parse_args(argv)
    results = args.results or (RESULTS_DIR / "quick" if args.quick else RESULTS_DIR)
    if args.name == "list":
        print("\n".join(available()))
        return 0
    if bad := [option for option in args.option if "=" not in option]:
        parser.error(f"--option {bad[0]!r}: write it as KEY=VALUE")
    options = dict(option.split("=", 1) for option in args.option)
    if options and args.name == "all":
        parser.error("--option applies to one benchmark; name it")
    names = available() if args.name == "all" else [args.name]
    for name in names:
        if name not in available():
            parser.error(f"unknown benchmark {name!r}; choose from {', '.join(available())}")
        module = importlib.import_module(f"benchmarks.{name}")
        rows = module.run(quick=args.quick, **options)
        new = record(name, rows, results)
        print(to_markdown(new).split("\n", 4)[-1], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())


class Interleaved:
    """A reference trainer stepped once after each of our optimizer steps (pass it as `on_step`): both
    train in one process and thread, and each side's clock counts only its own steps, so load on the
    machine falls on both alike. `inside` is the reference's time within our loop (subtract it from ours)."""

    def __init__(self, reference) -> None:
        self.reference, self.inside = reference, 0.0

    def __call__(self, step: int, loss: float) -> None:
        t0 = time.perf_counter()
        if not self.reference.done:
            self.reference.step()
        self.inside += time.perf_counter() - t0

    def finish(self) -> None:
        """The reference's steps left once ours are done (it may have a few more batches)."""
        while not self.reference.done:
            self.reference.step()
