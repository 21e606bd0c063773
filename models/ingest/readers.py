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


def _read_bytes(path: Path, compression: str | None, limit: int) -> bytes:
    """The file's bytes, decompressed: a plain file's size is checked before it is read, a compressed
    file's decompressed bytes (total, and per compressed byte) while it streams."""
    with open_source(path) as raw:
        if compression is None:
            # Other OSErrors here are I/O trouble, raised as they are (transient: the stage retries).
            if (size := os.fstat(raw.fileno()).st_size) > limit:
                raise InputError(f"{shown(path)}: {size} bytes, more than corpus.max_file_bytes ({limit}); raise it "
                                 "if intended, or split the file")
            return raw.read(size + 1)  # +1: a file growing meanwhile still ends where it ends
        try:
            opened = gzip.GzipFile(fileobj=raw, mode="rb") if compression == "gz" else bz2.BZ2File(raw, mode="rb")
            with opened as f:
                return _decompress(path, f, raw, limit)
        except (OSError, EOFError, ValueError) as exc:  # truncated or corrupt archives
            raise InputError(f"{shown(path)}: cannot read ({_one_line(exc)}); the file is damaged or not "
                             f"{compression} data") from None


def _decompress(path: Path, f, raw, limit: int, chunk: int = 16 << 20) -> bytes:
    """All of a decompressing stream `f` (over the compressed file `raw`), in chunks, refused as soon
    as it passes `limit` bytes or MAX_EXPANSION times the compressed bytes read so far."""
    parts, total = [], 0
    while part := f.read(min(chunk, limit + 1 - total)):
        parts.append(part)
        total += len(part)
        if total > limit:
            raise InputError(f"{shown(path)}: more than {limit} bytes once decompressed; raise corpus.max_file_bytes "
                             "if intended")
        if total > EXPANSION_FLOOR and total > MAX_EXPANSION * raw.tell():
            raise InputError(f"{shown(path)}: decompresses to more than {MAX_EXPANSION} times its size (a "
                             "decompression bomb?); if it is real text, decompress it and give the plain file")
    return b"".join(parts)


def _one_line(exc: BaseException, limit: int = 200) -> str:
    """A library's error message as one short line (some span several)."""
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


WIDE_BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"),
              (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))


def decode(path: Path, data: bytes, start: int = 0) -> str:
    """The text of a file's bytes, or of its bytes from `start` on (a line start; BOMs and the
    binary sniff concern the file's beginning only, checked when the file was planned)."""
    if start:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = lines_before(path, start) + data[: exc.start].count(b"\n") + 1
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


def line_documents(path: Path, data: bytes, start: int = 0) -> pl.Series:
    """`_text_documents(path, decode(path, data, start), "line")` as a Series, fast for the usual
    file (UTF-8, LF or CRLF line ends): Arrow cuts the bytes at LF (polars' split of one huge string
    touches ~5× its size in fresh memory) and polars validates them as UTF-8; they never become
    Python strings. Anything else, an invalid file included (for its error message), goes the `str` way."""
    if not start and (any(data.startswith(bom) for bom, _ in WIDE_BOMS) or b"\x00" in data[:BINARY_SNIFF]):
        return _str_lines(path, data, start)
    first = len(codecs.BOM_UTF8) if not start and data.startswith(codecs.BOM_UTF8) else 0
    bounds = pa.py_buffer(np.array([first, len(data)], np.int64))
    whole = pa.LargeBinaryArray.from_buffers(pa.large_binary(), 1, [None, bounds, pa.py_buffer(data)])  # no copy
    try:
        lines = pl.from_arrow(pc.split_pattern(whole, "\n").flatten()).cast(pl.String)
    except (pl.exceptions.ComputeError, pl.exceptions.InvalidOperationError):  # invalid UTF-8
        return _str_lines(path, data, start)
    if lines.str.contains(_OTHER_LINE_BREAKS).any():
        return _str_lines(path, data, start)
    if lines[-1] == "":  # after a final newline, or of an empty file
        lines = lines.head(-1)
    return lines.str.strip_suffix("\r") if b"\r" in data else lines


def _str_lines(path: Path, data: bytes, start: int) -> pl.Series:
    return pl.Series(_text_documents(path, decode(path, data, start), "line"), dtype=pl.String)


