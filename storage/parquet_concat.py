"""One Parquet file from files of whole row groups, appended byte for byte (no decoding, no re-encoding).

A Parquet file is `PAR1`, the pages of its row groups, a footer (a Thrift compact-protocol `FileMetaData`
listing every row group with the absolute offsets of its pages), the footer's length and `PAR1`. Pages hold
no offsets, so a row group's bytes read the same wherever they sit: appending files' page bytes and their
footers' row-group entries, offsets moved by where each file's pages land, gives the file that one writer
would write from the same row groups, byte for byte (tests/test_parquet_concat.py). So a shard worker can
encode and compress its rows' row groups, and the process writing the artifact only copies them.
pyarrow has no such append (its writers encode Arrow data), hence this reader/writer of the footer's
generic Thrift structure, which changes only the offsets, ordinals and row count.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

MAGIC = b"PAR1"
_COPY_BYTES = 16 << 20
# Thrift compact protocol types
_STOP, _TRUE, _FALSE, _I8, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(13)
# Field ids (parquet.thrift) of what appending moves: FileMetaData, RowGroup, ColumnChunk, ColumnMetaData.
_NUM_ROWS, _ROW_GROUPS, _ENCRYPTION = 3, 4, 8
_COLUMNS, _GROUP_ROWS, _GROUP_OFFSET, _ORDINAL = 1, 3, 5, 7
_CHUNK_OFFSET, _CHUNK_META, _OFFSET_INDEX, _COLUMN_INDEX = 2, 3, 4, 6
_PAGE_OFFSETS, _BLOOM_FILTER = (9, 10, 11), 14


@dataclass(frozen=True)
class Segment:
    """Row groups of a table being written, encoded elsewhere (a shard worker's `store.write_segment`): a
    Parquet file's path or URL, or its bytes, holding `rows` rows. `ArtifactWriter.parquet_parts` appends them
    as they are."""

    source: str | bytes
    rows: int

    def __repr__(self) -> str:
        return f"Segment({self.source if isinstance(self.source, str) else f'{len(self.source)} bytes'})"


class ParquetConcatError(ValueError):
    """A file that cannot be appended (another schema, page indexes or bloom filters, not Parquet)."""


def write_row_groups(sink: Any, table: pa.Table, row_group_size: int | None, **options: Any) -> None:
    """`table` as a Parquet file of row groups of `row_group_size` rows (the last may be shorter), from one
    contiguous chunk: pages are cut by content, not by how the table was built, so rows written here in one
    call or by several calls in row-group-sized pieces make the same bytes."""
    pq.write_table(table.combine_chunks(), sink, row_group_size=row_group_size, **options)


class ParquetAssembler:
    """Writes one Parquet file to `sink` (binary, written in order) from `append`ed Parquet files of the
    same schema; `close` writes the footer."""

    def __init__(self, sink: BinaryIO) -> None:
        self.sink = sink
        self.sink.write(MAGIC)
        self.offset = len(MAGIC)
        self.template: list[list] | None = None  # the first file's footer (its schema, key-value metadata, writer)
        self.row_groups: list[Any] = []
        self.rows = 0

    def append(self, source: BinaryIO, name: str = "a part") -> None:
        """Append every row group of the Parquet file `source` (seekable)."""
        size = source.seek(0, 2)
        source.seek(max(size - 8, 0))
        tail = source.read(8)
        footer_length = struct.unpack("<I", tail[:4])[0] if size >= 12 else size
        body = size - 8 - footer_length - len(MAGIC)  # the pages
        source.seek(0)
        if tail[4:] != MAGIC or source.read(4) != MAGIC or body < 0:
            raise ParquetConcatError(f"{name}: not a Parquet file")
        source.seek(size - 8 - footer_length)
        footer = _Reader(source.read(footer_length)).struct()
        self._check(footer, name)
        shift = self.offset - len(MAGIC)
        (groups,) = [value[1] for fid, _, value in footer if fid == _ROW_GROUPS] or [[]]
        for group in groups:
            for field in group:
                if field[0] == _GROUP_OFFSET:
                    field[2] += shift
                elif field[0] == _ORDINAL:  # an i16, which parquet-cpp's writer wraps past 32 767 groups
                    field[2] = (len(self.row_groups) + 2**15) % 2**16 - 2**15
                elif field[0] == _COLUMNS:
                    for chunk in field[2][1]:
                        _move_chunk(chunk, shift, name)
                elif field[0] == _GROUP_ROWS:
                    self.rows += field[2]
            self.row_groups.append(group)
        source.seek(len(MAGIC))
        left = body
        while left:
            block = source.read(min(left, _COPY_BYTES))
            if not block:
                raise ParquetConcatError(f"{name}: ends before its footer says")
            self.sink.write(block)
            left -= len(block)
        self.offset += body

    def close(self) -> None:
        """The footer: the first file's, with every appended row group and their total row count."""
        if self.template is None:
            raise ParquetConcatError("no Parquet file was appended (append an empty table's file for its schema)")
        fields = [[fid, kind, value] for fid, kind, value in self.template if fid not in (_NUM_ROWS, _ROW_GROUPS)]
        fields += [[_NUM_ROWS, _I64, self.rows], [_ROW_GROUPS, _LIST, (_STRUCT, self.row_groups)]]
        fields.sort(key=lambda field: field[0])  # Thrift writes fields in id order
        footer = _Writer().struct(fields).out
        self.sink.write(bytes(footer) + struct.pack("<I", len(footer)) + MAGIC)

    def _check(self, footer: list[list], name: str) -> None:
        if any(fid == _ENCRYPTION for fid, _, _ in footer):
            raise ParquetConcatError(f"{name}: encrypted Parquet files cannot be appended")
        def rest(fields: list[list]) -> list[list]:
            return [field for field in fields if field[0] not in (_NUM_ROWS, _ROW_GROUPS)]

        if self.template is None:
            self.template = footer
        elif rest(footer) != rest(self.template):
            raise ParquetConcatError(f"{name}: another schema or writer than the first file's; write every part "
                                     "with the same schema, options and pyarrow version")


def _move_chunk(chunk: list[list], shift: int, name: str) -> None:
    """A column chunk's page offsets moved by `shift` (0 means unset and stays)."""
    for field in chunk:
        if field[0] in (_OFFSET_INDEX, _COLUMN_INDEX):
            raise ParquetConcatError(f"{name}: has page indexes (their page locations are absolute); write it "
                                     "without write_page_index")
        if field[0] == _CHUNK_OFFSET and field[2]:
            field[2] += shift
        elif field[0] == _CHUNK_META:
            for meta in field[2]:
                if meta[0] == _BLOOM_FILTER:
                    raise ParquetConcatError(f"{name}: has bloom filters; write it without them")
                if meta[0] in _PAGE_OFFSETS and meta[2]:
                    meta[2] += shift


class _Reader:
    """Thrift compact protocol, generically: a struct is a list of [field id, type, value] in file order."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def byte(self) -> int:
        value = self.data[self.pos]
        self.pos += 1
        return value

    def varint(self) -> int:
        result = shift = 0
        while True:
            byte = self.byte()
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def raw(self, n: int) -> bytes:
        value = self.data[self.pos:self.pos + n]
        self.pos += n
        return value

    def value(self, kind: int) -> Any:
        if kind in (_I16, _I32, _I64):
            return self.zigzag()
        if kind == _BINARY:
            return self.raw(self.varint())
        if kind == _STRUCT:
            return self.struct()
        if kind in (_LIST, _SET):
            header = self.byte()
            size = header >> 4 if header >> 4 != 15 else self.varint()
            element = header & 0x0F
            return element, [self.element(element) for _ in range(size)]
        if kind == _MAP:
            size = self.varint()
            types = self.byte() if size else 0
            return types, [(self.element(types >> 4), self.element(types & 0x0F)) for _ in range(size)]
        if kind == _DOUBLE:
            return self.raw(8)
        if kind == _I8:
            return self.raw(1)
        raise ParquetConcatError(f"footer: unknown Thrift type {kind} at byte {self.pos}")

    def element(self, kind: int) -> Any:
        return self.raw(1) if kind in (_TRUE, _FALSE) else self.value(kind)  # a bool in a list is one byte

    def struct(self) -> list[list]:
        fields, last = [], 0
        while (header := self.byte()) != _STOP:
            kind, delta = header & 0x0F, header >> 4
            field_id = last + delta if delta else self.zigzag()
            fields.append([field_id, kind, None if kind in (_TRUE, _FALSE) else self.value(kind)])
            last = field_id
        return fields


class _Writer:
    """The inverse of `_Reader`: the same structure gives the same bytes."""

    def __init__(self) -> None:
        self.out = bytearray()

    def varint(self, n: int) -> None:
        while n > 0x7F:
            self.out.append(n & 0x7F | 0x80)
            n >>= 7
        self.out.append(n)

    def zigzag(self, n: int) -> None:
        self.varint((n << 1) ^ (n >> 63))

    def value(self, kind: int, value: Any) -> None:
        if kind in (_I16, _I32, _I64):
            self.zigzag(value)
        elif kind == _BINARY:
            self.varint(len(value))
            self.out += value
        elif kind == _STRUCT:
            self.struct(value)
        elif kind in (_LIST, _SET):
            element, items = value
            if len(items) < 15:
                self.out.append(len(items) << 4 | element)
            else:
                self.out.append(0xF0 | element)
                self.varint(len(items))
            for item in items:
                self.element(element, item)
        elif kind == _MAP:
            types, items = value
            self.varint(len(items))
            if items:
                self.out.append(types)
            for key, item in items:
                self.element(types >> 4, key)
                self.element(types & 0x0F, item)
        else:  # _DOUBLE, _I8: kept raw
            self.out += value

    def element(self, kind: int, value: Any) -> None:
        if kind in (_TRUE, _FALSE):
            self.out += value
        else:
            self.value(kind, value)

    def struct(self, fields: list[list]) -> _Writer:
        last = 0
        for field_id, kind, value in fields:
            delta = field_id - last
            if 0 < delta <= 15:
                self.out.append(delta << 4 | kind)
            else:
                self.out.append(kind)
                self.zigzag(field_id)
            if kind not in (_TRUE, _FALSE):
                self.value(kind, value)
            last = field_id
        self.out.append(_STOP)
        return self
