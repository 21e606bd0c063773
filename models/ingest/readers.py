"""Readers: the raw document texts of one file, per format (plain text, JSONL, Parquet, MediaWiki
XML, CoNLL-U), with the file's decompression and decoding. Every problem is one `InputError` line
naming the file (and line); see the package docstring for the policy."""

from __future__ import annotations

import bz2
import codecs
import gzip
import io
import json
import os
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Iterator
from itertools import chain
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from lexiflow.models.conllu import parse_lines
from lexiflow.models.errors import InputError, shown
from lexiflow.models.ingest.sources import IngestOptions, format_of

BINARY_SNIFF = 8192
_WIKI_QUOTES = re.compile(r"'{2,}")


def open_source(path: Path):
    try:
        return open(path, "rb")  # noqa: SIM115 (the caller closes it; errors here are about the file, not its data)
    except (FileNotFoundError, PermissionError, IsADirectoryError) as exc:
        raise InputError(f"{shown(path)}: cannot open ({exc.strerror}); check the path in corpus.sources") from None


# A compressed file that decompresses to more than this many times its size, past the first
# EXPANSION_FLOOR bytes, is refused as a decompression bomb while it streams (English text: 3-5x
# under gzip or bz2; a gzip bomb of zeros ~1000x, bz2 far more).
MAX_EXPANSION = 100
EXPANSION_FLOOR = 16 << 20


def read_bytes(path: Path, compression: str | None, limit: int) -> bytes:
    """The file's bytes, decompressed: a plain file's size is checked before it is read, a compressed
    file's decompressed bytes (total, and per compressed byte) while it streams."""
    return b"".join(file_blocks(path, compression, limit, None))  # a plain file in one read: no copy


def file_blocks(path: Path, compression: str | None, limit: int, block: int | None = 16 << 20,
                read: Callable[[int], None] | None = None) -> Iterator[bytes]:
    """The file's bytes, decompressed, in blocks of at most `block` bytes (None: a plain file in one
    block, a compressed one in blocks of 16 MiB). A plain file's size is checked before it is read; a
    compressed file is refused as soon as it passes `limit` bytes or MAX_EXPANSION times the
    compressed bytes read so far, a truncated or corrupt one when its damage is reached (after the
    blocks before it). `read(n)`: told the file's bytes read (compressed) as each block comes."""
    read = read or (lambda n: None)
    with open_source(path) as raw:
        if compression is None:
            # Other OSErrors here are I/O trouble, raised as they are (transient: the stage retries).
            if (size := os.fstat(raw.fileno()).st_size) > limit:
                raise InputError(f"{shown(path)}: {size} bytes, more than corpus.max_file_bytes ({limit}); raise it "
                                 "if intended, or split the file")
            total = 0  # up to size + 1: a file growing meanwhile still ends where it ends
            while part := raw.read(min(block or size + 1, size + 1 - total)):
                total += len(part)
                read(len(part))
                yield part
            if not total:
                yield b""
            return
        try:
            opened = gzip.GzipFile(fileobj=raw, mode="rb") if compression == "gz" else bz2.BZ2File(raw, mode="rb")
            with opened as f:
                total = done = 0
                while part := f.read(min(block or 16 << 20, limit + 1 - total)):
                    total += len(part)
                    check_expansion(path, total, raw.tell(), limit)
                    read(raw.tell() - done)
                    done = raw.tell()
                    yield part
        except (OSError, EOFError, ValueError) as exc:  # truncated or corrupt archives
            raise InputError(f"{shown(path)}: cannot read ({one_line(exc)}); the file is damaged or not "
                             f"{compression} data") from None


def check_expansion(path: Path, total: int, compressed: int, limit: int) -> None:
    if total > limit:
        raise InputError(f"{shown(path)}: more than {limit} bytes once decompressed; raise corpus.max_file_bytes "
                         "if intended")
    if total > EXPANSION_FLOOR and total > MAX_EXPANSION * compressed:
        raise InputError(f"{shown(path)}: decompresses to more than {MAX_EXPANSION} times its size (a "
                         "decompression bomb?); if it is real text, decompress it and give the plain file")


