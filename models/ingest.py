"""Corpus ingestion: read sources of many formats into clean documents with a stable split.

Sources are files, directories (read recursively, sorted) or glob patterns, plus the built-in
`builtin:enwiki` (gensim's bundled Wikipedia dump excerpt, the default corpus) and `builtin:lee`.
The format follows the name, after an optional `.gz`/`.bz2`:

| ending | format | a document is |
| --- | --- | --- |
| `.txt`, anything else | UTF-8 plain text | a line (default), a blank-line paragraph, or the file (`text_unit`) |
| `.jsonl`, `.ndjson` | JSON lines | the `text_field` of each object |
| `.parquet` | Parquet | the `text_field` column of each row |
| `.conllu` | CoNLL-U | a sentence (its words; tags go to the tagged corpus) |
| `.xml` or `<mediawiki` content | MediaWiki XML dump | an article (namespace 0, no redirects, markup stripped) |

Text is cleaned by `models.text.clean_series` (NFC, whitespace, sentence split, optional
lowercase). Exact duplicates (after cleaning) are dropped, keeping the first. Each document's id is
the SHA-1 of its cleaned text (16 hex digits); its split comes from that id (so a document keeps
its split across rebuilds), except in files whose name gives a split, which is then the file's: a
split word (`train`; `dev`, `valid` or `validation`; `test`) that starts or ends a dot-separated part
of the name, cut at `-`/`_` (`train.txt`, `en_ewt-ud-dev.conllu`, `wiki.test.tokens`,
`validation-00000-of-00001.parquet`). One in the middle of a part (`my_test_notes.txt`) or inside a
word (`latest.txt`) is just part of the name.

Policy on bad input (see docs/reliability.md). Every problem is one line naming the file, and
the line where there is one; nothing is published from a failed ingestion.

- Encodings: text must be UTF-8 (a UTF-8 BOM is dropped). Files that start with a UTF-16/UTF-32
  BOM are decoded as such. Anything else that is not valid UTF-8, including a file that mixes
  encodings, is rejected (never silently replaced): `file:line: invalid UTF-8`.
- A NUL byte in the first 8 KiB (without a UTF-16/32 BOM) marks a binary file: rejected.
- Compressed files: a truncated or corrupt `.gz`/`.bz2` is rejected; so is a file that
  decompresses to more than `max_file_bytes` (a decompression bomb), reading at most that much.
- MediaWiki XML must be well-formed with a `<mediawiki>` root (`file:line: not well-formed XML`);
  entity-expansion bombs are refused by the XML parser (expat ≥ 2.4).
- JSONL: invalid JSON, nesting too deep to parse, or a line without a string `text_field` is
  rejected with its line number. Parquet: a damaged file, or no string `text_field` column.
- CoNLL-U: a line without 10 columns or with an out-of-sequence/non-integer ID is rejected.
- Lines have no length limit: a single 200 MB line is one document (memory ~13× its size).
- An empty file (or one with no document) is skipped and listed in the stats' `skipped`.
- `bad_files="skip"` turns each per-file rejection above into a skip: the file is left out and
  listed in `skipped` with the one-line reason (the corpus stats count them in `skipped_inputs`).
  A missing source or an empty corpus still fails.

Sharding (for many workers; `plan_shards`, `ingest_shard`, `merge_shards`): a large uncompressed
plain-text (one document per line) or JSONL file is cut into byte ranges; a range owns the lines
that *start* inside it, so it reads from the first line start at or after its first byte to the
first line start at or after its end. Other files (compressed, XML, Parquet, CoNLL-U, UTF-16/32,
paragraph/file units) are read whole, small ones grouped into one shard. Each shard reads and
cleans its documents; the merge puts the shards back in file/offset order, applies the bad-file
policy per file and removes duplicates keeping the first, so the corpus is the same, row for row,
as `build_corpus`'s (which is the merge of one shard holding every file). An error in a range
names the file's line (newlines before the range are counted only then) and absolute byte; for a
file cut in ranges, decoding errors come before JSON errors, as when the file is read whole.
"""

from __future__ import annotations

import bz2
import codecs
import glob
import gzip
import hashlib
import io
import json
import os
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from lexiflow.models.conllu import parse_lines
from lexiflow.models.errors import InputError, ParameterError
from lexiflow.models.progress import Progress
from lexiflow.models.text import clean_series

