"""Reliability figures: kill -9 crashes, concurrent runs, flaky storage, hostile inputs, fuzzing.

Each row is `ours` = survived (or passed), `peer` = tried, so the target is ratio 1. The same
machinery as tests/test_reliability.py (benchmarks/chaos.py), with bigger counts; the 200 MB single
line is measured here only (too slow for CI on two shared cores; CI runs 20 MB).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import Row

NAME = "reliability"


def _row(case: str, metric: str, ours: float, tried: float, notes: str = "") -> Row:
    return Row(NAME, case, metric, float(ours), float(tried), "tried", True, "ratio == 1", ours == tried, notes)


def _cost_row(case: str, metric: str, percent: float, at_most: float, notes: str) -> Row:
    """A cost in percent of the work it protects (no peer: the same work without the check is the baseline)."""
    return Row(NAME, case, metric, round(percent, 3), None, "", False, f"<= {at_most} %", percent <= at_most, notes)


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
    code = ("import resource, time; from pathlib import Path; "
            "from lexiflow.models.ingest import build_corpus, IngestOptions; "
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


def _damage(work: Path) -> list[Row]:
    """Damage done by hand to published artifacts (as a disk or a person would): each case must be
    caught where the data is used: a reuse check that sends the artifact to be rebuilt, or a read
    refused in one line naming the artifact and the repair command."""
    import logging

    import polars as pl
    from lexiflow.storage import ArtifactStore
    from lexiflow.storage.manifests import ArtifactDamaged
    from lexiflow.tasks.stage import reusable

    from benchmarks.hostile import flip_byte, rewrite_manifest

    logger = logging.getLogger("benchmark")
    logger.setLevel(logging.ERROR)
    store, version = ArtifactStore(work / "damage"), "0123456789abcdef"

    def publish() -> None:
        with store.writer("ppmi", version) as out:
            out.write_parquet("matrix.parquet", pl.DataFrame({"value": [float(i) for i in range(50_000)]}))
            out.write_json("config.json", {"rows": 50_000})

    def rebuilt() -> bool:  # what a stage's reuse check does: refuse to reuse, remove to rebuild
        return not reusable(store, "ppmi", version, logger) and not store.exists("ppmi", version)

    def refused(read) -> bool:
        try:
            read()
        except ArtifactDamaged as exc:
            return f"ppmi:{version}" in str(exc) and "lexiflow artifacts rm" in str(exc) and "\n" not in str(exc)
        return False

    path = lambda name: store.path("ppmi", version, name)  # noqa: E731
    cases = {
        "deleted data file": (lambda: store.fs.rm(path("matrix.parquet")), rebuilt),
        "truncated data file": (lambda: store.fs.pipe_file(path("matrix.parquet"), b"PAR1"), rebuilt),
        "manifest without 'created'": (lambda: rewrite_manifest(store, "ppmi", version, lambda m: m.pop("created")),
                                       rebuilt),
        "one bit flipped in a Parquet data page": (lambda: flip_byte(store, "ppmi", version, "matrix.parquet", 0.4),
                                                   lambda: refused(lambda: store.read_arrow("ppmi", version,
                                                                                            "matrix.parquet"))),
        "one bit flipped in a Parquet footer": (lambda: flip_byte(store, "ppmi", version, "matrix.parquet", 0.995),
                                                lambda: refused(lambda: store.read_arrow("ppmi", version,
                                                                                         "matrix.parquet"))),
        "one byte changed in a file read whole": (
            lambda: store.fs.pipe_file(path("config.json"), store.fs.cat_file(path("config.json")).replace(b"5", b"6")),
            lambda: refused(lambda: store.local_dir("ppmi", version).__enter__())),
    }
    caught = 0
    for damage, check in cases.values():
        if store.exists("ppmi", version):
            store.delete("ppmi", version)
        publish()
        damage()
        caught += bool(check())
    return [_row(f"damaged artifacts ({len(cases)} kinds: {', '.join(cases)}), caught where used", "damage caught",
                 caught, len(cases), "rebuilt on reuse (sizes, schema) or refused on read (page CRCs, SHA-256) "
                 "with the artifact and `lexiflow artifacts rm` named")]


def _store_repair(work: Path) -> list[Row]:
    """Manifest schema, symbolic links, `rm` and `gc`: the store's own tests (both backends), counted."""
    passed, tried, failures = _pytest(["tests/test_store_integrity.py", "-k", "schema or symlink or rm_refuses or gc_"])
    return [_row("store repair and validation (both backends): manifests against the schema on read, symlinks "
                 "reported/not exported, rm refused/forced, gc of killed writers' leftovers and keep-N retention",
                 "tests passed", passed, tried, failures)]