def one_line(exc: BaseException, limit: int = 200) -> str:
    """A library's error message as one short line (some span several)."""
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


WIDE_BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"),
              (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))


def decode(path: Path, data: bytes, start: int = 0, lines: int | None = None) -> str:
    """The text of a file's bytes, or of its bytes from `start` on (a line start; BOMs and the
    binary sniff concern the file's beginning only, checked when the file was planned). `lines`: the
    newlines before `start` where known (a decompressed stream), else counted in the file on error."""
    if start:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = _lines_before(path, start, lines) + data[: exc.start].count(b"\n") + 1
            raise InputError(f"{shown(path)}:{line}: invalid UTF-8 (byte {start + exc.start}); re-encode the file as "
                             "UTF-8 (mixed encodings are not guessed)") from None
    for bom, encoding in WIDE_BOMS:  # UTF-32 first: its LE BOM starts with UTF-16's
        if data.startswith(bom):
            try:
                return data.decode(encoding)
            except UnicodeDecodeError as exc:
                raise InputError(f"{shown(path)}: invalid {encoding.upper()} at byte {exc.start}; re-encode the file "
                                 "as UTF-8") from None
    if b"\x00" in data[:BINARY_SNIFF]:
        raise InputError(f"{shown(path)}: looks like a binary file (NUL bytes); remove it from the sources")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise InputError(
            f"{shown(path)}:{line}: invalid UTF-8 (byte {exc.start}); re-encode the file as UTF-8 "
            "(mixed encodings are not guessed)"
        ) from None


# ---- readers: each yields raw document texts of one file ------------------------------------
def _text_documents(path: Path, text: str, unit: str) -> list[str]:
    if unit == "file":
        return [text]
    if unit == "paragraph":
        return re.split(r"\r?\n[ \t]*\r?\n", text)  # a blank line, LF or CRLF (Windows) line ends
    return text.splitlines()


# In a line cut at LF: a line break of `str.splitlines` other than CRLF (a CR not before the LF).
_OTHER_LINE_BREAKS = r"[\x0b\x0c\x1c-\x1e\x85\u2028\u2029]|\r."


def line_documents(path: Path, data: bytes, start: int = 0, lines: int | None = None) -> pl.Series:
    """`_text_documents(path, decode(path, data, start), "line")` as a Series, fast for the usual
    file (UTF-8, LF or CRLF line ends): Arrow cuts the bytes at LF (polars' split of one huge string
    touches ~5× its size in fresh memory) and polars validates them as UTF-8; they never become
    Python strings. Anything else, an invalid file included (for its error message), goes the `str` way."""
    if not start and (any(data.startswith(bom) for bom, _ in WIDE_BOMS) or b"\x00" in data[:BINARY_SNIFF]):
        return _str_lines(path, data, start, lines)
    first = len(codecs.BOM_UTF8) if not start and data.startswith(codecs.BOM_UTF8) else 0
    bounds = pa.py_buffer(np.array([first, len(data)], np.int64))
    whole = pa.LargeBinaryArray.from_buffers(pa.large_binary(), 1, [None, bounds, pa.py_buffer(data)])  # no copy
    try:
        texts = pl.from_arrow(pc.split_pattern(whole, "\n").flatten()).cast(pl.String)
    except (pl.exceptions.ComputeError, pl.exceptions.InvalidOperationError):  # invalid UTF-8
        return _str_lines(path, data, start, lines)
    if texts.str.contains(_OTHER_LINE_BREAKS).any():
        return _str_lines(path, data, start, lines)
    if texts[-1] == "":  # after a final newline, or of an empty file
        texts = texts.head(-1)
    return texts.str.strip_suffix("\r") if b"\r" in data else texts


def _str_lines(path: Path, data: bytes, start: int, lines: int | None) -> pl.Series:
    return pl.Series(_text_documents(path, decode(path, data, start, lines), "line"), dtype=pl.String)


