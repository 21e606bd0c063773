"""Ingestion stages: the `corpus` (documents) and `tagged_corpus` (CoNLL-U words and tags)."""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
from lexiflow.models import ingest
from lexiflow.models.config import from_section
from lexiflow.storage import ArtifactStore, ArtifactWriter
from lexiflow.storage.formats import DOCUMENTS, SHARDED_ROW_GROUP, TAGGED
from lexiflow.storage.parquet_concat import Segment
from lexiflow.storage.pieces import piece_key, read_piece, record_uses
from lexiflow.storage.store import read_segment, write_segment
from lexiflow.tasks.parallel import stream_shards
from lexiflow.tasks.params import CorpusParams, ParallelParams
from lexiflow.tasks.parts import deliver, received
from lexiflow.tasks.pieces import CORPUS, CorpusPieces, log_reuse
from lexiflow.tasks.shards import corpus_shard
from lexiflow.tasks.stage import stage


def options(params: CorpusParams) -> ingest.IngestOptions:
    return from_section(ingest.IngestOptions, params)


@functools.lru_cache(maxsize=256)
def _file_fingerprint(path: Path, size: int, mtime_ns: int) -> dict:
    return ingest.fingerprint([path])[0]


def source_fingerprints(files: list[Path]) -> list[dict]:
    return [_file_fingerprint(p, p.stat().st_size, p.stat().st_mtime_ns) for p in files]


def sources_fingerprint(arguments: dict) -> list[dict]:
    """The corpus version follows the sources' content, not their names (hashed once per process
    while a file's size and mtime stay the same)."""
    return source_fingerprints(ingest.resolve_sources(arguments["params"].sources))


# The tagged corpus reads only the CoNLL-U sources and these settings (not lowercase, dedupe, ...):
# its version, and so the taggers', follows nothing else.
TAGGED_SETTINGS = {"valid_fraction", "test_fraction", "max_file_bytes", "bad_files"}


def conllu_fingerprint(arguments: dict) -> list[dict]:
    return source_fingerprints(ingest.tagged_files(ingest.resolve_sources(arguments["params"].sources)))


def tagged_parameters(arguments: dict) -> dict:
    return {"params": arguments["params"].model_dump(mode="json", include=TAGGED_SETTINGS)}


def documents_writer(write: Callable[[Any], None]) -> Callable[[pl.DataFrame, Segment | None, Segment | None], None]:
    """`merge_shards`'s `write` onto `parquet_parts`' one for documents.parquet: each table of kept documents
    its own row groups, those its shard encoded when the merge keeps them all, else encoded here (so the file
    is the same on every runner), the texts of a table delivered without them taken from its shard's rows."""
    def write_table(docs: pl.DataFrame, encoded: Segment | None, texts: Segment | None) -> None:
        if encoded is None and "text" not in docs.columns:
            by_id = read_segment(texts, ["doc_id", "text"]).unique("doc_id")  # one text per id
            docs = docs.join(by_id, on="doc_id", how="left", maintain_order="left").select(DOCUMENTS.names)
        write(encoded or write_segment(docs, DOCUMENTS, SHARDED_ROW_GROUP))

    return write_table


def spill_to(folder: Path) -> Callable[[pl.DataFrame], pl.LazyFrame]:
    """Where the single-shard path puts a shard's cleaned batches once it has several: parts."""
    batch = itertools.count()

    def spill(docs: pl.DataFrame) -> pl.LazyFrame:
        folder.mkdir(parents=True, exist_ok=True)
        return received(deliver(docs, str(folder / "batch"), f"{next(batch):05d}"), lazy=True)

    return spill


def corpus_pieces(out: ArtifactWriter, files: list[Path], opts: ingest.IngestOptions, parallel: ParallelParams,
                  shards: list[list]) -> CorpusPieces | None:
    """The corpus pieces of this build (None with `parallel.pieces` off, or a writer without a store: a test's),
    their keys recorded as the artifact's before any is written (`storage.pieces.record_uses`: gc keeps them)."""
    store, version = getattr(out, "store_url", None), getattr(out, "version", None)
    if not parallel.pieces or store is None:
        return None
    salt = piece_key(out.code_version, {"options": dataclasses.asdict(opts), "chunk_bytes": parallel.shard_bytes})
    pieces = CorpusPieces(store, salt, tuple(source_fingerprints(files)))
    keys = [pieces.key(part) for shard in shards for part in shard]
    log_reuse("corpus", sum(read_piece(ArtifactStore(store), CORPUS, key) is not None for key in keys), len(keys),
              "source parts (files, byte ranges)")
    if version is not None:
        record_uses(ArtifactStore(store), "corpus", version, {CORPUS: keys})
    return pieces


@stage("corpus", fingerprint=sources_fingerprint)
def ingest_corpus(out: ArtifactWriter, params: CorpusParams, parallel: ParallelParams | None = None) -> None:
    """Shards of the sources (byte ranges of large text/JSONL files, groups of whole files) are
    read and cleaned in parallel, then merged in order: the same corpus as one process makes."""
    parallel = parallel or ParallelParams()
    files, opts = ingest.resolve_sources(params.sources), options(params)
    shards = ingest.plan_shards(files, opts, parallel.shard_bytes)
    pieces = corpus_pieces(out, files, opts, parallel, shards)
    if len(shards) == 1:  # the common small case: byte-level progress, no pool (a large file spills its batches)
        results = [ingest.ingest_shard(shards[0], opts, out.progress, parallel.shard_bytes,
                                       spill_to(out.work / "batches"), pieces)]
    else:  # merged in order as they finish, while later shards run
        results = (ingest.ShardResult(*result) for result in stream_shards(
            corpus_shard, [{"shard": shard, "options": opts, "chunk_bytes": parallel.shard_bytes, "pieces": pieces}
                           for shard in shards],
            parallel, "corpus", out, lazy=True))
    if isinstance(results, list) and isinstance(results[0].documents, pl.DataFrame):  # in memory: nothing to merge
        corpus = ingest.merge_shards(files, results, opts)
        out.write_parquet("documents.parquet", corpus.documents.rechunk(), DOCUMENTS,  # bytes: see parquet_parts
                          row_group_size=SHARDED_ROW_GROUP)
    else:  # the merge streams: one batch of documents in memory at a time (docs/scaling.md)
        with out.parquet_parts("documents.parquet", DOCUMENTS, SHARDED_ROW_GROUP) as write:
            corpus = ingest.merge_shards(files, results, opts, documents_writer(write))
    out.metrics.update(corpus.stats)


@stage("tagged_corpus", fingerprint=conllu_fingerprint,
       parameters=tagged_parameters)
def ingest_tagged(out: ArtifactWriter, params: CorpusParams) -> None:
    tagged = ingest.build_tagged(ingest.resolve_sources(params.sources), options(params), out.progress)
    out.write_parquet("sentences.parquet", tagged, TAGGED)
    per_split = dict(tagged.group_by("split").len().iter_rows())
    out.metrics.update({"sentences": tagged.height, "tokens": int(tagged["words"].list.len().sum()),
                        **{f"sentences_{split}": n for split, n in sorted(per_split.items())}})
