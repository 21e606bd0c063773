"""Parquet schemas of lexiflow's tables, and readers/writers for the ones with structure
(sparse matrices, vectors). Every table is readable by polars, pyarrow, DuckDB or Spark without
lexiflow: see docs/artifacts.md."""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import scipy.sparse as sp
from lexiflow.storage.parquet_concat import Segment
from lexiflow.storage.store import (
    PARQUET_OPTIONS,
    ArtifactRef,
    ArtifactStore,
    ArtifactWriter,
    retry_transient,
    write_segment,
)

# Row groups of the tables that row-range shards read (documents, tokenized sentences): a shard
# reads only the groups holding its rows (`read_rows`), not the whole file.
SHARDED_ROW_GROUP = 65_536

DOCUMENTS = pa.schema([("doc_id", pa.string()), ("source", pa.string()), ("split", pa.string()),
                       ("text", pa.large_string())])
TAGGED = pa.schema([("sent_id", pa.string()), ("source", pa.string()), ("split", pa.string()),
                    ("words", pa.list_(pa.string())), ("upos", pa.list_(pa.string())),
                    ("xpos", pa.list_(pa.string()))])
VOCAB = pa.schema([("id", pa.uint32()), ("token", pa.string()), ("count", pa.uint64())])
TOKENS = pa.schema([("doc_index", pa.uint32()), ("sentence", pa.uint32()), ("split", pa.string()),
                    ("ids", pa.list_(pa.uint32()))])
PAIRS = pa.schema([("pair_id", pa.string()), ("source_file", pa.string()), ("split", pa.string()),
                   ("source", pa.string()), ("target", pa.string())])  # the parallel corpus
MATRIX = pa.schema([("row", pa.uint32()), ("col", pa.uint32()), ("value", pa.float64())])
MATRIX_ROW_GROUP = 1 << 20  # pyarrow's default, named: a matrix written in parts is cut the same way

# The manifest metric that tells artifacts of one kind apart (a run makes several of these kinds):
# `Catalog.latest(kind, **{DISTINGUISHED_BY[kind]: value})`, `lexiflow artifacts show KIND:VALUE`.
DISTINGUISHED_BY = {"embeddings": "method", "evaluation": "method", "tokenizer": "kind", "lm": "model",
                    "tagger": "column"}


def vectors_schema(dim: int) -> pa.Schema:
    return pa.schema([("id", pa.uint32()), ("word", pa.string()), ("count", pa.uint64()),
                      ("vector", pa.list_(pa.float32(), dim))])