def split_lines(text: str) -> list[str]:
    """Lines of a line-based format (JSONL, CoNLL-U): split at LF only (CRLF tolerated). Unicode
    line separators (U+2028, U+0085, ...) may appear inside JSON strings and words."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def jsonl_documents(path: Path, text: str, field_name: str, start: int = 0, lines: int | None = None) -> list[str]:
    """`start`: the byte offset of `text` in the file (a line start); an error's line number adds
    the lines before it (`lines`, or counted only then)."""

    def at(line_no: int) -> str:
        return f"{shown(path)}:{line_no + (_lines_before(path, start, lines) if start else 0)}"

    docs = []
    for line_no, line in enumerate(split_lines(text), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{at(line_no)}: invalid JSON ({exc.msg}); fix or remove the line") from None
        except RecursionError:
            raise InputError(f"{at(line_no)}: JSON nested too deeply to read; fix or remove the line") from None
        if not isinstance(obj, dict) or not isinstance(obj.get(field_name), str):
            raise InputError(f"{at(line_no)}: no string field {field_name!r}; set corpus.text_field")
        docs.append(obj[field_name])
    return docs


def parquet_chunks(path: Path, compression: str | None, column: str, limit: int,
                   chunk_bytes: int | None = None) -> Iterator[pl.Series]:
    """The text column's values, in chunks of about `chunk_bytes` bytes of text, read record batch by
    record batch (an uncompressed file is read from disk as it goes: its size is checked first). Checked
    before they are decoded: rows and the column's declared size from the file's metadata, then, per
    batch, the bytes of text its values expand to (a tiny file can repeat one long dictionary value a
    billion times), and a batch is decoded a slice of about `chunk_bytes` at a time. Dictionary-encoded
    text (pandas categoricals) is text. A compressed (`.parquet.gz`) file is decompressed whole first
    (Parquet is read from its end)."""
    source = io.BytesIO(read_bytes(path, compression, limit)) if compression else _sized_source(path, limit)
    with source:
        try:
            schema = pq.ParquetFile(source).schema_arrow
        except Exception as exc:  # pyarrow raises several types for damaged files
            raise InputError(f"{shown(path)}: not a readable Parquet file ({one_line(exc)})") from None
        if column not in schema.names:
            raise InputError(f"{shown(path)}: no column {column!r} (columns: {', '.join(schema.names)}); set "
                             "corpus.text_field")
        column_type = schema.field(column).type
        value_type = column_type.value_type if pa.types.is_dictionary(column_type) else column_type
        if not (pa.types.is_string(value_type) or pa.types.is_large_string(value_type)
                or pa.types.is_string_view(value_type)):
            raise InputError(f"{shown(path)}: column {column!r} holds {column_type}, not text; set corpus.text_field")
        source.seek(0)
        file = pq.ParquetFile(source, read_dictionary=[column], buffer_size=1 << 20)  # pages as they are read
        meta = file.metadata
        declared = sum(meta.row_group(g).column(c).total_uncompressed_size for g in range(meta.num_row_groups)
                       for c in range(meta.num_columns) if meta.row_group(g).column(c).path_in_schema == column)
        if meta.num_rows > limit // ROW_BYTES or declared > limit:
            raise InputError(f"{shown(path)}: {meta.num_rows} rows, {declared} bytes in column {column!r}: more "
                             f"than corpus.max_file_bytes ({limit}) allows; raise it if intended")
        step = chunk_bytes or limit + 1
        rows = min(1 << 16, max(1, step * meta.num_rows // max(declared, 1)))  # a batch of about a chunk, at most
        try:
            yield from _parquet_slices(path, file, column, limit, step, rows)
        except (OSError, pa.ArrowException) as exc:
            raise InputError(f"{shown(path)}: not a readable Parquet file ({one_line(exc)})") from None


def _sized_source(path: Path, limit: int):
    source = open_source(path)
    if (size := os.fstat(source.fileno()).st_size) > limit:
        source.close()
        raise InputError(f"{shown(path)}: {size} bytes, more than corpus.max_file_bytes ({limit}); raise it "
                         "if intended, or split the file")
    return source


def _parquet_slices(path: Path, file: pq.ParquetFile, column: str, limit: int, step: int,
                    rows: int) -> Iterator[pl.Series]:
    """Chunks of about `step` bytes of text: slices of record batches, each decoded only once the bytes
    of the whole batch it belongs to are known to be within `limit`."""
    expanded, held, size, given = 0, [], 0, False
    for batch in file.iter_batches(batch_size=rows, columns=[column]):
        values = batch.column(0)
        lengths = _row_bytes(values)
        expanded += int(lengths.sum())
        if expanded > limit:
            raise InputError(f"{shown(path)}: column {column!r} expands to more than corpus.max_file_bytes "
                             f"({limit}) bytes of text (repeated dictionary values); raise it if intended")
        ends = np.cumsum(lengths)
        at = 0
        while at < len(values):  # the rows that fill the chunk up to `step` (one at least)
            before = int(ends[at - 1]) if at else 0
            stop = max(at + 1, int(np.searchsorted(ends, before + step - size, side="right")))
            piece = values.slice(at, stop - at)
            if pa.types.is_dictionary(piece.type):
                piece = piece.dictionary_decode()
            held.append(pl.from_arrow(piece).cast(pl.String).drop_nulls())
            size += int(ends[stop - 1]) - before
            at = stop
            if size >= step:
                yield pl.concat(held)
                held, size, given = [], 0, True
    if held or not given:
        yield pl.concat(held) if held else text_series([])


ROW_BYTES = 16  # memory a row of text costs at least (offsets, the Python string): the limit on rows


def _row_bytes(values: pa.Array) -> np.ndarray:
    """Bytes of text each row of `values` holds once decoded, without decoding them (a dictionary's
    value lengths, looked up per row)."""
    if not pa.types.is_dictionary(values.type):
        return pc.binary_length(values).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    lengths = pc.binary_length(values.dictionary).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    indices = values.indices.fill_null(0).to_numpy(zero_copy_only=False)
    return lengths[indices] if len(lengths) else np.zeros(len(values), np.int64)


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]  # dumps put every element in the export-0.x namespace


XML_FEED = 1 << 20  # bytes handed to the XML parser at a time (its events are handled in between)


def wiki_pages(path: Path, blocks: Iterable[bytes], where: Callable[[int], str] | None = None
               ) -> Iterator[str | None]:
    """Per `<page>` of a MediaWiki dump, in order: its article text (namespace 0, not a redirect),
    markup stripped by gensim's `filter_wiki`, or None. The XML is parsed incrementally from the
    blocks, page by page, each page dropped once read: memory holds one page, not the dump.
    `where(line)`: how an error names its place (default `file:line`)."""
    from gensim.corpora.wikicorpus import filter_wiki

    where = where or (lambda line: f"{shown(path)}:{line}")
    parser = ET.XMLPullParser(events=("start", "end"))
    depth, root = 0, None
    try:
        for block in chain(blocks, [None]):
            if block is None:
                parser.close()
                pieces = [b""]
            else:
                pieces = [block[i: i + XML_FEED] for i in range(0, len(block), XML_FEED)]
            for piece in pieces:
                if piece:
                    parser.feed(piece)
                for event, elem in parser.read_events():
                    if event == "start":
                        if depth == 0:
                            if _local(elem.tag) != "mediawiki":
                                raise InputError(f"{shown(path)}: root element <{_local(elem.tag)}> is not "
                                                 "<mediawiki>; not a MediaWiki XML dump")
                            root = elem
                        depth += 1
                        continue
                    depth -= 1
                    if _local(elem.tag) != "page":
                        continue
                    yield _article(elem, filter_wiki)
                    if root is not None:
                        root.clear()  # pages are done with: keep memory flat on large dumps
    except ET.ParseError as exc:
        line, column = exc.position
        reason = str(exc).split(":", 1)[0]
        raise InputError(f"{where(line)}: not well-formed XML ({reason}, column {column}); the dump is damaged "
                         "or truncated") from None


def _article(page: ET.Element, filter_wiki: Callable[[str], str]) -> str | None:
    fields = {_local(child.tag): child for child in page}
    namespace = (fields["ns"].text or "").strip() if "ns" in fields else "0"
    revision = fields.get("revision")
    text_elem = next((c for c in revision if _local(c.tag) == "text"), None) if revision is not None else None
    text = text_elem.text if text_elem is not None else None
    if (namespace == "0" and text and "redirect" not in fields
            and not text.lstrip().lower().startswith("#redirect")):
        return _WIKI_QUOTES.sub("", filter_wiki(text))  # filter_wiki keeps ''bold''/''italic'' quotes
    return None


def wiki_chunks(pages: Iterable[str | None], chunk_bytes: int | None = None) -> Iterator[pl.Series]:
    """The articles of a dump's pages (`wiki_pages`), in chunks of about `chunk_bytes` characters."""
    held: list[str] = []
    size, given = 0, False
    for text in pages:
        if text is not None:
            held.append(text)
            size += len(text)
        if chunk_bytes is not None and size >= chunk_bytes:
            yield text_series(held)
            held, size, given = [], 0, True
    if held or not given:
        yield text_series(held)


