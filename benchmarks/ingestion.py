"""Ingestion throughput on plain text (MB/s): ours (vectorized with polars) vs a straightforward
Python loop doing the same cleaning (NFC, whitespace, sentence split, lowercase, hash, dedupe).

A second row is the `corpus` stage sharded on a warm Dask LocalCluster of 2 worker processes
(byte ranges of the file, merged in order; the whole stage: plan, shard task runs, Parquet parts,
merge, corpus stats, publish), against the same Python loop in the same run; its corpus is
checked equal to the single-process one."""

from __future__ import annotations

import hashlib
import re
import tempfile
import time
import unicodedata
from pathlib import Path

from prefect.testing.utilities import prefect_test_harness

from benchmarks.corpora import plain_text_file
from benchmarks.harness import Row
from benchmarks.sharding import cluster, dask_params, time_stage
from models.ingest import IngestOptions, build_corpus
from storage import ArtifactStore
from tasks.corpus import ingest_corpus
from tasks.params import CorpusParams

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


def run(quick: bool = False) -> list[Row]:
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
    assert abs(corpus.stats["documents"] - n_ref) <= 0.01 * n_ref, (corpus.stats["documents"], n_ref)
    assert sharded.equals(corpus.documents), "the sharded corpus differs"
    case = f"{megabytes:.0f} MB WikiText-2 lines, lowercase + sentences + dedupe (+ corpus stats for ours)"
    return [Row("ingestion", case, "MB/s", megabytes / t_ours, megabytes / t_ref, "python line loop", True,
                ">= 50", megabytes / t_ours >= 50),
            Row("ingestion", case + ", corpus stage in 8 shards on 2 Dask workers", "MB/s", megabytes / t_dask,
                megabytes / t_ref, "python line loop", True, ">= 50", megabytes / t_dask >= 50,
                f"single process {megabytes / t_ours:.1f} MB/s in the same run; identical corpus")]
