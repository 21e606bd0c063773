"""The corpus rebuild at size: ingest -> vocabulary -> encoding -> co-occurrence -> PPMI -> SVD, on one
process, on the default runner (2 threads) and on warm Dask LocalClusters of 1 and 2 worker processes (one
thread each; each cluster up only for its own run, an idle one costing ~0.03 of a core, and warmed by a small
untimed rebuild, as the one process and the threads are), side by side in one run, at three corpus sizes
(0.25, 0.5 and 1 GB of text; `--quick`: 8, 16 and 32 MB). Per sharded stage, the 2 Dask workers are also
compared with the 2 threads (`against_default`): warm, without the start that the cold rows (below) time.

The text is real: WikiText-2 valid lines, UD English-EWT sentences and the enwiki excerpt's documents
(gensim), each document three random lines of that pool, so documents are distinct (dedupe keeps
them) and the line order varies. Shards have a fixed size (`SHARDS`), so a larger corpus makes more
shards, not larger ones: a worker's peak memory should not grow with the corpus. Every run, the single
process's included (it reads and counts in those chunks), has the same parameters but the runner.

Each stage is built as the pipeline builds it (a task in a Prefect flow run, timed inside the run), and
reports wall seconds, throughput (MB of text/s for ingestion, tokens/s for the rest) and peak RSS:
of the single process (the flow's process), or the largest of the Dask workers (VmHWM, reset before
each stage). PPMI and SVD run on one node in both (vocabulary-bound). Every artifact of a Dask run
is checked equal (version and bytes) to the single-process one. The last rows split a shard's cost
(Prefect task run, part file, merge) on the 2-worker cluster (benchmarks/results/scaling-notes.md).

Sizes: window 5 (harmonic), vocabulary min count 5 and at most 30 000 words, SVD 100 dimensions; the
full run takes ~11 minutes on 2 quiet cores (benchmarks/results/scaling-notes.md); the quick one ~2 minutes.

`--option mode=fixed` measures a shard task's fixed cost on each pool (`fixed_costs`). `--option mode=cold`
times what a user runs, not warm stages: `lexiflow run` as a command, from its start to the
co-occurrence artifact's publication (its manifest's `created`), on a new store each time, with each runner
(`cold`, below): `rounds=N` runs each N times (default 2), `runners=dask,threads` only those besides the default
runner and `local` (of threads, processes, dask, cluster: the run's own LocalCluster, a running one). With
`threads` chosen, the default runner is timed in two rows, and what is compared with it is the median of both
rows' runs (`default_runs`); each row's notes also give each round's run against the default runner's runs of
that round, minutes apart (this machine drifts by the hour). Options
(`--option KEY=VALUE`), for a machine with more cores (benchmarks/results/scaling-notes.md, "On free cores"):
`workers=1,2,4,8` the worker counts run on the largest size (default 1,2); `sizes_gb=1` the corpus sizes;
`stages=sharded` only the sharded stages (no PPMI/SVD, so no gensim needed); `pool=FILE` the real
lines, one per line, for a machine without ../shared (write it here with
`python -c "import benchmarks.scaling as s; s.save_pool('FILE')"`).
"""

from __future__ import annotations

import json
import math
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import psutil
from lexiflow.models.ingest import IngestOptions, build_corpus, resolve_sources
from lexiflow.storage import ArtifactRef, ArtifactStore
from lexiflow.storage.formats import read_rows
from lexiflow.tasks import parallel, parts
from lexiflow.tasks.corpus import ingest_corpus
from lexiflow.tasks.matrices import compute_ppmi, count_cooccurrence
from lexiflow.tasks.params import (
    COOCCURRENCE_SHARD_SENTENCES,
    CooccurrenceParams,
    CorpusParams,
    ParallelParams,
    PPMIParams,
    SVDParams,
    VocabularyParams,
)
from lexiflow.tasks.vocabulary import encode_corpus, learn_vocabulary
from prefect.testing.utilities import prefect_test_harness