BUILTIN = {
    "builtin:enwiki": "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2",
    "builtin:lee": "lee_background.cor",
}
SPLITS = ("train", "valid", "test")
_SPLIT_WORDS = {"train": "train", "dev": "valid", "valid": "valid", "validation": "valid", "test": "test"}
_BINARY_SNIFF = 8192
_WIKI_QUOTES = re.compile(r"'{2,}")


@dataclass(frozen=True)
class IngestOptions:
    lowercase: bool = True
    split_sentences: bool = True
    text_unit: Literal["line", "paragraph", "file"] = "line"
    dedupe: bool = True
    valid_fraction: float = 0.05
    test_fraction: float = 0.05
    text_field: str = "text"
    max_file_bytes: int = 4 << 30  # decompressed; protects against decompression bombs
    bad_files: Literal["fail", "skip"] = "fail"  # a file that cannot be read: stop, or skip and count it

    def __post_init__(self) -> None:
        for name in ("valid_fraction", "test_fraction"):
            if not 0 <= getattr(self, name) < 1:
                raise ParameterError(f"{name}={getattr(self, name)}: must be in [0, 1)")
        if self.text_unit not in ("line", "paragraph", "file"):  # a typo would silently read lines
            raise ParameterError(f"text_unit={self.text_unit!r}: use 'line', 'paragraph' or 'file'")
        if self.bad_files not in ("fail", "skip"):
            raise ParameterError(f"bad_files={self.bad_files!r}: use 'fail' or 'skip'")
        if self.valid_fraction + self.test_fraction >= 1:
            raise ParameterError("valid_fraction + test_fraction must leave a training split (< 1)")


DOCUMENT_COLUMNS = ("doc_id", "source", "split", "text")


@dataclass
class Corpus:
    documents: pl.DataFrame | None  # DOCUMENT_COLUMNS, text = sentences joined by "\n"; None: written as merged
    stats: dict = field(default_factory=dict)


# ---- sources -------------------------------------------------------------------------------
def resolve_sources(sources: list[str]) -> list[Path]:
    """Expand built-ins, directories and globs into a sorted, de-duplicated list of files."""
    if not sources:
        raise ParameterError("corpus.sources is empty: name at least one file, directory, glob or builtin:enwiki")
    files: list[Path] = []
    for source in sources:
        if source in BUILTIN:
            from gensim.test.utils import datapath

            files.append(Path(datapath(BUILTIN[source])))
        elif source.startswith("builtin:"):
            raise ParameterError(f"unknown built-in corpus {source!r}; choose from {', '.join(BUILTIN)}")
        elif os.path.isdir(source):
            found = sorted(p for p in Path(source).rglob("*") if p.is_file() and not p.name.startswith("."))
            if not found:
                raise InputError(f"{source}: directory holds no files")
            files.extend(found)
        elif os.path.isfile(source):  # before globs: an existing name may hold `[`, `*` or `?`
            files.append(Path(source))
        elif any(c in source for c in "*?["):
            found = sorted(Path(p) for p in glob.glob(source, recursive=True) if os.path.isfile(p))
            if not found:
                raise InputError(f"{source}: no file matches this pattern")
            files.extend(found)
        else:
            raise InputError(f"{source}: no such file or directory; check the path in corpus.sources")
    return list(dict.fromkeys(p.resolve() for p in files))


