"""Ingestion stages: the `corpus` (documents) and `tagged_corpus` (CoNLL-U words and tags)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from lexiflow.models import ingest
from lexiflow.models.config import from_section
from lexiflow.storage import ArtifactWriter
from lexiflow.storage.formats import DOCUMENTS, SHARDED_ROW_GROUP, TAGGED
from lexiflow.tasks.parallel import SHARD_TASK, deliver, map_shards
from lexiflow.tasks.params import CorpusParams, ParallelParams
from lexiflow.tasks.stage import stage
from prefect import task


def options(params: CorpusParams) -> ingest.IngestOptions:
    return from_section(ingest.IngestOptions, params)


@functools.lru_cache(maxsize=256)
def _file_fingerprint(path: Path, size: int, mtime_ns: int) -> dict:
    return ingest.fingerprint([path])[0]


def _fingerprints(files: list[Path]) -> list[dict]:
    return [_file_fingerprint(p, p.stat().st_size, p.stat().st_mtime_ns) for p in files]


def sources_fingerprint(arguments: dict) -> list[dict]:
    """The corpus version follows the sources' content, not their names (hashed once per process
    while a file's size and mtime stay the same)."""
    return _fingerprints(ingest.resolve_sources(arguments["params"].sources))


# The tagged corpus reads only the CoNLL-U sources and these settings (not lowercase, dedupe, ...):
# its version, and so the taggers', follows nothing else.
TAGGED_SETTINGS = {"valid_fraction", "test_fraction", "max_file_bytes", "bad_files"}


def conllu_fingerprint(arguments: dict) -> list[dict]:
    return _fingerprints(ingest.tagged_files(ingest.resolve_sources(arguments["params"].sources)))


def tagged_parameters(arguments: dict) -> dict:
    return {"params": arguments["params"].model_dump(mode="json", include=TAGGED_SETTINGS)}


@task(name="corpus-shard", **SHARD_TASK)
def corpus_shard(shard: list[ingest.FileRange], options: ingest.IngestOptions, part: str | None
                 ) -> tuple[Any, dict[int, int], dict[int, tuple[int, int, str]]]:
    """Read and clean one shard of the sources (documents delivered in memory or as a part)."""
    result = ingest.ingest_shard(shard, options)
    return deliver(result.documents, part), result.texts, result.errors


@stage("corpus", fingerprint=sources_fingerprint)
def ingest_corpus(out: ArtifactWriter, params: CorpusParams, parallel: ParallelParams | None = None) -> None:
    """Shards of the sources (byte ranges of large text/JSONL files, groups of whole files) are
    read and cleaned in parallel, then merged in order: the same corpus as one process makes."""
    parallel = parallel or ParallelParams()
    files, opts = ingest.resolve_sources(params.sources), options(params)
    shards = ingest.plan_shards(files, opts, parallel.shard_bytes)
    if len(shards) == 1:  # the common small case: byte-level progress, nothing to merge
        corpus = ingest.build_corpus(files, opts, out.progress)
        out.write_parquet("documents.parquet", corpus.documents, DOCUMENTS, row_group_size=SHARDED_ROW_GROUP)
    else:  # the merge streams: one shard's documents in memory at a time (docs/scaling.md)
        results = map_shards(corpus_shard, [{"shard": shard, "options": opts} for shard in shards], parallel,
                             "corpus", out, lazy=True)
        with out.parquet_parts("documents.parquet", DOCUMENTS, SHARDED_ROW_GROUP) as write:
            corpus = ingest.merge_shards(files, [ingest.ShardResult(*result) for result in results], opts, write)
    out.metrics.update(corpus.stats)


@stage("tagged_corpus", fingerprint=conllu_fingerprint,
       parameters=tagged_parameters)
def ingest_tagged(out: ArtifactWriter, params: CorpusParams) -> None:
    tagged = ingest.build_tagged(ingest.resolve_sources(params.sources), options(params), out.progress)
    out.write_parquet("sentences.parquet", tagged, TAGGED)
    per_split = dict(tagged.group_by("split").len().iter_rows())
    out.metrics.update({"sentences": tagged.height, "tokens": int(tagged["words"].list.len().sum()),
                        **{f"sentences_{split}": n for split, n in sorted(per_split.items())}})