from benchmarks.corpora import WIKITEXT_VALID
from benchmarks.harness import SHARED_DATA, Row
from benchmarks.sharding import _timed_stage, cluster

GB = 1e9
SIZES = {False: (0.25 * GB, 0.5 * GB, 1.0 * GB), True: (8e6, 16e6, 32e6)}
# Full: the defaults (64 MiB of text per ingestion, vocabulary and encoding shard; 500 000 sentences per
# co-occurrence shard). Quick: small shards, so that its small corpora make several.
SHARDS = {False: {"shard_bytes": 64 << 20}, True: {"shard_bytes": 1 << 20, "shard_rows": 8_000}}
VOCABULARY = VocabularyParams(min_count=5, max_size=30_000)
WINDOW = CooccurrenceParams(window=5)
SVD = SVDParams(dim=100)


def line_pool() -> list[str]:
    """Real lines: WikiText-2 valid, EWT sentences (# text), the enwiki excerpt's documents."""
    lines = [line.strip() for line in WIKITEXT_VALID.read_text(encoding="utf-8").splitlines()
             if line.strip() and not line.strip().startswith("=")]
    ewt = SHARED_DATA / "ud-english-ewt" / "en_ewt-ud-train.conllu"
    lines += [line[len("# text = "):] for line in ewt.read_text(encoding="utf-8").splitlines()
              if line.startswith("# text = ")]
    enwiki = build_corpus(resolve_sources(["builtin:enwiki"]), IngestOptions(lowercase=False, split_sentences=False))
    lines += [text.replace("\n", " ") for text in enwiki.documents["text"]]
    return lines


def save_pool(path: str) -> None:
    """The line pool as a file (`--option pool=FILE`), for a machine without ../shared or gensim's data."""
    Path(path).write_text("\n".join(line_pool()) + "\n", encoding="utf-8")


def corpus_text(path: Path, target_bytes: float, pool: list[str], seed: int = 0) -> Path:
    """Documents of three random pool lines each (varied order, distinct documents) up to `target_bytes`."""
    rng, pool_array, written = np.random.default_rng(seed), np.array(pool, dtype=object), 0
    with path.open("w", encoding="utf-8") as f:
        while written < target_bytes:
            picks = pool_array[rng.integers(0, len(pool), size=(1000, 3))]
            block = "".join(f"{a} {b} {c}\n" for a, b, c in picks)
            f.write(block)
            written += len(block.encode())
    return path


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := current RSS (Linux)


def _peak_gb() -> float:
    status = Path("/proc/self/status").read_text().splitlines()
    return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 1e6


def _cpu_seconds() -> float:
    return time.process_time()


class Peak:
    """Peak RSS over a block: this process's (`driver`), and the largest of a Dask cluster's workers';
    and where the CPU time went: the workers (`worker_cpu`, summed), this process (`driver_cpu`) and the
    rest of the machine (`other_cpu`: the Prefect API server, the Dask scheduler, anything else)."""

    def __init__(self, dask: Any = None) -> None:
        self.client, self.workers, self.worker_cpu = None, float("nan"), 0.0
        if dask is not None:
            from distributed import Client

            self.client = Client(dask.scheduler_address, set_as_default=False)  # not the default client

    def __enter__(self) -> Peak:
        _reset_peak()
        if self.client:
            self.client.run(_reset_peak)
            self.worker_cpu = -sum(self.client.run(_cpu_seconds).values())
        self.driver_cpu, self.machine_cpu = -time.process_time(), -_machine_cpu()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.driver = _peak_gb()
        self.driver_cpu += time.process_time()
        self.machine_cpu += _machine_cpu()
        if self.client:
            self.workers = max(self.client.run(_peak_gb).values())
            self.worker_cpu += sum(self.client.run(_cpu_seconds).values())
            self.client.close()
        self.other_cpu = self.machine_cpu - self.driver_cpu - self.worker_cpu

    def cpu(self) -> str:
        workers = f", workers {self.worker_cpu:.1f}" if self.client else ""
        return f"CPU s: flow process {self.driver_cpu:.1f}{workers}, rest of the machine {self.other_cpu:.1f}"