def by_rows(matrix: sp.spmatrix, index: type = np.uint32) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A sparse matrix's entries as (row, col, value) arrays by row, then column, duplicates added; indices of
    dtype `index`, values as stored (the row-major counterpart of `by_columns`)."""
    csr = sp.csr_matrix(matrix)
    if not csr.has_canonical_format:
        csr = csr.copy()
        csr.sum_duplicates()  # also sorts each row's columns
    rows = np.repeat(np.arange(csr.shape[0], dtype=index), np.diff(csr.indptr))
    return rows, csr.indices.astype(index, copy=False), csr.data


def write_matrix(out: ArtifactWriter, name: str, matrix: sp.spmatrix, threads: int = 1) -> None:
    """A sparse matrix as (row, col, value) rows by row, then column; the shape is in the Parquet key-value
    metadata. Its row groups are encoded `threads` at a time (pyarrow's encoders release the GIL) and appended
    in order: the bytes one writer makes (`parquet_concat`), whatever `threads`."""
    schema = matrix_schema(matrix.shape)
    rows, cols, values = by_rows(matrix)
    table = pa.table({"row": rows, "col": cols, "value": values.astype(np.float64)}, schema=schema)
    groups = [table.slice(i, MATRIX_ROW_GROUP) for i in range(0, table.num_rows, MATRIX_ROW_GROUP)]
    with out.parquet_parts(name, schema, MATRIX_ROW_GROUP) as write:
        for segment in _in_order(partial(write_segment, schema=schema, row_group_size=MATRIX_ROW_GROUP),
                                 groups, threads):
            write(segment)


def _in_order(fn: Callable[[Any], Any], items: list[Any], threads: int) -> Iterator[Any]:
    """fn(item) for each item, `threads` at a time, in order; at most 2·threads results wait to be taken."""
    if threads <= 1:
        yield from map(fn, items)
        return
    with ThreadPoolExecutor(threads) as pool:
        running: deque[Future] = deque()
        for item in items:
            running.append(pool.submit(fn, item))
            if len(running) >= 2 * threads:
                yield running.popleft().result()
        while running:
            yield running.popleft().result()


def by_columns(matrix: sp.spmatrix) -> pl.DataFrame:
    """A sparse matrix's (row, col, value) rows in column-major order (by col, then row)."""
    csc = sp.csc_matrix(matrix)
    csc.sum_duplicates()  # canonical: rows sorted within each column
    cols = np.repeat(np.arange(csc.shape[1], dtype=np.uint32), np.diff(csc.indptr))
    return pl.DataFrame({"row": csc.indices.astype(np.uint32), "col": cols, "value": csc.data.astype(np.float64)})


def matrix_schema(shape: tuple[int, int]) -> pa.Schema:
    """MATRIX with the matrix's shape in the key-value metadata (`write_matrix`, `write_matrix_columns`)."""
    return MATRIX.with_metadata({"shape": json.dumps(list(shape))})


def write_matrix_columns(out: ArtifactWriter, name: str,
                         blocks: Iterable[pl.DataFrame | pl.LazyFrame | Segment], shape: tuple[int, int]) -> None:
    """A sparse matrix written column-major (`by_columns`) from blocks of its columns, in order, holding
    one block at a time. Consecutive blocks may share their boundary column (a document cut between two
    shards; a long one may span several): its entries are added. The bytes of one block of the whole. A
    `Segment` is columns no other block shares, already encoded as the file's row groups (`matrix_schema`):
    appended as it is, ending the row group before it."""
    carry: pl.DataFrame | None = None  # the last column seen, which the next block may continue
    with out.parquet_parts(name, matrix_schema(shape), MATRIX_ROW_GROUP) as write:
        for block in blocks:
            if isinstance(block, Segment):
                if carry is not None:
                    write(carry)
                    carry = None
                write(block)
                continue
            block = block.collect() if isinstance(block, pl.LazyFrame) else block
            if not block.height:
                continue
            if carry is not None and block["col"][0] == carry["col"][0]:
                continued = int((block["col"] == carry["col"][0]).sum())  # a prefix: the block is sorted by col
                carry = (pl.concat([carry, block.head(continued)]).group_by("row").agg(pl.col("col").first(),
                                                                                       pl.col("value").sum())
                         .sort("row").select("row", "col", "value"))
                block = block.slice(continued)
                if not block.height:
                    continue
            if carry is not None:
                write(carry)
            last = int((block["col"] == block["col"][-1]).sum())
            write(block.head(block.height - last))
            carry = block.tail(last)
        if carry is not None:
            write(carry)


def read_matrix(ref: ArtifactRef, name: str = "matrix.parquet") -> sp.csr_matrix:
    table = ArtifactStore(ref.store).read_arrow(ref.kind, ref.version, name)
    shape = tuple(json.loads(table.schema.metadata[b"shape"]))
    return sp.csr_matrix((table["value"].to_numpy(), (table["row"].to_numpy(), table["col"].to_numpy())), shape=shape)


def write_vectors(out: ArtifactWriter, ids: np.ndarray, words: list[str], counts: np.ndarray,
                  vectors: np.ndarray) -> None:
    dim = vectors.shape[1]
    flat = pa.array(np.ascontiguousarray(vectors, dtype=np.float32).ravel())
    table = pa.table({"id": pa.array(ids, pa.uint32()), "word": pa.array(words, pa.string()),
                      "count": pa.array(counts, pa.uint64()),
                      "vector": pa.FixedSizeListArray.from_arrays(flat, dim)}, schema=vectors_schema(dim))
    pq.write_table(table, out.path("vectors.parquet"), **PARQUET_OPTIONS)


def read_vectors(ref: ArtifactRef) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(words, counts, vectors float32 [n × dim]) of an embeddings artifact, in frequency order."""
    table = ArtifactStore(ref.store).read_arrow(ref.kind, ref.version, "vectors.parquet")
    dim = table.schema.field("vector").type.list_size
    vectors = table["vector"].combine_chunks().flatten().to_numpy().reshape(-1, dim)
    return table["word"].to_pylist(), table["count"].to_numpy(), vectors


def read_manifest(ref: ArtifactRef) -> dict:
    """An input artifact's manifest (its metrics, inputs, files), as a stage reads it."""
    return ArtifactStore(ref.store).manifest(ref.kind, ref.version)


def corpus_sources(ref: ArtifactRef) -> str:
    """The sources of the corpus an artifact was made from (following its inputs), for messages that
    must name them: "a.txt, b.txt" (names quoted repr-style when they hold control characters)."""
    manifest = read_manifest(ref)
    if ref.kind == "corpus":
        sources = manifest["parameters"].get("params", {}).get("sources", [])
        return ", ".join(name if str(name).isprintable() else repr(name) for name in sources) or "the corpus"
    for found in manifest["inputs"].values():
        sources = corpus_sources(ArtifactRef(store=ref.store, kind=found["kind"], version=found["version"]))
        if sources != "the corpus":
            return sources
    return "the corpus"


def read_table(ref: ArtifactRef, name: str, columns: list[str] | None = None) -> pl.DataFrame:
    return ArtifactStore(ref.store).read_parquet(ref.kind, ref.version, name, columns)


@retry_transient  # open and read: one store operation, retried as ArtifactStore's reads are
def row_groups(ref: ArtifactRef, name: str) -> list[tuple[int, int]]:
    """Rows and uncompressed bytes of each row group of a Parquet file of an artifact, from its footer
    (nothing else is read)."""
    store = ArtifactStore(ref.store)
    with store.open(ref.kind, ref.version, name) as f, store.damage_check(ref.kind, ref.version, name):
        footer = pq.ParquetFile(f).metadata
        return [(footer.row_group(i).num_rows, footer.row_group(i).total_byte_size)
                for i in range(footer.num_row_groups)]


@retry_transient
def read_rows(ref: ArtifactRef, name: str, start: int, stop: int, columns: list[str] | None = None) -> pl.DataFrame:
    """Rows [start, stop) of a Parquet file of an artifact (`columns` of them, or all), reading only the row
    groups that hold them (a shard of a large table, on any store)."""
    store = ArtifactStore(ref.store)
    with store.open(ref.kind, ref.version, name) as f, store.damage_check(ref.kind, ref.version, name):
        parquet = pq.ParquetFile(f, page_checksum_verification=True)
        groups, first, row = [], None, 0
        for i in range(parquet.num_row_groups):
            n = parquet.metadata.row_group(i).num_rows
            if row < stop and row + n > start:
                groups.append(i)
                first = row if first is None else first
            row += n
        if not groups:
            empty = parquet.schema_arrow.empty_table()
            return pl.from_arrow(empty.select(columns) if columns else empty)
        table = parquet.read_row_groups(groups, columns=columns)
    return pl.from_arrow(table.slice(start - first, stop - start))
