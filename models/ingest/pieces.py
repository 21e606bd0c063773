"""What one source piece (a file, a byte range of a large one, a range of bz2 streams) contributed to the
corpus, kept so that a later corpus version containing the same piece need not read and clean it again.

A piece is replayed into `ingest_shard` exactly as it was read: chunk by chunk, each chunk's raw documents and
raw text bytes (which decide where the shard's cleaned batches end, and so the corpus file's row groups) and its
cleaned rows. Cleaning works row by row, so the rows a chunk cleaned alone are the rows it gives inside any
batch: a shard made of replayed pieces and read ones yields the same tables, row for row, as one that read
every piece (docs/design.md, "Incremental rebuilds"). No storage here: `PieceCache` is what `ingest_shard` is
given (the store's implementation: `lexiflow.tasks.pieces`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import polars as pl
import pyarrow as pa


@dataclass
class PieceRecord:
    """A piece as read: per chunk (raw documents, raw text bytes) and its cleaned rows (the shard's columns
    without `file`, whose number is the corpus's, not the piece's), and the distinct words of the piece."""

    chunks: list[tuple[int, int]]
    documents: list[pl.DataFrame]  # one table per chunk, in order (empty tables included)
    words: pa.Array


class PieceCache(Protocol):
    """Where `ingest_shard` finds pieces it has read before and leaves those it reads."""

    def get(self, part: Any) -> PieceRecord | None: ...

    def put(self, part: Any, record: PieceRecord) -> None: ...