def _pytest(args: list[str]) -> tuple[int, int, str]:
    """(passed, run, failures) of a pytest run in a child process."""
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                         cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True)
    summary = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-200:]
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|error)", summary)}
    failures = "; ".join(line.split("::")[-1] for line in out.stdout.splitlines() if line.startswith("FAILED"))
    return counts.get("passed", 0), sum(counts.values()), failures or summary


BOUNDED_CHILD = """
import sys, time
from pathlib import Path
from lexiflow.models.errors import InputError
from lexiflow.models.ingest import IngestOptions, build_corpus, resolve_sources
start = time.perf_counter()
try:
    build_corpus(resolve_sources(sys.argv[1:]), IngestOptions())
    outcome = "read"
except InputError as exc:
    outcome = "refused: " + str(exc).split(": ", 1)[1][:50]
peak = next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM"))
print(f"{time.perf_counter() - start:.2f}\t{int(peak) << 10}\t{outcome}")
"""


def _bounded_inputs(work: Path) -> list[Row]:
    """The issue's hostile inputs at full size, under the default limits (4 GiB), each in a fresh
    process: refused, how fast, at what peak memory (VmHWM, interpreter and libraries included)."""
    import gzip

    from benchmarks.hostile import dictionary_bomb

    folder = work / "bounded"
    (folder / "loop" / "sub").mkdir(parents=True)
    cases = {}
    size = dictionary_bomb(folder / "dictionary.parquet", value_bytes=1 << 20, rows=100_000)
    cases[f"Parquet, {size} bytes, dictionary text expanding to 105 GB"] = [str(folder / "dictionary.parquet")]
    with (folder / "bomb.txt.gz").open("wb") as f, gzip.GzipFile(fileobj=f, mode="wb", compresslevel=9) as z:
        for _ in range(5 << 4):
            z.write(b"\0" * (64 << 20))  # 5 GiB of zeros
    cases[f"gzip bomb, {(folder / 'bomb.txt.gz').stat().st_size >> 20} MiB expanding to 5 GiB"] = [
        str(folder / "bomb.txt.gz")]
    with (folder / "huge.txt").open("wb") as f:
        f.truncate(5 << 30)  # sparse
    cases["plain file of 5 GiB (sparse)"] = [str(folder / "huge.txt")]
    (folder / "loop" / "a.txt").write_text("Some text.\n")
    (folder / "loop" / "self").symlink_to(folder / "loop")
    (folder / "loop" / "sub" / "up").symlink_to(folder / "loop")
    cases["glob 'loop/**/*.txt' over two links to the folder itself"] = [str(folder / "loop" / "**" / "*.txt")]
    rows, bounded, notes = [], 0, []
    for case, sources in cases.items():
        out = subprocess.run([sys.executable, "-c", BOUNDED_CHILD, *sources], capture_output=True, text=True,
                             timeout=300, cwd=Path(__file__).resolve().parents[1])
        try:
            seconds, peak, outcome = out.stdout.strip().split("\t")
        except ValueError:
            notes.append(f"{case}: failed ({out.stderr.strip()[-120:]})")
            continue
        expected = "read" if case.startswith("glob") else "refused"
        ok = outcome.startswith(expected) and int(peak) < 1 << 30 and float(seconds) < 60
        bounded += ok
        notes.append(f"{case}: {outcome} in {float(seconds):.2f} s, peak {int(peak) / 2**20:.0f} MiB")
    rows.append(_row(f"inputs that cost memory before ({len(cases)} cases, full size, default limits)",
                     "refused (or read) in < 60 s under 1 GiB", bounded, len(cases), "; ".join(notes)))
    return rows