def fingerprint(files: list[Path], hash_limit: int = 1 << 30) -> list[dict]:
    """What the corpus version depends on: each file's SHA-256, or for files over `hash_limit`
    bytes its size and modification time (hashing 100 GB on every run costs more than it saves)."""
    out = []
    for path in files:
        stat = path.stat()
        entry = {"name": path.name, "size": stat.st_size}
        if stat.st_size > hash_limit:
            entry.update(mtime_ns=stat.st_mtime_ns, path=str(path))
        else:
            digest = hashlib.sha256()
            with path.open("rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
            entry["sha256"] = digest.hexdigest()
        out.append(entry)
    return out


def _format_of(path: Path) -> tuple[str, str | None]:
    name = path.name.lower()
    compression = next((c for c in ("gz", "bz2") if name.endswith("." + c)), None)
    if compression:
        name = name[: -len(compression) - 1]
    for suffix, fmt in ((".jsonl", "jsonl"), (".ndjson", "jsonl"), (".parquet", "parquet"),
                        (".conllu", "conllu"), (".xml", "wiki")):
        if name.endswith(suffix):
            return fmt, compression
    return "text", compression


def _open(path: Path):
    try:
        return open(path, "rb")  # noqa: SIM115 (the caller closes it; errors here are about the file, not its data)
    except (FileNotFoundError, PermissionError, IsADirectoryError) as exc:
        raise InputError(f"{path}: cannot open ({exc.strerror}); check the path in corpus.sources") from None


def _read_bytes(path: Path, compression: str | None, limit: int) -> bytes:
    with _open(path) as raw:
        if compression is None:
            # Other OSErrors here are I/O trouble, raised as they are (transient: the stage retries).
            data = raw.read(min(limit, os.fstat(raw.fileno()).st_size) + 1)  # read(n) allocates n bytes
        else:
            try:
                opened = gzip.GzipFile(fileobj=raw, mode="rb") if compression == "gz" else bz2.BZ2File(raw, mode="rb")
                with opened as f:
                    data = _read_at_most(f, limit + 1)
            except (OSError, EOFError, ValueError) as exc:  # truncated or corrupt archives
                raise InputError(f"{path}: cannot read ({_one_line(exc)}); the file is damaged or not "
                                 f"{compression} data") from None
    if len(data) > limit:
        raise InputError(f"{path}: more than {limit} bytes once decompressed; raise corpus.max_file_bytes if intended")
    return data


def _read_at_most(f, size: int, chunk: int = 16 << 20) -> bytes:
    """Up to `size` bytes of a stream of unknown length, in chunks (never allocating `size` up front)."""
    parts, total = [], 0
    while total < size:
        part = f.read(min(chunk, size - total))
        if not part:
            break
        parts.append(part)
        total += len(part)
    return b"".join(parts)


def _one_line(exc: BaseException, limit: int = 200) -> str:
    """A library's error message as one short line (some span several)."""
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


_WIDE_BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"),
              (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))


