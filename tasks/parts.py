"""Shard results: in memory, or a part file (Arrow IPC: tables; sparse matrices as row, col, value).

A shard (or merge) task on a pool's worker returns its large results through `deliver*`: the result itself when
it runs where the stage runs (`part` None), else the `Part` it wrote, which crosses the process boundary instead
of a pickled table; the stage reads parts back with `received`. Count merges add shard matrices
(`sum_matrices`), or cut them into key-space partitions (`row_partitions`) whose merges `join_rows` puts back
together. Used by the runners (tasks/parallel.py) and by the shard functions the workers run (tasks/shards.py),
so it imports neither: a worker loads it without Prefect or the models.
"""

from __future__ import annotations

import json
import shutil
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import polars as pl
import pyarrow as pa
import scipy.sparse as sp
from lexiflow.storage.formats import by_rows
from lexiflow.storage.parquet_concat import Segment
from lexiflow.storage.store import storage_options_for, write_segment


@dataclass(frozen=True)
class Part:
    """A shard result written to a file (what crosses the process boundary instead): a local path, or a
    URL of the store's staging area. Arrow IPC, uncompressed: a part is written once and read once, in the
    tables' own memory layout, so neither side encodes or decodes it, and a local part is read memory-mapped
    (the encoding stage's 16 parts at 1 GB: 1.2 CPU s to read as uncompressed Parquet, 0.1 s as IPC)."""

    path: str
    batch: int | None = None  # one record batch of the file (a key-space partition), or the whole file


