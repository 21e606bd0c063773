"""Ingestion throughput on plain text (MB/s): ours (vectorized with polars) vs a straightforward
Python loop doing the same cleaning (NFC, whitespace, sentence split, lowercase, hash, dedupe).

A second row is the `corpus` stage sharded on a warm Dask LocalCluster of 2 worker processes
(byte ranges of the file, merged in order; the whole stage: plan, shard task runs, parts,
merge, corpus stats, publish), against the same Python loop in the same run; its corpus is
checked equal to the single-process one.

A third row is the memory of the corpus merge over Parquet shard parts (4 MiB shards of the same
file, as the `processes`/`dask`/`threads` runners deliver them): peak RSS of a fresh process that
merges and writes `documents.parquet` streamed, part by part (`merge_shards(write=...)`, what the
stage does), against one that reads every part first and merges in memory (the stage before)."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import tempfile
import time
import unicodedata
from pathlib import Path

from lexiflow.models.ingest import IngestOptions, ShardResult, build_corpus, ingest_shard, merge_shards, plan_shards
from lexiflow.storage import ArtifactStore
from lexiflow.storage.formats import DOCUMENTS, SHARDED_ROW_GROUP
from lexiflow.storage.writer import ArtifactWriter
from lexiflow.tasks.corpus import documents_writer
from lexiflow.tasks.parts import Part, deliver, received

from benchmarks.corpora import plain_text_file
from benchmarks.harness import Row

# Prefect, Dask and the stages are imported in `run`: the merge's child process imports this module,
# and its peak memory should be the merge's, not theirs.

_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")


def reference(path: Path) -> int:
    seen, docs = set(), 0
    with path.open(encoding="utf-8") as f:
        for line in f:
            text = " ".join(unicodedata.normalize("NFC", line).split())
            if not text:
                continue
            text = "\n".join(_SENTENCE.split(text)).lower()
            key = hashlib.sha1(text.encode()).hexdigest()[:16]
            if key not in seen:
                seen.add(key)
                docs += 1
    return docs


def merge_parts(path: Path, shard_bytes: int, folder: Path, streamed: bool) -> tuple[float, float]:
    """(peak RSS in GB, seconds) of merging the shards of `path` from their parts in a fresh process
    (`python -c`: a multiprocessing child of `python -m benchmarks` would import the harness's modules)."""
    options = IngestOptions()
    meta = []
    for i, shard in enumerate(plan_shards([path], options, shard_bytes)):  # the parts the shard tasks leave
        result = ingest_shard(shard, options)
        deliver(result.documents, str(folder / f"{i:06d}"))
        deliver(result.words, str(folder / f"{i:06d}"), "words")
        meta.append({"texts": list(result.texts.items()), "errors": [[f, *e] for f, e in result.errors.items()]})
    (folder / "meta.json").write_text(json.dumps(meta))
    code = (f"from benchmarks.ingestion import merge_in_this_process as m; "
            f"print(*m({str(path)!r}, {str(folder)!r}, {streamed}))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1])
    peak, seconds = map(float, run.stdout.split())
    return peak, seconds


def merge_in_this_process(path: str, folder: str, streamed: bool) -> tuple[float, float]:
    folder = Path(folder)
    out = ArtifactWriter(folder / "artifact", folder / "scratch", folder / "work")
    out.folder.mkdir()
    results = []
    for i, meta in enumerate(json.loads((folder / "meta.json").read_text())):
        part, words = (Part(str(folder / f"{i:06d}{name}.arrow")) for name in ("", "-words"))
        results.append(ShardResult(received(part, lazy=streamed), dict(meta["texts"]),
                                   {f: tuple(e) for f, *e in meta["errors"]}, received(words)))
    start = time.perf_counter()
    if streamed:
        with out.parquet_parts("documents.parquet", DOCUMENTS, SHARDED_ROW_GROUP) as write:
            merge_shards([Path(path)], results, IngestOptions(), documents_writer(write))
    else:
        corpus = merge_shards([Path(path)], results, IngestOptions())
        out.write_parquet("documents.parquet", corpus.documents, DOCUMENTS, row_group_size=SHARDED_ROW_GROUP)
    seconds = time.perf_counter() - start
    # VmHWM: this process's own peak (ru_maxrss would start from the forking parent's).
    peak_kb = next(int(line.split()[1]) for line in Path("/proc/self/status").read_text().splitlines()
                   if line.startswith("VmHWM:"))
    return peak_kb / 1e6, seconds


def run(quick: bool = False) -> list[Row]:
    from lexiflow.tasks.corpus import ingest_corpus
    from lexiflow.tasks.params import CorpusParams
    from prefect.testing.utilities import prefect_test_harness

    from benchmarks.sharding import cluster, dask_params, time_stage

    size = 5_000_000 if quick else 100_000_000
    with tempfile.TemporaryDirectory() as tmp, prefect_test_harness(server_startup_timeout=120):
        path = plain_text_file(Path(tmp) / "corpus.txt", size)
        megabytes = path.stat().st_size / 1e6
        start = time.perf_counter()
        corpus = build_corpus([path], IngestOptions())
        t_ours = time.perf_counter() - start
        start = time.perf_counter()
        n_ref = reference(path)
        t_ref = time.perf_counter() - start
        with cluster(2) as dask:
            t_dask, ref = time_stage(ingest_corpus, str(Path(tmp) / "store"), {"params": CorpusParams(
                sources=[str(path)])}, dask_params(dask, shard_bytes=path.stat().st_size // 8 + 1))
        sharded = ArtifactStore(ref.store).read_parquet("corpus", ref.version, "documents.parquet")
        merges = {}
        for streamed in (False, True):
            (folder := Path(tmp) / f"parts-{streamed}").mkdir()
            merges[streamed] = merge_parts(path, 4 << 20, folder, streamed)
    assert abs(corpus.stats["documents"] - n_ref) <= 0.01 * n_ref, (corpus.stats["documents"], n_ref)
    assert sharded.equals(corpus.documents), "the sharded corpus differs"
    case = f"{megabytes:.0f} MB WikiText-2 lines, lowercase + sentences + dedupe (+ corpus stats for ours)"
    return [Row("ingestion", case, "MB/s", megabytes / t_ours, megabytes / t_ref, "python line loop", True,
                ">= 50", megabytes / t_ours >= 50),
            Row("ingestion", case + ", corpus stage in 8 shards on 2 Dask workers", "MB/s", megabytes / t_dask,
                megabytes / t_ref, "python line loop", True, ">= 50", megabytes / t_dask >= 50,
                f"single process {megabytes / t_ours:.1f} MB/s in the same run; identical corpus"),
            Row("ingestion", f"{megabytes:.0f} MB: corpus merge + write of 4 MiB shard parts, streamed part by "
                "part (the stage)", "peak RSS GB", merges[True][0], merges[False][0],
                "every part read, then merged (the stage before)", False, "ratio < 1",
                merges[True][0] < merges[False][0],
                f"{merges[True][1]:.1f} s vs {merges[False][1]:.1f} s; includes the interpreter and imports")]