STREAMED_CHILD = """
import sys, time
from lexiflow.storage import ArtifactStore
from lexiflow.tasks.corpus import ingest_corpus
from lexiflow.tasks.params import CorpusParams, ParallelParams
start = time.perf_counter()
with ArtifactStore(sys.argv[1]).writer("corpus", "ab" * 8) as out:  # what the corpus stage runs
    ingest_corpus.fn.__wrapped__(out, params=CorpusParams(sources=[sys.argv[2]]),
                                 parallel=ParallelParams(shard_bytes=int(sys.argv[3])))
    documents = out.metrics["documents"]
peak = next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM"))
print(f"{time.perf_counter() - start:.2f}\t{int(peak) << 10}\t{documents}")
"""


def _streamed_compressed(quick: bool, work: Path) -> list[Row]:
    """A gzip text file at two sizes (WikiText-2 valid repeated, each copy's lines prefixed so none is a
    duplicate) through the corpus stage's builder in a fresh process, with the default
    `parallel.shard_bytes` (64 MiB; 4 MiB in the quick run): peak resident memory (VmHWM) at the larger
    size over the smaller, flat when reading streams (it was read whole before: memory grew with the file)."""
    import gzip

    from benchmarks.corpora import WIKITEXT_VALID

    lines = WIKITEXT_VALID.read_text().splitlines()
    sizes, shard = ((16 << 20, 64 << 20), 4 << 20) if quick else ((128 << 20, 512 << 20), 64 << 20)
    figures = []
    for size in sizes:
        path = work / f"streamed-{size >> 20}.txt.gz"
        with gzip.open(path, "wt", compresslevel=1) as f:
            written, copy = 0, 0
            while written < size:
                block = "".join(f"{copy} {line}\n" for line in lines)
                f.write(block)
                written, copy = written + len(block.encode()), copy + 1
        out = subprocess.run([sys.executable, "-c", STREAMED_CHILD, str(work / f"store-{size >> 20}"), str(path),
                              str(shard)],
                             capture_output=True, text=True, timeout=1800, cwd=Path(__file__).resolve().parents[1])
        try:
            seconds, peak, documents = out.stdout.strip().split("\t")
        except ValueError:
            return [_row("gzip text through the corpus stage", "peak memory flat", 0, 1, out.stderr.strip()[-300:])]
        figures.append({"text": written, "gzip": path.stat().st_size, "seconds": float(seconds), "peak": int(peak),
                        "documents": int(documents)})
        path.unlink()
    notes = "; ".join(f"{f['text'] / 2**20:.0f} MiB of text ({f['gzip'] / 2**20:.0f} MiB gzip, {f['documents']} "
                      f"documents): peak {f['peak'] / 2**20:.0f} MiB in {f['seconds']:.0f} s" for f in figures)
    growth = figures[1]["peak"] / figures[0]["peak"]
    return [Row(NAME, f"gzip text file of {sizes[0] >> 20} and {sizes[1] >> 20} MiB of text through the corpus stage "
                f"({shard >> 20} MiB shards)", "peak RSS, larger / smaller", round(growth, 3), None, "", False,
                "<= 1.5", growth <= 1.5, notes + " (the merge keeps the id of every document kept, 8 B each)")]


def _empty_result() -> list[Row]:
    passed, tried, failures = _pytest(["tests/test_empty_result.py"])
    return [_row("corpus of only punctuation (or no word over min_count): one line naming the source, no artifact "
                 "from the failing stage, what was published before verifies", "tests passed", passed, tried,
                 failures)]