def _machine_cpu() -> float:
    """Busy CPU seconds of the whole machine since boot (user + system, all cores)."""
    times = psutil.cpu_times()
    return times.user + times.system + getattr(times, "nice", 0.0)


def chain(store: str, source: Path, parallel_params: ParallelParams, dask: Any = None,
          sharded_only: bool = False) -> dict[str, Any]:
    """Every stage of the rebuild: {stage: (seconds, (driver, worker) peak GB, ref)}."""
    results, refs = {}, {}
    steps = [
        ("corpus", ingest_corpus, lambda: {"params": CorpusParams(sources=[str(source)])}, True),
        ("tokenizer", learn_vocabulary, lambda: {"corpus": refs["corpus"], "params": VOCABULARY}, True),
        ("tokenized_corpus", encode_corpus, lambda: {"corpus": refs["corpus"], "tokenizer": refs["tokenizer"]}, True),
        ("cooccurrence", count_cooccurrence, lambda: {"tokens": refs["tokenized_corpus"],
                                                     "tokenizer": refs["tokenizer"], "params": WINDOW}, True),
    ]
    if not sharded_only:
        from lexiflow.tasks.embeddings import svd_embeddings  # imported here: it needs gensim, the rest does not

        steps += [("ppmi", compute_ppmi, lambda: {"cooccurrence": refs["cooccurrence"], "params": PPMIParams()}, False),
                  ("embeddings", svd_embeddings, lambda: {"ppmi": refs["ppmi"], "params": SVD}, False)]
    for name, stage, arguments, sharded in steps:
        with Peak(dask if sharded else None) as peak:
            runner = {"parallel": parallel_params} if sharded else {}
            seconds, ref = _timed_stage(stage, store, {**arguments(), **runner})
        refs[name] = ref
        results[name] = (seconds, (peak.driver, peak.workers, peak.cpu()), ref)
    return results


def work_done(store: str, refs: dict[str, Any]) -> dict[str, tuple[float, str]]:
    """What each stage's throughput counts: MB of text for ingestion, tokens for the rest."""
    artifacts = ArtifactStore(store)
    metric = {name: artifacts.manifest(ref.kind, ref.version)["metrics"] for name, (_, _, ref) in refs.items()}
    tokens = metric["tokenized_corpus"]["tokens"]
    return {"corpus": (float("nan"), "MB/s"),  # the text's size: the caller's
            "tokenizer": (metric["tokenizer"]["train_tokens"], "tokens/s"),
            "tokenized_corpus": (tokens, "tokens/s"), "cooccurrence": (metric["cooccurrence"]["tokens"], "tokens/s"),
            "ppmi": (tokens, "tokens/s"), "embeddings": (tokens, "tokens/s")}


def same(a: ArtifactRef, b: ArtifactRef) -> bool:
    left, right = ArtifactStore(a.store), ArtifactStore(b.store)
    return a.version == b.version and left.manifest(a.kind, a.version)["files"] == \
        right.manifest(b.kind, b.version)["files"]


def _no_op(part: str | None) -> int:
    return 0


def no_op_seconds(params: ParallelParams, out: Any, n: int) -> float:
    """Seconds per task of `n` no-op shards through `map_shards` on the pool `params` name: a shard's fixed cost."""
    start = time.perf_counter()
    parallel.map_shards(_no_op, [{} for _ in range(n)], params, "no-op", out)
    return (time.perf_counter() - start) / n