def wiki_documents(path: Path, data: bytes) -> list[str]:
    """Articles (namespace 0, not redirects) of a MediaWiki dump held in memory."""
    return [text for text in wiki_pages(path, [data]) if text is not None]


def read_file(path: Path, options: IngestOptions) -> tuple[list[str], pl.DataFrame | None]:
    """Raw document texts of one file, and its tagged sentences if it is CoNLL-U."""
    docs, tagged = read_documents(path, options)
    return docs.to_list(), tagged


def read_documents(path: Path, options: IngestOptions) -> tuple[pl.Series, pl.DataFrame | None]:
    """`read_file` with the texts as a Series (plain-text lines never become Python strings): the
    file's chunks (`read_chunks`) in one, and the tagged sentences of a CoNLL-U file."""
    fmt, compression = format_of(path)
    if fmt != "conllu":
        return pl.concat(list(read_chunks(path, options))), None
    text = decode(path, read_bytes(path, compression, options.max_file_bytes))
    sents = list(parse_lines(split_lines(text), source=shown(path)))
    tagged = pl.DataFrame(
        {
            "sent_id": [s.sent_id or f"{path.name}:{s.line}" for s in sents],
            "words": [s.words for s in sents],
            "upos": [s.upos for s in sents],
            "xpos": [s.xpos for s in sents],
        },
        schema={"sent_id": pl.String, "words": pl.List(pl.String), "upos": pl.List(pl.String),
                "xpos": pl.List(pl.String)},
    )
    return text_series([" ".join(s.words) for s in sents]), tagged