def _decode(path: Path, data: bytes, start: int = 0) -> str:
    """The text of a file's bytes, or of its bytes from `start` on (a line start; BOMs and the
    binary sniff concern the file's beginning only, checked when the file was planned)."""
    if start:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = _lines_before(path, start) + data[: exc.start].count(b"\n") + 1
            raise InputError(f"{path}:{line}: invalid UTF-8 (byte {start + exc.start}); re-encode the file as UTF-8 "
                             "(mixed encodings are not guessed)") from None
    for bom, encoding in _WIDE_BOMS:  # UTF-32 first: its LE BOM starts with UTF-16's
        if data.startswith(bom):
            try:
                return data.decode(encoding)
            except UnicodeDecodeError as exc:
                raise InputError(f"{path}: invalid {encoding.upper()} at byte {exc.start}; re-encode the file as "
                                 "UTF-8") from None
    if b"\x00" in data[:_BINARY_SNIFF]:
        raise InputError(f"{path}: looks like a binary file (NUL bytes); remove it from the sources")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise InputError(
            f"{path}:{line}: invalid UTF-8 (byte {exc.start}); re-encode the file as UTF-8 "
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


def _line_documents(path: Path, data: bytes, start: int = 0) -> pl.Series:
    """`_text_documents(path, _decode(path, data, start), "line")` as a Series, fast for the usual
    file (UTF-8, LF or CRLF line ends): Arrow cuts the bytes at LF (polars' split of one huge string
    touches ~5× its size in fresh memory) and polars validates them as UTF-8; they never become
    Python strings. Anything else, an invalid file included (for its error message), goes the `str` way."""
    if not start and (any(data.startswith(bom) for bom, _ in _WIDE_BOMS) or b"\x00" in data[:_BINARY_SNIFF]):
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
    return pl.Series(_text_documents(path, _decode(path, data, start), "line"), dtype=pl.String)


def _lines(text: str) -> list[str]:
    """Lines of a line-based format (JSONL, CoNLL-U): split at LF only (CRLF tolerated). Unicode
    line separators (U+2028, U+0085, ...) may appear inside JSON strings and words."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def _jsonl_documents(path: Path, text: str, field_name: str, start: int = 0) -> list[str]:
    """`start`: the byte offset of `text` in the file (a line start); an error's line number adds
    the lines before it, counted only then."""

    def at(line_no: int) -> str:
        return f"{path}:{line_no + (_lines_before(path, start) if start else 0)}"

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


def _parquet_documents(path: Path, data: bytes, column: str) -> list[str]:
    try:
        table = pq.read_table(io.BytesIO(data))
    except Exception as exc:  # pyarrow raises several types for damaged files
        raise InputError(f"{path}: not a readable Parquet file ({_one_line(exc)})") from None
    if column not in table.column_names:
        columns = ", ".join(table.column_names)
        raise InputError(f"{path}: no column {column!r} (columns: {columns}); set corpus.text_field")
    column_type = table.schema.field(column).type
    if not (pa.types.is_string(column_type) or pa.types.is_large_string(column_type)
            or pa.types.is_string_view(column_type)):
        raise InputError(f"{path}: column {column!r} holds {column_type}, not text; set corpus.text_field")
    return [t for t in table.column(column).to_pylist() if isinstance(t, str)]


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]  # dumps put every element in the export-0.x namespace


def _wiki_documents(path: Path, data: bytes) -> list[str]:
    """Articles (namespace 0, not redirects) of a MediaWiki dump, markup stripped by gensim's
    `filter_wiki`. The XML is read incrementally, page by page, so errors carry a line number."""
    from gensim.corpora.wikicorpus import filter_wiki

    docs: list[str] = []
    depth = 0
    try:
        for event, elem in ET.iterparse(io.BytesIO(data), events=("start", "end")):
            if event == "start":
                if depth == 0 and _local(elem.tag) != "mediawiki":
                    raise InputError(f"{path}: root element <{_local(elem.tag)}> is not <mediawiki>; not a MediaWiki "
                                     "XML dump")
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
        raise InputError(f"{path}:{line}: not well-formed XML ({reason}, column {column}); the dump is damaged or "
                         "truncated") from None
    return docs


def _file_split(path: Path) -> str | None:
    """The split the file's name gives (see the module's docstring), or None."""
    for part in path.name.lower().split("."):
        words = re.split(r"[-_]", part)
        # First or last word only: a split word between others is part of a description (`my_test_notes`)
        for word in (words[0], words[-1]):
            if word in _SPLIT_WORDS:
                return _SPLIT_WORDS[word]
    return None


def no_train_split(what: str, per_split: dict[str, int]) -> InputError:
    """The error for a corpus whose train split is empty (every later stage learns from it)."""
    held_out = ", ".join(f"{n} {split}" for split, n in sorted(per_split.items()) if n) or "none"
    return InputError(f"{what} has no train split (held out: {held_out}), and the tokenizer, embeddings, "
                      "LMs and taggers learn from it. A source file named after a split (wiki.valid.tokens, "
                      "en_ewt-ud-test.conllu) goes whole into that split: add training text, or give the file "
                      "a name without a split word so its documents are split by corpus.valid_fraction/test_fraction")


def read_file(path: Path, options: IngestOptions) -> tuple[list[str], pl.DataFrame | None]:
    """Raw document texts of one file, and its tagged sentences if it is CoNLL-U."""
    docs, tagged = _read_documents(path, options)
    return docs.to_list(), tagged


def _read_documents(path: Path, options: IngestOptions) -> tuple[pl.Series, pl.DataFrame | None]:
    """`read_file` with the texts as a Series (plain-text lines never become Python strings)."""
    fmt, compression = _format_of(path)
    data = _read_bytes(path, compression, options.max_file_bytes)
    if fmt == "text" and data[:512].lstrip().startswith(b"<mediawiki"):
        fmt = "wiki"  # dumps are often named *.xml-p<range>.bz2
    if fmt == "parquet":
        return _series(_parquet_documents(path, data, options.text_field)), None
    if fmt == "wiki":
        return _series(_wiki_documents(path, data)), None
    if fmt == "text" and options.text_unit == "line":
        return _line_documents(path, data), None
    text = _decode(path, data)
    if fmt == "jsonl":
        return _series(_jsonl_documents(path, text, options.text_field)), None
    if fmt == "conllu":
        sents = list(parse_lines(_lines(text), source=str(path)))
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
        return _series([" ".join(s.words) for s in sents]), tagged
    return _series(_text_documents(path, text, options.text_unit)), None


def _series(texts: list[str]) -> pl.Series:
    return pl.Series(texts, dtype=pl.String)


# ---- the corpus ----------------------------------------------------------------------------
def _split_from_id(doc_ids: pl.Expr, options: IngestOptions) -> pl.Expr:
    u = doc_ids.str.slice(0, 8).str.to_integer(base=16).cast(pl.Float64) / 2**32
    return (
        pl.when(u < options.valid_fraction).then(pl.lit("valid"))
        .when(u < options.valid_fraction + options.test_fraction).then(pl.lit("test"))
        .otherwise(pl.lit("train"))
    )


def iter_files(files: list[Path], options: IngestOptions, progress: Callable | None = None,
               skipped: list[dict] | None = None) -> Iterator:
    """(path, texts, tagged) per readable file. With `bad_files="skip"`, a file that raises
    `InputError` is left out and recorded in `skipped` (source, reason)."""
    total = sum(p.stat().st_size for p in files)
    with Progress("ingest", total=total, unit="bytes", callback=progress) as bar:
        for path in files:
            try:
                result = read_file(path, options)
            except InputError as exc:
                if options.bad_files != "skip":
                    raise
                if skipped is not None:
                    skipped.append({"source": str(path), "reason": str(exc)})
                result = None
            if result is not None:
                yield path, *result
            bar.update(path.stat().st_size)


def build_corpus(files: list[Path], options: IngestOptions, progress: Callable | None = None) -> Corpus:
    """The corpus of these files, read in this process: one shard holding every file whole."""
    whole = [FileRange(str(path), i) for i, path in enumerate(files)]
    return merge_shards(files, [ingest_shard(whole, options, progress)], options)


# ---- shards: pieces of ingestion that run apart (other processes or machines) and merge ----------
@dataclass(frozen=True)
class FileRange:
    """File number `file` of the sources, whole (`stop` None) or the lines that start in bytes [start, stop)."""

    path: str
    file: int
    start: int = 0
    stop: int | None = None

    @property
    def size(self) -> int:
        return os.path.getsize(self.path) if self.stop is None else self.stop - self.start


@dataclass
class ShardResult:
    """What a shard read: its documents (cleaned, non-empty, duplicates kept, with the number of
    their `file`), raw documents per file (0: empty) and per-file errors (rank, start, message);
    rank 0 is a read/decode error, 1 a parse error (reported after any decode error of the file)."""

    documents: pl.DataFrame | pl.LazyFrame  # lazy: a Parquet part, read when the merge reaches it
    texts: dict[int, int]
    errors: dict[int, tuple[int, int, str]]


_SHARD_SCHEMA = {"file": pl.UInt32, "doc_id": pl.String, "source": pl.String, "split": pl.String, "text": pl.String}


def plan_shards(files: list[Path], options: IngestOptions, shard_bytes: int) -> list[list[FileRange]]:
    """Shards of about `shard_bytes`, in file then offset order: byte ranges of the large files
    that can be cut at newlines (uncompressed UTF-8 plain text with line documents, or JSONL),
    consecutive other files grouped whole."""
    if shard_bytes < 1:
        raise ParameterError(f"shard_bytes={shard_bytes}: must be at least 1")
    shards: list[list[FileRange]] = []
    group: list[FileRange] = []
    group_bytes = 0
    for i, path in enumerate(files):
        size = path.stat().st_size
        if size > shard_bytes and _splittable(path, size, options):
            if group:
                shards.append(group)
                group, group_bytes = [], 0
            shards.extend([FileRange(str(path), i, a, min(a + shard_bytes, size))] for a in range(0, size, shard_bytes))
            continue
        if group and group_bytes + size > shard_bytes:
            shards.append(group)
            group, group_bytes = [], 0
        group.append(FileRange(str(path), i))
        group_bytes += size
    return shards + ([group] if group else [])


def _splittable(path: Path, size: int, options: IngestOptions) -> bool:
    fmt, compression = _format_of(path)
    if compression or size > options.max_file_bytes or fmt not in ("text", "jsonl"):
        return False
    if fmt == "text" and options.text_unit != "line":
        return False
    try:
        with path.open("rb") as f:
            head = f.read(_BINARY_SNIFF)
    except OSError:
        return False  # read whole: the reader reports it
    if any(head.startswith(bom) for bom, _ in _WIDE_BOMS) or b"\x00" in head:
        return False
    return not (fmt == "text" and head[:512].lstrip().startswith(b"<mediawiki"))


class _ParseError(InputError):
    """A parse error inside a byte range (ranks after decode errors of the same file)."""


def _line_start(f, pos: int) -> int:
    """The first line start at or after byte `pos` (0, just after a newline, or the end)."""
    if pos <= 0:
        return 0
    f.seek(pos - 1)
    while block := f.read(1 << 16):
        newline = block.find(b"\n")
        if newline >= 0:
            return f.tell() - len(block) + newline + 1
    return f.tell()


def _lines_before(path: Path, start: int) -> int:
    """Newlines in the file's first `start` bytes (for error line numbers of a range)."""
    count = 0
    with path.open("rb") as f:
        while start > 0 and (block := f.read(min(1 << 24, start))):
            count += block.count(b"\n")
            start -= len(block)
    return count


