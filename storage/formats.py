"""Parquet schemas of lexiflow's tables, and readers/writers for the ones with structure
(sparse matrices, vectors). Every table is readable by polars, pyarrow, DuckDB or Spark without
lexiflow: see docs/artifacts.md."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import scipy.sparse as sp
from lexiflow.storage.store import ArtifactRef, ArtifactStore, ArtifactWriter, retry_transient

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


def vectors_schema(dim: int) -> pa.Schema:
    return pa.schema([("id", pa.uint32()), ("word", pa.string()), ("count", pa.uint64()),
                      ("vector", pa.list_(pa.float32(), dim))])


def write_matrix(out: ArtifactWriter, name: str, matrix: sp.spmatrix) -> None:
    """A sparse matrix as (row, col, value) rows; the shape is in the Parquet key-value metadata."""
    coo = sp.coo_matrix(matrix)
    table = pa.table({"row": coo.row.astype(np.uint32), "col": coo.col.astype(np.uint32),
                      "value": coo.data.astype(np.float64)}, schema=MATRIX)
    table = table.replace_schema_metadata({"shape": json.dumps(list(coo.shape))})
    pq.write_table(table, out.path(name), compression="zstd")


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
    pq.write_table(table, out.path("vectors.parquet"), compression="zstd")


def read_vectors(ref: ArtifactRef) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(words, counts, vectors float32 [n × dim]) of an embeddings artifact, in frequency order."""
    table = ArtifactStore(ref.store).read_arrow(ref.kind, ref.version, "vectors.parquet")
    dim = table.schema.field("vector").type.list_size
    vectors = table["vector"].combine_chunks().flatten().to_numpy().reshape(-1, dim)
    return table["word"].to_pylist(), table["count"].to_numpy(), vectors


def read_manifest(ref: ArtifactRef) -> dict:
    """An input artifact's manifest (its metrics, inputs, files), as a stage reads it."""
    return ArtifactStore(ref.store).manifest(ref.kind, ref.version)


def read_table(ref: ArtifactRef, name: str) -> pl.DataFrame:
    return ArtifactStore(ref.store).read_parquet(ref.kind, ref.version, name)


@retry_transient  # open and read: one store operation, retried as ArtifactStore's reads are
def count_rows(ref: ArtifactRef, name: str) -> int:
    """Rows of a Parquet file of an artifact, from its footer (nothing else is read)."""
    with ArtifactStore(ref.store).open(ref.kind, ref.version, name) as f:
        return pq.ParquetFile(f).metadata.num_rows


@retry_transient
def read_rows(ref: ArtifactRef, name: str, start: int, stop: int) -> pl.DataFrame:
    """Rows [start, stop) of a Parquet file of an artifact, reading only the row groups that hold
    them (a shard of a large table, on any store)."""
    with ArtifactStore(ref.store).open(ref.kind, ref.version, name) as f:
        parquet = pq.ParquetFile(f)
        groups, first, row = [], None, 0
        for i in range(parquet.num_row_groups):
            n = parquet.metadata.row_group(i).num_rows
            if row < stop and row + n > start:
                groups.append(i)
                first = row if first is None else first
            row += n
        if not groups:
            return pl.from_arrow(parquet.schema_arrow.empty_table())
        table = parquet.read_row_groups(groups)
    return pl.from_arrow(table.slice(start - first, stop - start))