def filesystem(path: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """The filesystem of a part's path or URL (an object store's options as the store has them)."""
    return fsspec.core.url_to_fs(path, **storage_options_for(path))


def deliver(result: pl.DataFrame | sp.spmatrix, part: str | None, name: str = "") -> Any:
    """The shard's result itself (`part` None), or the `Part` it was written to (`name` tells apart
    several results of one shard)."""
    if part is None:
        return result
    path = f"{part}{'-' + name if name else ''}.arrow"
    if isinstance(result, pl.DataFrame):
        fs, target = filesystem(path)
        with fs.open(target, "wb") as f:
            result.write_ipc(f, compression="uncompressed")
    else:
        _write_batches(path, [_triplets(result)])
    return Part(path)


def deliver_row_groups(table: pl.DataFrame, part: str | None, schema: pa.Schema, row_group_size: int,
                       name: str = "rows") -> Segment:
    """A shard's rows of an artifact's table, encoded and compressed here as the artifact's row groups
    (`schema`, row groups of `row_group_size` from the shard's first row): a `Segment` the process writing the
    artifact appends as bytes (`ArtifactWriter.parquet_parts`), in memory (`part` None) or as a file. So a
    table that only concatenates shards is encoded by the workers, in parallel, and only copied by that process."""
    return write_segment(table, schema, row_group_size, None if part is None else f"{part}-{name}.parquet")


def deliver_partitions(blocks: list[sp.spmatrix], part: str | None, name: str) -> list[Any]:
    """A shard's key-space partitions (`row_partitions`): themselves (`part` None), or one file holding
    partition p in record batch p, as one `Part` per partition (a merge reads only its batch)."""
    if part is None:
        return blocks
    path = f"{part}-{name}.arrow"
    _write_batches(path, [_triplets(block) for block in blocks])
    return [Part(path, p) for p in range(len(blocks))]


def _write_batches(path: str, batches: list[pa.RecordBatch]) -> None:
    fs, target = filesystem(path)
    with fs.open(target, "wb") as f, pa.ipc.new_file(f, batches[0].schema) as writer:
        for batch in batches:
            writer.write_batch(batch)  # one batch each, even when empty


def _triplets(matrix: sp.spmatrix) -> pa.RecordBatch:
    """A sparse matrix as (row, col, value) columns in CSR order (by row, then column; no duplicates), its
    shape in the schema's metadata. Indices are int32 where the shape allows and integer values int32 where
    they fit (a shard's counts): half the bytes of int64 to write, to move through an object store and to
    read back (`_from_triplets`)."""
    rows, cols, values = by_rows(matrix, np.int32 if max(matrix.shape) <= np.iinfo(np.int32).max else np.int64)
    if values.dtype.kind == "i" and _fits_int32(values):
        values = values.astype(np.int32)
    batch = pa.record_batch({"row": rows, "col": cols, "value": values})
    return batch.replace_schema_metadata({"shape": json.dumps(list(matrix.shape))})


def _fits_int32(values: np.ndarray) -> bool:
    limits = np.iinfo(np.int32)
    return not len(values) or (limits.min <= values.min() and values.max() <= limits.max)


def _from_triplets(table: pa.Table | pa.RecordBatch, shape: tuple[int, int]) -> sp.csr_matrix:
    """The CSR matrix of `_triplets`' columns: its rows come sorted, so the row pointer is their running count
    (no sort, no duplicates to add); integer values come back int64, so that sums of them stay exact."""
    rows, cols, values = (table[name].to_numpy() for name in ("row", "col", "value"))
    if values.dtype.kind == "i":
        values = values.astype(np.int64, copy=False)
    indptr = np.concatenate(([0], np.cumsum(np.bincount(rows, minlength=shape[0]))))
    return sp.csr_matrix((values, cols, indptr), shape=shape)


def received(result: Any, lazy: bool = False, downloads: Path | None = None) -> Any:
    """A shard's result with its `Part`s (also inside a tuple) read back (tables as LazyFrames with
    `lazy`: a part on an object store is first downloaded into `downloads`, a local folder)."""
    if isinstance(result, tuple):
        return tuple(received(item, lazy, downloads) for item in result)
    if not isinstance(result, Part):
        return result
    fs, path = filesystem(result.path)
    local = isinstance(fs, fsspec.implementations.local.LocalFileSystem)
    if lazy and downloads is not None and not local:
        downloads.mkdir(parents=True, exist_ok=True)
        target = downloads / path.rsplit("/", 1)[-1]
        fs.get_file(path, str(target))
        path, local = str(target), True
    with pa.memory_map(path) if local else fs.open(path, "rb") as f:
        reader = pa.ipc.open_file(f)
        metadata = reader.schema.metadata or {}
        if b"shape" not in metadata:
            return pl.scan_ipc(path) if lazy and local else pl.from_arrow(reader.read_all())
        table = reader.read_all() if result.batch is None else reader.get_batch(result.batch)
    return _from_triplets(table, tuple(json.loads(metadata[b"shape"])))


def part_paths(results: Any) -> list[str]:
    """The files of these results' parts and segments."""
    if isinstance(results, list | tuple):
        return [path for item in results for path in part_paths(item)]
    if isinstance(results, Segment) and isinstance(results.source, str):
        return [results.source]
    return [results.path] if isinstance(results, Part) else []


def remove_folder(folder: str) -> None:
    fs, path = filesystem(folder)
    with suppress(OSError):
        if isinstance(fs, fsspec.implementations.local.LocalFileSystem):
            shutil.rmtree(path, ignore_errors=True)
        elif fs.exists(path):
            fs.rm(path, recursive=True)


def sum_matrices(matrices: list[sp.spmatrix], shape: tuple[int, int] | None = None) -> sp.csr_matrix:
    """Sum of shard matrices (exact for integer counts, in any order), of `shape` (default: the largest
    of theirs; smaller ones are padded). Added in pairs, level by level: CSR additions are linear merges
    of sorted rows (no sort), and each entry goes through log2(n) of them, not n as in a chain onto one
    growing total."""
    shape = shape or tuple(max(m.shape[axis] for m in matrices) for axis in (0, 1))
    level = []
    for matrix in matrices:
        matrix = matrix.tocsr()
        if matrix.shape != shape:
            matrix = matrix.copy()
            matrix.resize(shape)
        level.append(matrix)
    while len(level) > 1:
        level = [level[i] + level[i + 1] if i + 1 < len(level) else level[i] for i in range(0, len(level), 2)]
    return level[0]


def join_rows(blocks: list[sp.csr_matrix]) -> sp.csr_matrix:
    """One matrix from blocks of the same shape holding disjoint rows (the merges of `row_partitions`):
    each row's entries moved, not added (a sum would merge every row with the others' empty ones)."""
    lengths = [np.diff(block.indptr) for block in blocks]
    if int(np.max(np.sum([length > 0 for length in lengths], axis=0), initial=0)) > 1:
        raise ValueError("join_rows: two blocks hold entries of the same row; add them (sum_matrices)")
    indptr = np.concatenate(([0], np.cumsum(np.sum(lengths, axis=0, dtype=np.int64))))
    indices = np.empty(indptr[-1], dtype=np.result_type(*(block.indices for block in blocks)))
    data = np.empty(indptr[-1], dtype=np.result_type(*(block.data for block in blocks)))
    for block, length in zip(blocks, lengths, strict=True):
        # the j-th entry of row r: at block.indptr[r] + j in the block, at indptr[r] + j in the whole
        where = np.repeat(indptr[:-1] - block.indptr[:-1], length) + np.arange(block.nnz)
        indices[where], data[where] = block.indices, block.data
    return sp.csr_matrix((data, indices, indptr), shape=blocks[0].shape)


def row_partitions(matrix: sp.spmatrix, partitions: int) -> list[sp.csr_matrix]:
    """Partition p = the rows r ≡ p (mod partitions) of `matrix`, each of the full shape (other rows
    empty). Interleaved rather than ranges: ids are in frequency order, so the dense low rows spread
    over every partition."""
    matrix = matrix.tocsr()
    lengths = np.diff(matrix.indptr)
    blocks = []
    for p in range(partitions):
        rows = np.arange(p, matrix.shape[0], partitions)
        sub = matrix[rows]
        kept = np.zeros(matrix.shape[0], dtype=np.int64)
        kept[rows] = lengths[rows]
        indptr = np.concatenate(([0], np.cumsum(kept)))
        blocks.append(sp.csr_matrix((sub.data, sub.indices, indptr), shape=matrix.shape))
    return blocks