def _reuse_cost(zygote, work: Path) -> list[Row]:
    """`lexiflow run` twice (SMALL_RUN); on the cached run every stage checks what it reuses: the
    manifest against the schema and the files' sizes (one listing). Its cost is timed here per artifact
    against the check it replaced (`exists`), twice per stage (Prefect's cache key, then the task)."""
    from lexiflow.storage import ArtifactStore, Catalog
    from lexiflow.tasks.stage import reusable

    from benchmarks.chaos import SMALL_RUN

    store_dir = work / "reuse"
    times = []
    for _ in range(3):
        start = time.perf_counter()
        run = zygote.start(["run", "--store", str(store_dir), *SMALL_RUN])
        if run.wait() != 0:
            return [_row("cached rerun", "runs completed", 0, 1, run.output()[-300:])]
        times.append(time.perf_counter() - start)
    store = ArtifactStore(str(store_dir))
    entries = Catalog(store).entries()
    repeats = 20

    def timed(check) -> float:
        start = time.perf_counter()
        for _ in range(repeats):
            for kind, version in entries:
                check(kind, version)
        return (time.perf_counter() - start) / repeats

    verify, exists = timed(lambda k, v: reusable(store, k, v)), timed(store.exists)
    added = 2 * (verify - exists)
    cached = min(times[1:])
    return [_cost_row(f"cached rerun (`lexiflow run` SMALL_RUN, {len(entries)} artifacts): checks of what it "
                      "reuses", "cost of the checks, % of the cached run", 100 * added / cached, 1,
                      f"cold run {times[0]:.1f} s, cached runs {times[1]:.1f} s and {times[2]:.1f} s; reuse checks "
                 f"{1000 * verify:.2f} ms per pass over the store vs {1000 * exists:.2f} ms for existence alone, "
                 f"2 passes per run: +{1000 * added:.1f} ms (2 shared cores, other work running)")]


def _read_checks(work: Path) -> list[Row]:
    """The cost of content checks on read: Parquet page CRCs (a 4M-cell matrix) and SHA-256 of files
    read whole, against the same reads without them."""
    import hashlib

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from lexiflow.storage.writer import PARQUET_OPTIONS

    rng = np.random.default_rng(0)
    path = work / "matrix.parquet"
    n = 4_000_000
    pq.write_table(pa.table({"row": rng.integers(0, 50_000, n, dtype=np.uint32),
                             "col": rng.integers(0, 50_000, n, dtype=np.uint32), "value": rng.random(n)}),
                   path, **PARQUET_OPTIONS)

    plain, checked = [], []
    for _ in range(10):  # interleaved: the load of other work falls on both alike
        plain.append(_timed(lambda: pq.read_table(path)))
        checked.append(_timed(lambda: pq.read_table(path, page_checksum_verification=True)))
    plain, checked = min(plain), min(checked)
    data = path.read_bytes()
    sha = min(_timed(lambda: hashlib.sha256(data).digest()) for _ in range(5))
    return [Row(NAME, f"Parquet read with page checksums verified ({n:,} cells, {len(data) >> 20} MiB)",
                "read time, % over unchecked", round(100 * (checked - plain) / plain, 1), None, "", False, "", None,
                f"best of 10: {plain * 1000:.0f} ms unchecked, {checked * 1000:.0f} ms checked; SHA-256 of files read "
                f"whole: {len(data) / sha / 1e6:.0f} MB/s (2 shared cores, other work running)")]


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


# Sections by name: LEXIFLOW_RELIABILITY_SECTIONS=store,inputs runs those only (the crash loops take an hour).
SECTIONS = ("inputs", "fuzz", "store", "crash")


def run(quick: bool = False) -> list[Row]:
    chosen = os.environ.get("LEXIFLOW_RELIABILITY_SECTIONS", ",".join(SECTIONS)).split(",")
    rows = []
    with tempfile.TemporaryDirectory(prefix="lexiflow-reliability-") as tmp:
        work = Path(tmp)
        if "inputs" in chosen:
            rows += _hostile(quick, work) + _bounded_inputs(work) + _streamed_compressed(quick, work) + _empty_result()
        if "fuzz" in chosen:
            rows += _fuzz(quick, work)
        if "store" in chosen:
            rows += _damage(work) + _store_repair(work) + _read_checks(work) + _cached_rerun(work)
        if "crash" in chosen:
            rows += _crash_and_concurrency(quick, work)
    return rows


def _cached_rerun(work: Path) -> list[Row]:
    from benchmarks.chaos import Zygote, prefect_server

    with prefect_server(work / "prefect-home-reuse") as env, Zygote(env, work / "reuse-runs") as zygote:
        return _reuse_cost(zygote, work)
