"""Writing an artifact's files while it is staged (`ArtifactWriter`), and Parquet row groups written elsewhere
(`write_segment`, on a shard worker) for `ArtifactWriter.parquet_parts` to append."""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

import fsspec
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from lexiflow.storage.files import storage_options_for
from lexiflow.storage.manifests import MANIFEST, SHARED_SUFFIX, StoreError, sha256_of, validate_file_name
from lexiflow.storage.parquet_concat import ParquetAssembler, Segment, write_row_groups

# Parquet tables the store writes carry a CRC per page, checked when they are read (docs/reliability.md).
PARQUET_OPTIONS: dict[str, Any] = {"compression": "zstd", "write_page_checksum": True}


def write_segment(rows: pl.DataFrame | pa.Table, schema: pa.Schema, row_group_size: int,
                  path: str | None = None) -> Segment:
    """`rows` as row groups of a table of `schema` written with the store's options, for
    `ArtifactWriter.parquet_parts` to append: in memory (`path` None) or as the file at `path` (a local path
    or a store URL)."""
    table = rows.to_arrow() if isinstance(rows, pl.DataFrame) else rows
    table = table.select(schema.names).cast(schema)
    if path is None:
        encoded = pa.BufferOutputStream()
        write_row_groups(encoded, table, row_group_size, **PARQUET_OPTIONS)
        return Segment(encoded.getvalue().to_pybytes(), table.num_rows)
    with fsspec.open(path, "wb", **storage_options_for(path)) as f:
        write_row_groups(f, table, row_group_size, **PARQUET_OPTIONS)
    return Segment(path, table.num_rows)


def read_segment(segment: Segment, columns: list[str] | None = None) -> pl.DataFrame:
    """The rows of a `write_segment` (its `columns`)."""
    if isinstance(segment.source, bytes):
        return pl.read_parquet(io.BytesIO(segment.source), columns=columns)
    with fsspec.open(segment.source, "rb", **storage_options_for(segment.source)) as f:
        return pl.read_parquet(f, columns=columns)


class ArtifactWriter:
    """Files and metrics of an artifact being staged. Paths are local, whatever the store."""

    def __init__(self, folder: Path, scratch: Path, work: Path, shared: str | None = None) -> None:
        self.folder = folder
        self.scratch = scratch  # resumable state, kept until the artifact is published
        # This writer's own files of this attempt (shard results, a job for DDP ranks): unlike the
        # scratch folder, no other writer of the same version shares it. Removed when the writer ends.
        self.work = work
        # The same, for files other machines read or write (shard parts on a cluster): a folder in the
        # store's staging area, as a path (local stores) or URL (object stores: open it with fsspec).
        self.shared = shared if shared is not None else str(work) + SHARED_SUFFIX
        self.metrics: dict[str, Any] = {}
        self.progress: Callable[[float | None], None] | None = None  # set by the caller, fed by the builder
        # sha256 of files hashed as they were written (`parquet_parts`), with the (inode, size, mtime) they had
        # then: `file_entries` need not read them back (a 400 MB file: ~0.3 s at the end of the stage)
        self._digests: dict[str, tuple[str, tuple[int, int, int]]] = {}

    def path(self, name: str) -> Path:
        """Where to write file `name` (for libraries that write to a path themselves)."""
        return self.folder / validate_file_name(name)

    def write_parquet(self, name: str, data: pl.DataFrame | pa.Table, schema: pa.Schema | None = None,
                      row_group_size: int | None = None) -> Path:
        """`row_group_size`: rows per row group (smaller groups let shards read only their rows)."""
        table = data.to_arrow() if isinstance(data, pl.DataFrame) else data
        if schema is not None:
            table = table.select(schema.names).cast(schema)
        path = self.path(name)
        write_row_groups(path, table, row_group_size, **PARQUET_OPTIONS)  # as parquet_parts writes rows
        return path

    @contextmanager
    def parquet_parts(self, name: str, schema: pa.Schema, row_group_size: int) -> Iterator[Callable[[Any], None]]:
        """Write a table part by part, in order, without holding it whole: yields `write(part)`, a part being
        a polars or Arrow table, encoded here, or a `Segment`: row groups encoded elsewhere (a shard worker's
        `write_segment`), appended byte for byte. Tables are regrouped into row groups of exactly
        `row_group_size`, as `write_parquet` cuts the whole table (the same bytes however the rows came); a
        segment ends the row group before it."""
        pending: list[pa.Table] = []
        path = self.path(name)
        with open(path, "wb") as f:
            sink = _Digesting(f)
            assembler = ParquetAssembler(sink)
            empty = io.BytesIO()
            pq.ParquetWriter(empty, schema, **PARQUET_OPTIONS).close()
            assembler.append(empty)  # the footer's template: schema and writer (and the file of no rows)

            def flush(all_rows: bool) -> None:
                held = pa.concat_tables(pending).combine_chunks()
                rows = held.num_rows if all_rows else held.num_rows - held.num_rows % row_group_size
                if rows:
                    encoded = io.BytesIO()
                    write_row_groups(encoded, held.slice(0, rows), row_group_size, **PARQUET_OPTIONS)
                    assembler.append(encoded)
                    pending[:] = [held.slice(rows)]

            def write(part: Any) -> None:
                if isinstance(part, Segment):  # its row groups as they are, after the rows before it
                    if not part.rows:
                        return
                    if pending:
                        flush(all_rows=True)
                        pending.clear()
                    with (io.BytesIO(part.source) if isinstance(part.source, bytes)
                          else fsspec.open(part.source, "rb", **storage_options_for(part.source))) as source:
                        assembler.append(source, f"{name} ({part!r})")
                    return
                table = part.to_arrow() if isinstance(part, pl.DataFrame) else part
                pending.append(table.select(schema.names).cast(schema))
                flush(all_rows=False)

            yield write
            if pending:
                flush(all_rows=True)
            assembler.close()
        self._digests[name] = (sink.digest.hexdigest(), _identity(path))

    def write_json(self, name: str, obj: Any) -> Path:
        path = self.path(name)
        path.write_text(json.dumps(obj, indent=2, default=str))
        return path

    def write_text(self, name: str, text: str) -> Path:
        path = self.path(name)
        path.write_text(text, encoding="utf-8")
        return path

    def file_entries(self) -> list[dict[str, Any]]:
        entries = []
        for file in sorted(self.folder.iterdir()):
            if file.name == MANIFEST:
                continue
            if file.is_symlink() or not file.is_file():  # a link could point readers outside the store
                raise StoreError(f"artifact files must be plain files, found {file.name!r}")
            digest, identity = self._digests.get(file.name, ("", None))
            if identity != _identity(file):  # not written by parquet_parts, or changed since
                with file.open("rb") as f:
                    digest = sha256_of(f)
            entries.append({"name": file.name, "size": file.stat().st_size, "sha256": digest})
        return entries


class _Digesting:
    """A binary file written in order, hashed (sha256) as it is written."""

    def __init__(self, f: BinaryIO) -> None:
        self.f, self.digest = f, hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        return self.f.write(data)


def _identity(path: Path) -> tuple[int, int, int]:
    """What changes when a file is replaced or rewritten: inode, size, modification time."""
    stat = path.stat()
    return stat.st_ino, stat.st_size, stat.st_mtime_ns