def _lines(text: str) -> list[str]:
    """Lines of a line-based format (JSONL, CoNLL-U): split at LF only (CRLF tolerated). Unicode
    line separators (U+2028, U+0085, ...) may appear inside JSON strings and words."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def jsonl_documents(path: Path, text: str, field_name: str, start: int = 0) -> list[str]:
    """`start`: the byte offset of `text` in the file (a line start); an error's line number adds
    the lines before it, counted only then."""

    def at(line_no: int) -> str:
        return f"{shown(path)}:{line_no + (lines_before(path, start) if start else 0)}"

    docs = []
    for line_no, line in enumerate(_lines(text), start=1):
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


def _parquet_documents(path: Path, data: bytes, column: str, limit: int) -> list[str]:
    """The text column's values, checked before they are decoded: rows and the column's declared size
    from the file's metadata, then, batch by batch, the bytes of text its dictionary-encoded values
    expand to (a tiny file can repeat one long value a billion times). Dictionary-encoded text
    (pandas categoricals) is text."""
    try:
        schema = pq.ParquetFile(pa.BufferReader(data)).schema_arrow
    except Exception as exc:  # pyarrow raises several types for damaged files
        raise InputError(f"{shown(path)}: not a readable Parquet file ({_one_line(exc)})") from None
    if column not in schema.names:
        raise InputError(f"{shown(path)}: no column {column!r} (columns: {', '.join(schema.names)}); set "
                         "corpus.text_field")
    column_type = schema.field(column).type
    value_type = column_type.value_type if pa.types.is_dictionary(column_type) else column_type
    if not (pa.types.is_string(value_type) or pa.types.is_large_string(value_type)
            or pa.types.is_string_view(value_type)):
        raise InputError(f"{shown(path)}: column {column!r} holds {column_type}, not text; set corpus.text_field")
    file = pq.ParquetFile(pa.BufferReader(data), read_dictionary=[column])  # values and indices: nothing expands yet
    meta = file.metadata
    declared = sum(meta.row_group(g).column(c).total_uncompressed_size for g in range(meta.num_row_groups)
                   for c in range(meta.num_columns) if meta.row_group(g).column(c).path_in_schema == column)
    if meta.num_rows > limit // ROW_BYTES or declared > limit:
        raise InputError(f"{shown(path)}: {meta.num_rows} rows, {declared} bytes in column {column!r}: more than "
                         f"corpus.max_file_bytes ({limit}) allows; raise it if intended")
    texts, expanded = [], 0
    try:
        for batch in file.iter_batches(batch_size=1 << 16, columns=[column]):
            values = batch.column(0)
            expanded += _text_bytes(values)
            if expanded > limit:
                raise InputError(f"{shown(path)}: column {column!r} expands to more than corpus.max_file_bytes "
                                 f"({limit}) bytes of text (repeated dictionary values); raise it if intended")
            if pa.types.is_dictionary(values.type):
                values = values.dictionary_decode()
            texts.extend(t for t in values.to_pylist() if isinstance(t, str))
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"{shown(path)}: not a readable Parquet file ({_one_line(exc)})") from None
    return texts


ROW_BYTES = 16  # memory a row of text costs at least (offsets, the Python string): the limit on rows


def _text_bytes(values: pa.Array) -> int:
    """Bytes of text `values` hold once decoded, without decoding them (a dictionary's value lengths,
    counted per use)."""
    if not pa.types.is_dictionary(values.type):
        return int(pc.sum(pc.binary_length(values)).as_py() or 0)
    lengths = pc.binary_length(values.dictionary).fill_null(0).to_numpy(zero_copy_only=False)
    uses = np.bincount(values.indices.fill_null(0).to_numpy(zero_copy_only=False), minlength=len(lengths))
    return int(lengths.astype(np.int64) @ uses)


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]  # dumps put every element in the export-0.x namespace


def wiki_documents(path: Path, data: bytes) -> list[str]:
    """Articles (namespace 0, not redirects) of a MediaWiki dump, markup stripped by gensim's
    `filter_wiki`. The XML is read incrementally, page by page, so errors carry a line number."""
    from gensim.corpora.wikicorpus import filter_wiki

    docs: list[str] = []
    depth = 0
    try:
        for event, elem in ET.iterparse(io.BytesIO(data), events=("start", "end")):
            if event == "start":
                if depth == 0 and _local(elem.tag) != "mediawiki":
                    raise InputError(f"{shown(path)}: root element <{_local(elem.tag)}> is not <mediawiki>; not a "
                                     "MediaWiki XML dump")
                depth += 1
                continue
            depth -= 1
            if _local(elem.tag) != "page":
                continue
            fields = {_local(child.tag): child for child in elem}
            namespace = (fields["ns"].text or "").strip() if "ns" in fields else "0"
            revision = fields.get("revision")
            text_elem = next((c for c in revision if _local(c.tag) == "text"), None) if revision is not None else None
            text = text_elem.text if text_elem is not None else None
            if (namespace == "0" and text and "redirect" not in fields
                    and not text.lstrip().lower().startswith("#redirect")):
                docs.append(_WIKI_QUOTES.sub("", filter_wiki(text)))  # filter_wiki keeps ''bold''/''italic'' quotes
            elem.clear()  # pages are done with: keep memory flat on large dumps
    except ET.ParseError as exc:
        line, column = exc.position
        reason = str(exc).split(":", 1)[0]
        raise InputError(f"{shown(path)}:{line}: not well-formed XML ({reason}, column {column}); the dump is damaged "
                         "or truncated") from None
    return docs


def read_file(path: Path, options: IngestOptions) -> tuple[list[str], pl.DataFrame | None]:
    """Raw document texts of one file, and its tagged sentences if it is CoNLL-U."""
    docs, tagged = read_documents(path, options)
    return docs.to_list(), tagged


def read_documents(path: Path, options: IngestOptions) -> tuple[pl.Series, pl.DataFrame | None]:
    """`read_file` with the texts as a Series (plain-text lines never become Python strings)."""
    fmt, compression = format_of(path)
    data = _read_bytes(path, compression, options.max_file_bytes)
    if fmt == "text" and data[:512].lstrip().startswith(b"<mediawiki"):
        fmt = "wiki"  # dumps are often named *.xml-p<range>.bz2
    if fmt == "parquet":
        return text_series(_parquet_documents(path, data, options.text_field, options.max_file_bytes)), None
    if fmt == "wiki":
        return text_series(wiki_documents(path, data)), None
    if fmt == "text" and options.text_unit == "line":
        return line_documents(path, data), None
    text = decode(path, data)
    if fmt == "jsonl":
        return text_series(jsonl_documents(path, text, options.text_field)), None
    if fmt == "conllu":
        sents = list(parse_lines(_lines(text), source=shown(path)))
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
    return text_series(_text_documents(path, text, options.text_unit)), None


def text_series(texts: list[str]) -> pl.Series:
    return pl.Series(texts, dtype=pl.String)


def lines_before(path: Path, start: int) -> int:
    """Newlines in the file's first `start` bytes (for error line numbers of a range)."""
    count = 0
    with path.open("rb") as f:
        while start > 0 and (block := f.read(min(1 << 24, start))):
            count += block.count(b"\n")
            start -= len(block)
    return count