def fixed_costs(n: int = 32) -> list[Row]:
    """A shard task's fixed cost on each pool of 2 (threads, the run's spawned processes, a LocalCluster of 2
    worker processes): `n` no-op shards through `map_shards`, after a first round that starts the pool (the
    issue 47 target: 0.05 s)."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for runner in ("threads", "processes", "dask"):
            params, seconds = ParallelParams(runner=runner, workers=2), []
            for attempt in range(4):
                with ArtifactStore(tmp).writer("corpus", f"{attempt:02d}" * 8) as out:
                    seconds.append(no_op_seconds(params, out, n))
            rows.append(Row("scaling", f"a shard task's fixed cost, {runner}, a warm pool of 2 ({n} no-op shards)",
                            "seconds per task", min(seconds[1:]), None, "", False, "<= 0.05",
                            min(seconds[1:]) <= 0.05, f"first round, starting the pool: {seconds[0]:.3f} s a task"))
    return rows


def breakdown(dask: Any, store: str, tokens: ArtifactRef, tokenizer: ArtifactRef, rows: int) -> list[Row]:
    """A shard's costs on the warm cluster: a no-op shard task (its fixed cost); one co-occurrence shard
    (counting, and encoding its inner documents' term–document rows), its other results written and read as
    parts (Arrow IPC); one merge of two such results."""
    from lexiflow.tasks.shards import cooccurrence_shard, weigh_partition

    params = ParallelParams(runner="dask", dask_address=dask.scheduler_address)
    with ArtifactStore(store).writer("corpus", "ab" * 8) as out:
        per_task = no_op_seconds(params, out, 32)
        vocabulary = ArtifactStore(tokenizer.store).read_parquet("tokenizer", tokenizer.version, "vocab.parquet")
        keep = np.ones(vocabulary.height)
        documents = int(read_rows(tokens, "tokens.parquet", rows - 1, rows)["doc_index"][0]) + 1
        call = {"tokens": tokens, "start": 0, "stop": rows, "keep_prob": keep, "window": WINDOW.window, "seed": 0,
                "documents": documents, "partitions": 2}
        start = time.perf_counter()
        result = cooccurrence_shard(**call, part=None)
        compute = time.perf_counter() - start
        folder = out.work / "parts"
        folder.mkdir(parents=True)
        start = time.perf_counter()
        partitions = parts.deliver_partitions(result[0], str(folder / "a"), "pairs")
        termdoc = [parts.deliver(table, str(folder / "a"), f"docs{i}")  # its boundary documents' rows
                   for i, table in enumerate(result[1]) if isinstance(table, pl.DataFrame)]
        write = time.perf_counter() - start
        start = time.perf_counter()
        back = [parts.received(block) for block in partitions]
        for part in termdoc:
            parts.received(part)
        read = time.perf_counter() - start
        start = time.perf_counter()
        weigh_partition([back[0], back[0]], vocabulary.height, WINDOW.weighting)
        merge = time.perf_counter() - start
        size = sum(Path(p.path).stat().st_size for p in (partitions[0], *termdoc)) / 1e6
    case = f"one co-occurrence shard of {rows} sentences ({result[2] / 1e6:.2f}M tokens)"
    return [Row("scaling", "a shard task's fixed cost on a warm 2-worker Dask cluster (no-op shard, 32 in a row)",
                "seconds per task", per_task, None, "", False),
            Row("scaling", case + ": counting", "seconds", compute, None, "", False),
            Row("scaling", case + f": result written as parts ({size:.0f} MB)", "seconds", write, compute,
                "counting", False),
            Row("scaling", case + ": parts read back", "seconds", read, compute, "counting", False),
            Row("scaling", case + ": merge of one of 2 key partitions of two such results (added, weighted)", "seconds",
                merge, compute, "counting", False)]


# The default runner's warm run at each size, beside the 2-worker Dask run (`against_default`).
DEFAULT_WARM = f"2 {ParallelParams().runner} (the default runner)"


def on_workers(peak: tuple) -> bool:
    """Whether a stage's (flow process, largest worker, CPU) peaks come from Dask workers (else NaN: no worker)."""
    return not math.isnan(peak[1])


def against_default(label: str, dask: dict[str, Any], default: dict[str, Any]) -> list[Row]:
    """Per sharded stage, warm: the 2-worker Dask run's speed against the default runner's on the same text. What
    the cold rows add to this is each runner's start (benchmarks/results/scaling-notes.md, "Cold, as a user runs
    it")."""
    rows, lines = [], []
    for stage, (seconds, peak, _) in dask.items():
        if on_workers(peak):
            base = default[stage][0]
            rows.append(Row("scaling", f"{label} text, {stage}, 2 Dask workers against {DEFAULT_WARM}", "speed-up",
                            base / seconds, 1.0, DEFAULT_WARM, True, "", None,
                            f"{seconds:.1f} s vs {base:.1f} s, warm"))
            lines.append(f"  {stage}: {base / seconds:.2f}x ({rows[-1].notes})")
    print(f"{label}, 2 Dask workers against {DEFAULT_WARM}:", *lines, sep="\n", flush=True)
    return rows


def _rows_of_run(label: str, name: str, n_workers: int, result: dict[str, Any], single: dict[str, Any],
                 work: dict[str, tuple[float, str]], megabytes: float) -> list[Row]:
    """One run's rows, checked against the single process's artifacts and printed as soon as it ends: a long
    run cut short (a lent machine's time limit) still tells what it measured, and that it matched."""
    differ = [stage for stage in single if not same(result[stage][2], single[stage][2])]
    assert not differ, f"{name}: {differ} differ from the single process's"
    goal = 0.75 * n_workers  # the bar: N workers on N free cores at >= 0.75 N
    rows = []
    for stage, (seconds, peak, _) in result.items():
        amount, unit = work[stage]
        amount = megabytes if stage == "corpus" else amount
        base = single[stage][0]
        sharded = on_workers(peak) and name != "single process"
        rows.append(Row("scaling", f"{label} text, {stage}, {name}", unit, amount / seconds,
                        amount / base, "single process", True, f"ratio >= {goal:g}" if sharded else "",
                        base / seconds >= goal if sharded else None,
                        f"{seconds:.1f} s vs {base:.1f} s single; peak RSS: flow process {peak[0]:.2f} GB"
                        + (f", largest worker {peak[1]:.2f} GB" if on_workers(peak) else "")
                        + f"; {peak[2]}; identical artifact"))
    print(f"{label}, {name}:", *(f"  {stage}: {row.notes}" for stage, row in zip(result, rows, strict=True)),
          sep="\n", flush=True)
    return rows


def run(quick: bool = False, workers: str = "1,2", sizes_gb: str = "", stages: str = "all",
        pool: str = "", mode: str = "warm", rounds: str = "2", runners: str = "") -> list[Row]:
    if mode not in ("warm", "cold", "fixed"):
        raise ValueError(f"--option mode={mode!r}: choose warm, cold or fixed")
    if mode == "cold":
        if not rounds.isdigit() or int(rounds) < 1:
            raise ValueError(f"--option rounds={rounds!r}: a whole number of rounds, at least 1")
        chosen = runners.split(",") if runners else list(COLD_RUNNERS)
        if unknown := set(chosen) - set(COLD_RUNNERS):
            raise ValueError(f"--option runners={runners!r}: {', '.join(sorted(unknown))} unknown; choose from "
                             f"{','.join(COLD_RUNNERS)}")
        return cold(quick, sizes_gb, pool, int(rounds), chosen)
    if mode == "fixed":
        return fixed_costs()
    if stages not in ("all", "sharded"):
        raise ValueError(f"--option stages={stages!r}: choose all or sharded")
    rows: list[Row] = []
    sizes = tuple(float(gb) * GB for gb in sizes_gb.split(",")) if sizes_gb else SIZES[quick]
    curve, shards = sorted({int(n) for n in workers.split(",")} | {2}), SHARDS[quick]
    lines = Path(pool).read_text(encoding="utf-8").split("\n")[:-1] if pool else line_pool()
    with tempfile.TemporaryDirectory() as tmp, prefect_test_harness(server_startup_timeout=120):
        whole = "sharded stages" if stages == "sharded" else "whole rebuild"
        small = corpus_text(Path(tmp) / "warm-up.txt", SIZES[True][0], lines)

        def warm_up(runner: dict[str, Any], dask: Any = None) -> None:
            """A small sharded rebuild, untimed: the runner has run every shard kind once, as a cluster in
            production has (a fresh cluster's first corpus shards took ~1 s more each, imports done)."""
            chain(tempfile.mkdtemp(dir=tmp), small, ParallelParams(**runner, **SHARDS[True]), dask, sharded_only=True)

        warm_up({"runner": "local"})
        for size in sizes:
            label = f"{size / GB:.2f} GB" if size >= 0.1 * GB else f"{size / 1e6:.0f} MB"
            source = corpus_text(Path(tmp) / f"corpus-{size:.0f}.txt", size, lines)
            sharded_only = stages == "sharded"
            single = chain(str(Path(tmp) / f"single-{size:.0f}"), source, ParallelParams(runner="local", **shards),
                           sharded_only=sharded_only)
            work = work_done(single["corpus"][2].store, single)
            megabytes = source.stat().st_size / 1e6
            runs = [("single process", 1), (DEFAULT_WARM, 2)] + [
                (f"{n} Dask worker{'s' * (n > 1)}", n) for n in curve
                if n == 2 or size == sizes[-1]]  # the memory check at every size
            results = {}
            for name, n in runs:
                if name == "single process":
                    result = single
                elif name == DEFAULT_WARM:  # the stages without the cold start: where Dask stands in them
                    warm_up({"workers": n})
                    result = chain(str(Path(tmp) / f"default{n}-{size:.0f}"), source,
                                   ParallelParams(workers=n, **shards), sharded_only=sharded_only)
                else:  # each cluster only for its own run: an idle one costs ~0.03 of a core (a quiet machine)
                    with cluster(n) as dask:
                        warm_up({"runner": "dask", "dask_address": dask.scheduler_address}, dask)
                        result = chain(str(Path(tmp) / f"dask{n}-{size:.0f}"), source,
                                       ParallelParams(runner="dask", dask_address=dask.scheduler_address, **shards),
                                       dask, sharded_only)
                results[name] = result
                rows += _rows_of_run(label, name, n, result, single, work, megabytes)
                total = sum(seconds for seconds, _, _ in result.values())
                rows.append(Row("scaling", f"{label} text, {whole}, {name}", "MB/s", megabytes / total,
                                megabytes / sum(s for s, _, _ in single.values()), "single process", True, "", None,
                                f"{total:.1f} s; shards: {json.dumps(shards)}"))
            rows += against_default(label, results["2 Dask workers"], results[DEFAULT_WARM])
        n_rows = shards.get("shard_rows", COOCCURRENCE_SHARD_SENTENCES)
        with cluster(2) as two:
            rows += breakdown(two, str(Path(tmp) / "breakdown"), single["tokenized_corpus"][2],
                              single["tokenizer"][2], n_rows)
    return rows


# The user's command in the cold runs: the corpus rebuild up to SVD, as the issue measured it.
COLD_COMMAND = ["--set", 'embeddings=["svd"]', "--set", "lm=[]", "--set", "vocabulary.max_size=5000"]
COLD_SIZES = {False: (30e6, 300e6, 1 * GB), True: (4e6, 16e6)}
CLUSTER = "a running 2-worker Dask cluster"
# The runners a cold run can time (`--option runners=...`, default all), by their short names. The default runner and
# `local` always run: every row's ratios are against them.
COLD_RUNNERS = ("threads", "processes", "dask", "cluster")


def runner_args(runner: str) -> list[str]:
    """The `--set` arguments that choose `runner` for the sharded stages."""
    return ["--set", f"parallel.runner={runner}"]


def cold_runners(address: str, chosen: list[str]) -> dict[str, list[str]]:
    """The runners a cold run tries, as `--set` arguments: the default, `local` and those `chosen`."""
    dask = [*runner_args("dask"), "--set", "parallel.workers=2"]
    offered = {"threads": ("threads", runner_args("threads")),
               "processes": ("processes", runner_args("processes")),
               "dask": ("dask, a LocalCluster of 2 the run starts", dask),
               "cluster": (CLUSTER, [*dask, "--set", f"parallel.dask_address={address}"])}
    return {f"default ({ParallelParams().runner})": [], "local": runner_args("local"),
            **dict(offered[key] for key in COLD_RUNNERS if key in chosen)}


def default_rows(runners: dict[str, list[str]]) -> list[str]:
    """The rows that run the default runner: its own (no `--set`) and one that names it (`threads`), if chosen."""
    same = ([], runner_args(ParallelParams().runner))
    return [name for name, args in runners.items() if args in same]


def default_runs(runs: dict[str, list[Any]], runners: dict[str, list[str]], round_: int | None = None) -> list[Any]:
    """The default runner's runs (of one round, `round_`, else of all): those of every row that runs it
    (`default_rows`), pooled. One runner timed twice a round is one baseline: its two rows' medians differ by this
    machine's noise (benchmarks/results/scaling-notes.md, "The same code three hours later"), so either alone would
    flatter or wrong what is compared with it."""
    return [run for name in default_rows(runners)
            for run in (runs[name] if round_ is None else runs[name][round_:round_ + 1])]


def default_against_itself(seconds: dict[str, list[float]], runners: dict[str, list[str]]) -> list[float]:
    """Each round, the default runner's seconds in its second row over those in its first (empty without a second
    row): how far one runner timed twice minutes apart strays from itself on this machine, the band within which
    two runners cannot be told apart by these rounds."""
    rows = default_rows(runners)
    return [second / first for first, second in zip(seconds[rows[0]], seconds[rows[1]], strict=True)] \
        if len(rows) == 2 else []


def cold_run(tmp: Path, source: Path, runner: list[str], api_url: str) -> tuple[float, float, ArtifactRef]:
    """`lexiflow run` as a user types it, on a new store: (seconds from its start to the co-occurrence artifact's
    publication, seconds to the command's end, that artifact)."""
    import datetime as dt
    import os
    import subprocess
    import sys

    from lexiflow.storage import Catalog

    store = tempfile.mkdtemp(dir=tmp, prefix="store-")
    env = {**os.environ, "PREFECT_API_URL": api_url}  # one server for every run: its start-up is not compared
    started, wall = dt.datetime.now(dt.UTC), time.perf_counter()
    subprocess.run([Path(sys.executable).parent / "lexiflow", "run", "--store", store, "--corpus", str(source),
                    *COLD_COMMAND, *runner], env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    total = time.perf_counter() - wall
    entry = Catalog(store).get("cooccurrence")
    published = dt.datetime.fromisoformat(ArtifactStore(store).manifest("cooccurrence", entry["version"])["created"])
    return (published - started).total_seconds(), total, ArtifactStore(store).ref("cooccurrence", entry["version"])


def cold(quick: bool, sizes_gb: str, pool: str, rounds: int, chosen: list[str]) -> list[Row]:
    """Each runner, cold, at each size: seconds from the command's start to the co-occurrence artifact, against
    the default runner and against `local` (one process), and the artifacts compared. Each runner runs once a
    round, the rounds in turn forwards and backwards, and its figure is the median of its rounds: this machine
    drifts by 5-10 % within an hour, which a fixed order charges to the runners that come last. The Dask cluster at
    `dask_address` is started by the benchmark before the timed command, as a user's would be, with a plain
    environment (no PREFECT_API_URL: a user's workers do not know the flow's server)."""
    from lexiflow.flows import prefect_env, server
    from lexiflow.tasks.runners import new_worker_cluster

    rows: list[Row] = []
    sizes = tuple(float(gb) * GB for gb in sizes_gb.split(",")) if sizes_gb else COLD_SIZES[quick]
    lines = Path(pool).read_text(encoding="utf-8").split("\n")[:-1] if pool else line_pool()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        cluster_ = None  # started only for its runner: idle, it still takes memory and a little CPU
        if "cluster" in chosen:
            cluster_ = new_worker_cluster(2)
        api_url = server.start_temporary(prefect_env.default_home(), print)
        try:
            runners = cold_runners(cluster_.scheduler_address if cluster_ else "", chosen)
            # untimed: the first command after an install also compiles bytecode and reads files from disk
            cold_run(tmp, corpus_text(tmp / "warm-up.txt", COLD_SIZES[True][0], lines), runners["local"], api_url)
            for size in sizes:
                label = f"{size / GB:.1f} GB" if size >= GB else f"{size / 1e6:.0f} MB"
                source = corpus_text(tmp / f"corpus-{size:.0f}.txt", size, lines)
                runs: dict[str, list[tuple[float, float, ArtifactRef]]] = {name: [] for name in runners}
                for round_ in range(rounds):
                    for name in list(runners)[::-1 if round_ % 2 else 1]:
                        runs[name].append(cold_run(tmp, source, runners[name], api_url))
                timed = {name: (statistics.median(s for s, _, _ in done), statistics.median(t for _, t, _ in done),
                                done[0][2]) for name, done in runs.items()}
                baseline = default_runs(runs, runners)
                default, local = statistics.median(s for s, _, _ in baseline), timed["local"]
                itself = default_against_itself({name: [s for s, _, _ in done] for name, done in runs.items()}, runners)
                band = ""
                if itself:
                    band = f"the default runner against itself, each round: {', '.join(f'{p:.2f}' for p in itself)}"
                    rows.append(Row("scaling", f"cold, {label} text, the default runner's second row against its "
                                    "first (one runner twice a round: this machine's noise)", "ratio, farthest from 1",
                                    max(itself, key=lambda p: abs(p - 1)), 1.0, "itself", False, notes=band))
                    print(rows[-1], flush=True)
                for name, (seconds, total, ref) in timed.items():
                    identical = all(same(ref, other) for done in runs.values() for *_, other in done)
                    each = ", ".join(f"{s:.1f}" for s, _, _ in runs[name])
                    # each round's run against the default runner's of the same round: minutes apart, not an hour
                    paired = [s / statistics.median(d for d, _, _ in default_runs(runs, runners, r))
                              for r, (s, _, _) in enumerate(runs[name])]
                    note = "; ".join(filter(None, [
                        f"median of {rounds} round(s): {each} s", f"command {total:.1f} s",
                        f"the default runner {default:.1f} s, median of its {len(baseline)} runs",
                        f"against the default runner's runs of the same round: {', '.join(f'{p:.2f}' for p in paired)}"
                        f", faster in {sum(p < 1 for p in paired)} of {rounds}", band,
                        f"co-occurrence identical across runners: {identical}"]))
                    dask = "dask" in name.lower()  # both Dask rows carry the targets
                    rows.append(Row("scaling", f"cold, {label} text, {name}: vs the default runner",
                                    "seconds to co-occurrence", seconds, default, "default runner", False,
                                    "ratio <= 1" if dask and size >= 300e6 else "",
                                    seconds <= default if dask and size >= 300e6 else None, note))
                    rows.append(Row("scaling", f"cold, {label} text, {name}: speed-up over one process",
                                    "speed-up", local[0] / seconds, 1.0, "local (one process)", True,
                                    ">= 1.3" if dask and size >= GB else "",
                                    local[0] / seconds >= 1.3 if dask and size >= GB else None, note))
                    print(rows[-2], flush=True)
        finally:
            server.stop_temporary()
            if cluster_ is not None:
                cluster_.close()
    return rows


if __name__ == "__main__":
    print(pl.DataFrame([vars(r) for r in run(quick=True)]))