def read_chunks(path: Path, options: IngestOptions, chunk_bytes: int | None = None,
                read: Callable[[int], None] | None = None) -> Iterator[pl.Series]:
    """Raw document texts of one file, in order, in chunks of about `chunk_bytes` bytes of text (None:
    one chunk): whole documents (lines, JSON lines, wiki pages, Parquet rows), a chunk passing
    `chunk_bytes` by at most one document. Plain-text lines, JSONL, MediaWiki XML and Parquet stream,
    compressed or not: memory holds a chunk (and a read block), not the file. CoNLL-U, paragraph and
    file units, and UTF-16/32 text are read whole (within `max_file_bytes`). `read(n)`: told the bytes
    of the file read so far, block by block, for progress (not for Parquet or CoNLL-U)."""
    fmt, compression = format_of(path)
    limit = options.max_file_bytes
    if fmt == "conllu":
        yield read_documents(path, options)[0]
        return
    if fmt == "parquet":
        yield from parquet_chunks(path, compression, options.text_field, limit, chunk_bytes)
        return
    block = None if chunk_bytes is None else min(16 << 20, max(chunk_bytes, 1 << 16))
    head, blocks = _peek(file_blocks(path, compression, limit, block, read), BINARY_SNIFF)
    if fmt == "text" and head[:512].lstrip().startswith(b"<mediawiki"):
        fmt = "wiki"  # dumps are often named *.xml-p<range>.bz2
    if fmt == "wiki":
        yield from wiki_chunks(wiki_pages(path, blocks), chunk_bytes)
        return
    wide = any(head.startswith(bom) for bom, _ in WIDE_BOMS) or b"\x00" in head
    if not wide and (fmt == "jsonl" or options.text_unit == "line"):
        yield from _line_chunks(path, fmt, options.text_field, blocks, chunk_bytes)
        return
    text = decode(path, b"".join(blocks))  # read whole: paragraphs, whole files, UTF-16/32, binary (refused)
    yield text_series(jsonl_documents(path, text, options.text_field) if fmt == "jsonl"
                      else _text_documents(path, text, options.text_unit))


