"""Ingestion throughput on plain text (MB/s): ours (vectorized with polars) vs a straightforward
Python loop doing the same cleaning (NFC, whitespace, sentence split, lowercase, hash, dedupe)."""

from __future__ import annotations

import hashlib
import re
import tempfile
import time
import unicodedata
from pathlib import Path

from benchmarks.corpora import plain_text_file
from benchmarks.harness import Row
from models.ingest import IngestOptions, build_corpus

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
    with tempfile.TemporaryDirectory() as tmp:
        path = plain_text_file(Path(tmp) / "corpus.txt", size)
        megabytes = path.stat().st_size / 1e6
        start = time.perf_counter()
        corpus = build_corpus([path], IngestOptions())
        t_ours = time.perf_counter() - start
        start = time.perf_counter()
        n_ref = reference(path)
        t_ref = time.perf_counter() - start
    assert abs(corpus.stats["documents"] - n_ref) <= 0.01 * n_ref, (corpus.stats["documents"], n_ref)
    case = f"{megabytes:.0f} MB WikiText-2 lines, lowercase + sentences + dedupe (+ corpus stats for ours)"
    return [Row("ingestion", case, "MB/s", megabytes / t_ours, megabytes / t_ref, "python line loop", True,
                ">= 50", megabytes / t_ours >= 50)]