def _range_texts(part: FileRange, options: IngestOptions) -> pl.Series:
    path = Path(part.path)
    if part.stop is None:
        return _read_documents(path, options)[0]
    with _open(path) as f:
        begin, end = _line_start(f, part.start), _line_start(f, part.stop)
        f.seek(begin)
        data = f.read(max(0, end - begin))
    if _format_of(path)[0] == "text":
        return _line_documents(path, data, begin)
    text = _decode(path, data, begin)
    try:
        return _series(_jsonl_documents(path, text, options.text_field, begin))
    except InputError as exc:
        raise _ParseError(str(exc)) from None


def ingest_shard(shard: list[FileRange], options: IngestOptions, progress: Callable | None = None) -> ShardResult:
    """Read and clean one shard. Errors are returned per file, not raised: the bad-file policy
    needs every range of a file (`merge_shards` applies it). With `bad_files="fail"` the shard
    stops at its first error (what follows would not be used)."""
    frames, texts, errors = [], {}, {}
    with Progress("ingest", total=sum(part.size for part in shard), unit="bytes", callback=progress) as bar:
        for part in shard:
            try:
                docs = _range_texts(part, options)
            except InputError as exc:
                errors[part.file] = (int(isinstance(exc, _ParseError)), part.start, str(exc))
                if options.bad_files != "skip":
                    break
                docs = _series([])
            texts[part.file] = texts.get(part.file, 0) + len(docs)
            if len(docs):
                path = Path(part.path)
                frames.append(pl.DataFrame({"file": part.file, "source": path.name, "text": docs,
                                            "file_split": _file_split(path)},
                                           schema={"file": pl.UInt32, "source": pl.String, "text": pl.String,
                                                   "file_split": pl.String}))
            bar.update(part.size)
    documents = _clean(pl.concat(frames), options) if frames else pl.DataFrame(schema=_SHARD_SCHEMA)
    return ShardResult(documents, texts, errors)


