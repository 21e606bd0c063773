"""The sharded stages' partial results per piece, in the store (`lexiflow.storage.pieces`): what each source
piece gave the corpus (`CorpusPieces`, the `models.ingest.PieceCache` a corpus shard is given), and per run of
documents (`RunPieces`) its word counts, its word-level encoding and its n-gram counts (tasks/ngram_pieces.py:
apart, so that the corpus stages' code versions do not follow the n-gram model's). Both
classes are plain picklable values, sent with the shard calls to any runner's workers, which read and write the
pieces in the store at its URL (docs/design.md, "Incremental rebuilds"). Like tasks/shards.py, nothing here
imports Prefect or the stage modules."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
from lexiflow.models.ingest.pieces import PieceRecord
from lexiflow.storage import ArtifactRef, ArtifactStore
from lexiflow.storage.formats import read_table
from lexiflow.storage.pieces import commit_piece, new_file, piece_key, read_piece

_log = logging.getLogger("lexiflow.pieces")

CORPUS = "corpus"
WORD_COUNTS = "word_counts"
ENCODED = "encoded"  # word-level encoding: each run's words as run-local ids, remapped to any vocabulary


def _write_ipc(store: ArtifactStore, path: str, tables: list[pa.Table], schema: pa.Schema) -> None:
    with store.fs.open(path, "wb") as f, pa.ipc.new_file(f, schema) as writer:
        for table in tables:  # one batch each, empty ones too: batch i is table i
            batches = table.cast(schema).combine_chunks().to_batches() if table.num_rows else []
            writer.write_batch(batches[0] if batches else pa.RecordBatch.from_pylist([], schema=schema))


def _read_ipc(store: ArtifactStore, path: str) -> list[pa.RecordBatch]:
    if store.is_local:
        reader = pa.ipc.open_file(pa.memory_map(path))
    else:
        with store.fs.open(path, "rb") as f:
            reader = pa.ipc.open_file(pa.py_buffer(f.read()))
    return [reader.get_batch(i) for i in range(reader.num_record_batches)]


@dataclass(frozen=True)
class CorpusPieces:
    """Pieces of the corpus stage: per source part (a file, a byte range, a range of bz2 streams), keyed by
    the file's content (its fingerprint, which holds its name: documents carry it), where the part lies in it,
    and `salt` (the stage's code version, the ingestion options and the chunk size, which decides chunks)."""

    store: str
    salt: str
    files: tuple[dict, ...]  # the sources' fingerprints (models.ingest.fingerprint), by file number

    def key(self, part: Any) -> str:
        where = {k: v for k, v in dataclasses.asdict(part).items() if k not in ("path", "file")}
        return piece_key(self.salt, {"source": self.files[part.file], "part": where, "type": type(part).__name__})

    def get(self, part: Any) -> PieceRecord | None:
        store = ArtifactStore(self.store)
        meta = read_piece(store, CORPUS, self.key(part))
        if meta is None:
            return None
        documents = [pl.from_arrow(pa.Table.from_batches([batch])) for batch in
                     _read_ipc(store, f"{meta['folder']}/{meta['files']['documents']}")]
        words = _read_ipc(store, f"{meta['folder']}/{meta['files']['words']}")
        distinct = pa.concat_arrays([batch.column(0) for batch in words]) if words else pa.array([], pa.large_string())
        return PieceRecord([tuple(chunk) for chunk in meta["chunks"]], documents, distinct)

    def put(self, part: Any, record: PieceRecord) -> None:
        store, key = ArtifactStore(self.store), self.key(part)
        if read_piece(store, CORPUS, key) is not None:
            return
        tables = [docs.to_arrow() for docs in record.documents]
        schema = tables[0].schema if tables else pa.schema([])
        documents, words = new_file(store, CORPUS, key, "documents"), new_file(store, CORPUS, key, "words")
        _write_ipc(store, documents, tables, schema)
        word_schema = pa.schema([("word", pa.large_string())])
        _write_ipc(store, words, [pa.table({"word": record.words.cast(pa.large_string())})], word_schema)
        commit_piece(store, CORPUS, key, {"chunks": record.chunks, "files": {
            "documents": documents.rsplit("/", 1)[1], "words": words.rsplit("/", 1)[1]}})


def log_reuse(stage: str, reused: int, total: int, what: str) -> None:
    """One line in the run's log: how much of a stage's work the store's pieces saved (an operator's check
    that a scheduled rebuild was incremental)."""
    _log.info("%s: %d of %d %s taken from the store's pieces, %d computed", stage, reused, total, what,
              total - reused)


# ---- word counts: runs of documents cut where their content says --------------------------------------
PIECE_DOCUMENTS = 4096  # documents per word-count piece, on average


def content_cuts(doc_ids: pl.Series, start: int, stop: int) -> list[tuple[int, int]]:
    """Rows [start, stop) cut after each document whose id (a hash of its text) falls in 1/PIECE_DOCUMENTS of
    the hash space: the cuts travel with the documents, so a document added, removed or edited moves none but
    the cut of its own run, and the runs around it are the same content as before (content-defined chunking)."""
    codes = doc_ids.str.slice(0, 8).str.to_integer(base=16).to_numpy()
    ends = (np.flatnonzero(codes % PIECE_DOCUMENTS == 0) + 1 + start).tolist()
    cuts = [start, *[end for end in ends if end < stop], stop]
    return [(a, b) for a, b in zip(cuts, cuts[1:], strict=False) if b > a]


def run_aligned(corpus: ArtifactRef, ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """A corpus's shard `ranges` with each cut between two moved to the nearest run cut (`content_cuts` over the
    whole corpus) within half a shard of it, so that no shard boundary splits a run: the runs are then the
    content's alone, and a rebuild after an append recounts the new documents' runs, not two runs at every shard
    boundary, which moves with the corpus's size (1 % appended to 300 MB in 10 shards: 19 runs recounted, of
    which 2 held new documents). A cut with no run cut that near stays (shards smaller than runs keep their
    parallelism; the runs it splits are recounted when it moves)."""
    if len(ranges) < 2:
        return ranges
    doc_ids = read_table(corpus, "documents.parquet", ["doc_id"])["doc_id"]
    run_ends = np.array([b for _, b in content_cuts(doc_ids, 0, len(doc_ids))[:-1]], dtype=np.int64)
    if not len(run_ends):
        return ranges
    wanted = np.array([b for _, b in ranges[:-1]], dtype=np.int64)
    right = np.minimum(np.searchsorted(run_ends, wanted), len(run_ends) - 1)
    left = np.maximum(right - 1, 0)
    nearest = np.where(np.abs(run_ends[left] - wanted) <= np.abs(run_ends[right] - wanted), run_ends[left],
                       run_ends[right])
    reach = (ranges[-1][1] - ranges[0][0]) / len(ranges) / 2
    cuts = np.where(np.abs(nearest - wanted) <= reach, nearest, wanted)
    bounds = [ranges[0][0], *sorted(set(cuts.tolist())), ranges[-1][1]]
    return [(a, b) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


@dataclass(frozen=True)
class RunPieces:
    """Pieces of a stage that reads the corpus by rows (`stage`: their folder), one per run of documents
    (`content_cuts`), keyed by the run's documents (ids, which hash their texts, and splits) and `salt` (the
    stage's code version): tables and a little metadata."""

    store: str
    salt: str
    stage: str

    def key(self, rows: pl.DataFrame) -> str:
        content = rows.select(pl.concat_str(["doc_id", "split"], separator=":").str.join(",")).item()
        return piece_key(self.salt, content or "")

    def runs(self, documents: pl.DataFrame) -> Iterator[tuple[int, pl.DataFrame, str, Any]]:
        """The runs of these documents (`content_cuts`): (first row, rows, key, the run's piece or None)."""
        for a, b in content_cuts(documents["doc_id"], 0, documents.height):
            rows = documents.slice(a, b - a)
            key = self.key(rows)
            yield a, rows, key, self.get(key)

    def get(self, key: str) -> tuple[dict[str, pl.DataFrame], dict] | None:
        store = ArtifactStore(self.store)
        meta = read_piece(store, self.stage, key)
        if meta is None:
            return None
        tables = {name: pl.from_arrow(pa.Table.from_batches(_read_ipc(store, f"{meta['folder']}/{file}")))
                  for name, file in meta["files"].items()}
        return tables, meta["meta"]

    def put(self, key: str, tables: dict[str, pl.DataFrame], meta: dict) -> None:
        store = ArtifactStore(self.store)
        if read_piece(store, self.stage, key) is not None:
            return
        files = {}
        for name, frame in tables.items():
            path = new_file(store, self.stage, key, name)
            table = frame.to_arrow()
            _write_ipc(store, path, [table], table.schema)
            files[name] = path.rsplit("/", 1)[1]
        commit_piece(store, self.stage, key, {"files": files, "meta": meta})


def vocabulary_ids(words: Any, distinct: pl.Series) -> np.ndarray:
    """The ids a word tokenizer (`tokenizers.load`) gives a run's distinct words (<unk> for those it lacks): the
    array that takes the run's local ids to this vocabulary's."""
    return words.encode_batch(distinct.cast(pl.String).implode(), is_pretokenized=True)[0].to_numpy()
