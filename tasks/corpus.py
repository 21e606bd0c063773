"""Ingestion stages: the `corpus` (documents) and `tagged_corpus` (CoNLL-U words and tags)."""

from __future__ import annotations

import functools
from pathlib import Path

from models import conllu, ingest, text
from storage import ArtifactWriter
from storage.formats import DOCUMENTS, TAGGED
from tasks.params import CorpusParams
from tasks.stage import stage


def options(params: CorpusParams) -> ingest.IngestOptions:
    return ingest.IngestOptions(**params.model_dump(exclude={"sources"}))


@functools.lru_cache(maxsize=256)
def _file_fingerprint(path: Path, size: int, mtime_ns: int) -> dict:
    return ingest.fingerprint([path])[0]


def sources_fingerprint(arguments: dict) -> list[dict]:
    """The corpus version follows the sources' content, not their names (hashed once per process
    while a file's size and mtime stay the same)."""
    files = ingest.resolve_sources(arguments["params"].sources)
    return [_file_fingerprint(p, p.stat().st_size, p.stat().st_mtime_ns) for p in files]


@stage("corpus", code=[ingest, text, conllu], fingerprint=sources_fingerprint)
def ingest_corpus(out: ArtifactWriter, params: CorpusParams) -> None:
    corpus = ingest.build_corpus(ingest.resolve_sources(params.sources), options(params), out.progress)
    out.write_parquet("documents.parquet", corpus.documents, DOCUMENTS)
    out.metrics.update(corpus.stats)


@stage("tagged_corpus", code=[ingest, conllu], fingerprint=sources_fingerprint)
def ingest_tagged(out: ArtifactWriter, params: CorpusParams) -> None:
    tagged = ingest.build_tagged(ingest.resolve_sources(params.sources), options(params), out.progress)
    out.write_parquet("sentences.parquet", tagged, TAGGED)
    per_split = dict(tagged.group_by("split").len().iter_rows())
    out.metrics.update({"sentences": tagged.height, "tokens": int(tagged["words"].list.len().sum()),
                        **{f"sentences_{split}": n for split, n in sorted(per_split.items())}})