def _clean(raw: pl.DataFrame, options: IngestOptions) -> pl.DataFrame:
    """Raw documents (file, source, text, file_split) -> cleaned, non-empty, with id and split."""
    return pl.concat(_in_threads(lambda part: _clean_rows(part, options), raw))


def _clean_rows(raw: pl.DataFrame, options: IngestOptions) -> pl.DataFrame:
    docs = raw.with_columns(
        text=clean_series(raw["text"], lowercase=options.lowercase, sentences=options.split_sentences)
    ).filter(pl.col("text").str.len_bytes() > 0)
    # SHA-1 over bytes, not str (no decoding and encoding back), taken out a slice at a time (less fresh memory)
    texts, step, sha1 = docs["text"].cast(pl.Binary), 1 << 14, hashlib.sha1
    ids = [sha1(t).hexdigest()[:16] for i in range(0, len(texts), step) for t in texts.slice(i, step).to_list()]
    docs = docs.with_columns(doc_id=pl.Series(ids, dtype=pl.String))
    docs = docs.with_columns(split=pl.coalesce("file_split", _split_from_id(pl.col("doc_id"), options)))
    return docs.select(*_SHARD_SCHEMA)


_THREAD_MIN_BYTES = 4 << 20  # below this a thread's start and the concat cost more than they save