def _peek(blocks: Iterator[bytes], size: int) -> tuple[bytes, Iterator[bytes]]:
    """The first `size` bytes of a stream of blocks (fewer if it is shorter), and the whole stream."""
    taken: list[bytes] = []
    while sum(map(len, taken)) < size and (block := next(blocks, None)) is not None:
        taken.append(block)
    return b"".join(taken)[:size], chain(taken, blocks)


def _line_chunks(path: Path, fmt: str, field_name: str, blocks: Iterable[bytes],
                 chunk_bytes: int | None) -> Iterator[pl.Series]:
    """Lines (plain text) or JSON lines' texts in chunks of whole lines: a chunk holds the lines that
    start in its first `chunk_bytes` bytes. Errors are those of the file read whole: a read error
    (damage, limits) first, then the first invalid UTF-8, then the first bad JSON line; so after a bad
    JSON line the rest is still decoded, and after any error the rest is still read (not parsed)."""
    failure: InputError | None = None
    parse_failure = False
    start = lines = 0

    def read(data: bytes) -> Iterator[pl.Series]:
        nonlocal failure, parse_failure, start, lines
        if failure is None or parse_failure:
            try:
                if fmt == "text":
                    docs = line_documents(path, data, start, lines)
                else:
                    text = decode(path, data, start, lines)
                    if failure is None:
                        try:
                            docs = text_series(jsonl_documents(path, text, field_name, start, lines))
                        except InputError as exc:
                            failure, parse_failure = exc, True
            except InputError as exc:  # invalid UTF-8: comes before any JSON error
                failure, parse_failure = exc, False
            if failure is None:
                yield docs
        start += len(data)
        lines += data.count(b"\n")

    pending: list[bytes] = []  # the bytes after the last cut
    size = 0
    for block in blocks:
        pending.append(block)
        size += len(block)
        # The next cut is a newline past `chunk_bytes` after the last one: in this block, if anywhere yet.
        if chunk_bytes is None or size < chunk_bytes or b"\n" not in block:
            continue
        buffer, at = b"".join(pending), 0
        while size - at >= chunk_bytes and (cut := buffer.find(b"\n", at + chunk_bytes - 1)) >= 0:
            yield from read(buffer[at: cut + 1])
            at = cut + 1
        pending, size = [buffer[at:]], size - at
    if size or not start:
        yield from read(pending[0] if len(pending) == 1 else b"".join(pending))
    if failure is not None:
        raise failure


def text_series(texts: list[str]) -> pl.Series:
    return pl.Series(texts, dtype=pl.String)


def _lines_before(path: Path, start: int, lines: int | None) -> int:
    return lines_before(path, start) if lines is None else lines


def lines_before(path: Path, start: int) -> int:
    """Newlines in the file's first `start` bytes (for error line numbers of a range)."""
    count = 0
    with path.open("rb") as f:
        while start > 0 and (block := f.read(min(1 << 24, start))):
            count += block.count(b"\n")
            start -= len(block)
    return count