def _in_threads(fn: Callable, rows: pl.DataFrame | pl.Series, text: str = "text") -> list:
    """`fn` over consecutive row slices of `rows`, one slice per polars thread (POLARS_MAX_THREADS),
    results in row order. polars' and Arrow's string kernels release the GIL, so a slice per core
    runs ~2x faster on 2 cores (a single Series op runs on one)."""
    column = rows[text] if isinstance(rows, pl.DataFrame) else rows
    size = int(column.str.len_bytes().cast(pl.UInt64).sum() or 0)
    n = max(1, min(pl.thread_pool_size(), size // _THREAD_MIN_BYTES, len(rows)))
    if n == 1:
        return [fn(rows)]
    step = -(-len(rows) // n)
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(fn, [rows.slice(i, step) for i in range(0, len(rows), step)]))


def merge_shards(files: list[Path], results: list[ShardResult], options: IngestOptions,
                 write: Callable[[pl.DataFrame], None] | None = None) -> Corpus:
    """The corpus from its shards' results, in shard (= file, offset) order: a file with an error
    in any range fails the ingestion or, with `bad_files="skip"`, is left out whole; duplicates
    are removed keeping the first.

    `write`: hand the kept documents to it shard by shard instead of returning them (the Corpus
    then has `documents=None`). With results whose documents are LazyFrames (Parquet parts), the
    merge then holds one shard's documents at a time, plus every document's id and file number
    (for the duplicates) and the distinct words (for the stats)."""
    texts: dict[int, int] = {}
    errors: dict[int, tuple[int, int, str]] = {}
    for result in results:
        for file, n in result.texts.items():
            texts[file] = texts.get(file, 0) + n
        for file, error in result.errors.items():
            errors[file] = min(errors.get(file, error), error)  # decode before parse errors, then the earliest
    skipped, bad = [], set()
    for i, path in enumerate(files):
        if i in errors:
            if options.bad_files != "skip":
                raise InputError(errors[i][2])
            skipped.append({"source": str(path), "reason": errors[i][2]})
            bad.add(i)
        elif not texts.get(i):
            skipped.append({"source": str(path), "reason": "no documents (empty file)"})
    if not any(texts.get(i) for i in range(len(files)) if i not in bad):
        reasons = "; ".join(s["reason"] for s in skipped if "empty file" not in s["reason"])
        raise InputError(f"no documents found in {', '.join(map(str, files))}: the corpus would be empty"
                         + (f" (skipped: {reasons})" if reasons else ""))

    frames = [result.documents.lazy() for result in results]
    keys = pl.concat([frame.select("file", "doc_id") for frame in frames]).collect()
    good = ~keys["file"].is_in(sorted(bad))
    keep = good
    if options.dedupe:  # the first of each text among the files kept (bad files' rows are null here)
        keep = good & keys.select(pl.when(good).then(pl.col("doc_id")).is_first_distinct()).to_series()
    del keys
    counts, kept, start = CorpusCounts(), [], 0
    for frame in frames:
        docs = frame.collect()
        docs, start = docs.filter(keep.slice(start, docs.height)).select(*DOCUMENT_COLUMNS), start + docs.height
        counts.add(docs)
        if write is None:
            kept.append(docs)
        else:
            write(docs)
    if counts.documents == 0:
        raise InputError(f"no non-empty documents in {', '.join(map(str, files))}: the corpus would be empty")
    stats = counts.stats(files, int(good.sum()) - counts.documents, skipped)
    return Corpus(None if write is not None else pl.concat(kept), stats)


def tagged_files(files: list[Path]) -> list[Path]:
    return [p for p in files if _format_of(p)[0] == "conllu"]


def build_tagged(files: list[Path], options: IngestOptions, progress: Callable | None = None) -> pl.DataFrame:
    """Tagged sentences (sent_id, source, split, words, upos, xpos) of the CoNLL-U files, in order,
    case and duplicates kept (a tagger learns from every sentence as written)."""
    frames: list[pl.DataFrame] = []
    for path, _texts, tagged in iter_files(tagged_files(files), options, progress, []):
        frames.append(tagged.with_columns(source=pl.lit(path.name), file_split=pl.lit(_file_split(path))))
    if not frames or not sum(f.height for f in frames):
        raise InputError("no CoNLL-U sentences among the sources: add a .conllu file to tag")
    sentence_hash = pl.col("sent_id").map_elements(lambda s: hashlib.sha1(s.encode()).hexdigest()[:16],
                                                   return_dtype=pl.String)
    return pl.concat(frames).with_columns(
        split=pl.coalesce("file_split", _split_from_id(sentence_hash, options))
    ).select("sent_id", "source", "split", "words", "upos", "xpos")


class CorpusCounts:
    """The corpus stats, added up a table of documents at a time (the same figures as counting
    them all at once). Tokens and types here are whitespace-separated words of the cleaned text
    (cheap); the tokenizer stage reports counts under its own pre-tokenization."""

    COMPACT_WORDS = 1 << 22  # distinct words held per table before they are merged into one set

    def __init__(self) -> None:
        self.documents = self.sentences = self.tokens = self.text_bytes = 0
        self.per_split: dict[str, int] = {}
        self._words: list[pa.Array] = []  # each table's distinct words (a word may repeat across tables)
        self._compacted = 0  # distinct words in self._words[0] after the last merge

    def add(self, docs: pl.DataFrame) -> None:
        self.documents += docs.height
        # UInt64 sums: polars sums the UInt32 lengths without widening (one part may hold > 4 GiB)
        self.sentences += int(docs["text"].str.count_matches("\n", literal=True).cast(pl.UInt64).sum()) + docs.height
        self.text_bytes += int(docs["text"].str.len_bytes().cast(pl.UInt64).sum())
        for split, n in docs.group_by("split").len().iter_rows():
            self.per_split[split] = self.per_split.get(split, 0) + n
        tokens, distinct = _words(docs["text"])
        self.tokens += tokens
        self._words.extend(distinct.chunks)
        # Merge once the words added since the last merge outnumber the merged set (and the threshold):
        # each merge at least doubles what it covers, so the merges cost O(total) altogether.
        if sum(map(len, self._words)) - self._compacted > max(self.COMPACT_WORDS, self._compacted):
            self._words = [pc.unique(pa.chunked_array(self._words, pa.large_string()))]
            self._compacted = len(self._words[0])

    def stats(self, files: list[Path], duplicates: int, skipped: list[dict]) -> dict:
        return {
            "documents": self.documents,
            "sentences": self.sentences,
            "tokens": self.tokens,
            "types": pc.count_distinct(pa.chunked_array(self._words, pa.large_string())).as_py(),
            "bytes": int(sum(p.stat().st_size for p in files)),
            "text_bytes": self.text_bytes,
            "files": len(files),
            "duplicates_removed": duplicates,
            "skipped_inputs": len(skipped),
            "skipped": skipped,
            **{f"documents_{split}": n for split, n in sorted(self.per_split.items())},
        }


def _words(texts: pl.Series, chunk_bytes: int = 1 << 24) -> tuple[int, pa.ChunkedArray]:
    """Word count and each chunk's distinct words of `texts`, 2× faster than splitting the Series,
    which makes a 16-byte view per word: here a chunk of texts is joined in one buffer, numpy finds
    the word ends and Arrow the distinct words, each word keeping its following space (so they
    compare as the words do). Chunks of ~16 MB reuse their memory (first-touched memory costs about
    as much as the counting); they run in threads."""
    step = max(1, -(-len(texts) * chunk_bytes // max(1, int(texts.str.len_bytes().cast(pl.UInt64).sum()))))
    counted = [part for rows in _in_threads(lambda rows: [_chunk_words(rows.slice(i, step))
                                                          for i in range(0, len(rows), step)], texts)
               for part in rows]
    distinct = pa.chunked_array([unique for _tokens, unique in counted], pa.large_string())
    return sum(tokens for tokens, _unique in counted), distinct


def _chunk_words(texts: pl.Series) -> tuple[int, pa.Array]:
    """Word count and distinct words of a chunk of texts (see `_word_counts`)."""
    joined = texts.str.replace_all("\n", " ", literal=True).str.join(" ").cast(pl.Binary).item() + b" "
    ends = np.flatnonzero(np.frombuffer(joined, np.uint8) == ord(" ")) + 1
    words = pa.LargeStringArray.from_buffers(len(ends), pa.py_buffer(np.concatenate(([0], ends))),
                                             pa.py_buffer(joined))
    return len(words), pc.unique(words)
