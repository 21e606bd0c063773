"""The corpus: shards of the sources (byte ranges of large files, groups of whole files) read and
cleaned apart, then merged in order (`build_corpus` is the merge of one shard holding every file),
and the tagged corpus of the CoNLL-U sources."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from lexiflow.models.errors import InputError, ParameterError, shown
from lexiflow.models.heap import release_freed_memory
from lexiflow.models.ingest.multistream import Streams, one_shard_why, plan_streams, streams_chunks
from lexiflow.models.ingest.pieces import PieceCache, PieceRecord
from lexiflow.models.ingest.readers import (
    BINARY_SNIFF,
    WIDE_BOMS,
    decode,
    jsonl_documents,
    line_documents,
    open_source,
    read_chunks,
    read_file,
    text_series,
)
from lexiflow.models.ingest.sources import IngestOptions, file_split, format_of, tagged_files
from lexiflow.models.ingest.stats import CorpusCounts, DistinctWords, in_threads, per_document, words_of
from lexiflow.models.progress import Progress
from lexiflow.models.shards import equal_ranges
from lexiflow.models.text import clean_series

DOCUMENT_COLUMNS = ("doc_id", "source", "split", "text")
STREAM_CHUNK = 64 << 20  # text read and cleaned at a time by default (parallel.shard_bytes's default)


@dataclass
class Corpus:
    documents: pl.DataFrame | None  # DOCUMENT_COLUMNS, text = sentences joined by "\n"; None: written as merged
    stats: dict = field(default_factory=dict)


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


def build_corpus(files: list[Path], options: IngestOptions, progress: Callable | None = None,
                 chunk_bytes: int = STREAM_CHUNK) -> Corpus:
    """The corpus of these files, read in this process: one shard holding every file whole (read and
    cleaned in chunks of about `chunk_bytes`)."""
    whole = [FileRange(str(path), i) for i, path in enumerate(files)]
    return merge_shards(files, [ingest_shard(whole, options, progress, chunk_bytes)], options)


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
    rank 0 is a read/decode error, 1 a parse error (reported after any decode error of the file).
    The documents are one table, or a tuple of tables in order (the batches a shard spilled), each
    document with its word, sentence and byte counts; `words`, the distinct words of each file's documents
    (file, word): the corpus stats come from these, added up, not from reading the text again. A table may
    come without its `text` when the shard encoded it (`encoded`): the merge then needs only the rest."""

    documents: pl.DataFrame | pl.LazyFrame | tuple  # lazy: a part, read when the merge reaches it
    texts: dict[int, int]
    errors: dict[int, tuple[int, int, str]]
    words: pl.DataFrame | pl.LazyFrame
    # The first copies within each table of documents (all of them without dedupe), already encoded by the
    # shard as the corpus file's row groups (a `Segment`, `rows` of them; a tuple for a tuple of tables), for
    # `merge_shards`'s `write`; None when the shard encoded nothing.
    encoded: Any = None


_SHARD_SCHEMA = {"file": pl.UInt32, "doc_id": pl.String, "source": pl.String, "split": pl.String, "text": pl.String,
                 "n_words": pl.UInt32, "n_sentences": pl.UInt32, "n_bytes": pl.UInt32, "n_chars": pl.UInt32,
                 "n_odd": pl.UInt32}
_WORDS_SCHEMA = {"file": pl.UInt32, "word": pl.String}
_PIECE_SCHEMA = {name: dtype for name, dtype in _SHARD_SCHEMA.items() if name != "file"}


def plan_shards(files: list[Path], options: IngestOptions, shard_bytes: int) -> list[list[FileRange | Streams]]:
    """Shards of about `shard_bytes` at most, in file then offset order: equal byte ranges (`models.shards`)
    of the large files that can be cut at newlines (uncompressed UTF-8 plain text with line documents, or
    JSONL), ranges of bz2 streams of large Wikipedia multistream dumps with their index (`multistream`),
    consecutive other files grouped whole (a large compressed file is one shard, read in chunks: logged)."""
    if shard_bytes < 1:
        raise ParameterError(f"shard_bytes={shard_bytes}: must be at least 1")
    shards: list[list[FileRange]] = []
    group: list[FileRange] = []
    group_bytes = 0
    for i, path in enumerate(files):
        size = path.stat().st_size
        ranges = _ranges(path, i, size, options, shard_bytes) if size > shard_bytes else None
        if ranges:
            if group:
                shards.append(group)
                group, group_bytes = [], 0
            shards.extend([part] for part in ranges)
            continue
        if group and group_bytes + size > shard_bytes:
            shards.append(group)
            group, group_bytes = [], 0
        group.append(FileRange(str(path), i))
        group_bytes += size
    return shards + ([group] if group else [])


def _ranges(path: Path, i: int, size: int, options: IngestOptions, shard_bytes: int) -> list | None:
    """The ranges a file larger than a shard is cut in, or None (read whole)."""
    if _splittable(path, size, options):
        return [FileRange(str(path), i, a, b) for a, b in equal_ranges(size, shard_bytes)]
    fmt, compression = format_of(path)
    if compression == "bz2" and fmt in ("wiki", "text") and (streams := plan_streams(path, i, shard_bytes)):
        return streams
    if compression:
        one_shard_why(path, size, shard_bytes)
    return None


def _splittable(path: Path, size: int, options: IngestOptions) -> bool:
    fmt, compression = format_of(path)
    if compression or size > options.max_file_bytes or fmt not in ("text", "jsonl"):
        return False
    if fmt == "text" and options.text_unit != "line":
        return False
    try:
        with path.open("rb") as f:
            head = f.read(BINARY_SNIFF)
    except OSError:
        return False  # read whole: the reader reports it
    if any(head.startswith(bom) for bom, _ in WIDE_BOMS) or b"\x00" in head:
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


def _range_chunks(part: FileRange | Streams, options: IngestOptions, chunk_bytes: int,
                  read: Callable[[int], None]) -> Iterator[pl.Series]:
    """A part's raw documents, in chunks of about `chunk_bytes` (a byte range: one chunk); `read(n)`
    is told the bytes of a whole file read as it streams."""
    if isinstance(part, Streams):
        return streams_chunks(part, options.max_file_bytes, chunk_bytes)
    if part.stop is None:
        return read_chunks(Path(part.path), options, chunk_bytes, read)
    return iter([_range_texts(part, options)])


def _range_texts(part: FileRange, options: IngestOptions) -> pl.Series:
    path = Path(part.path)
    with open_source(path) as f:
        begin, end = _line_start(f, part.start), _line_start(f, part.stop)
        f.seek(begin)
        data = f.read(max(0, end - begin))
    if format_of(path)[0] == "text":
        return line_documents(path, data, begin)
    text = decode(path, data, begin)
    try:
        return text_series(jsonl_documents(path, text, options.text_field, begin))
    except InputError as exc:
        raise _ParseError(str(exc)) from None


def ingest_shard(shard: list[FileRange | Streams], options: IngestOptions, progress: Callable | None = None,
                 chunk_bytes: int = STREAM_CHUNK, spill: Callable[[pl.DataFrame], Any] | None = None,
                 pieces: PieceCache | None = None) -> ShardResult:
    """Read and clean one shard. Errors are returned per file, not raised: the bad-file policy
    needs every range of a file (`merge_shards` applies it). With `bad_files="fail"` the shard
    stops at its first error (what follows would not be used).

    Files stream in chunks of about `chunk_bytes` bytes (`read_chunks`), cleaned a batch at a time: a
    batch holds at least half a chunk of text, or the rest of the shard, and at most that plus one chunk.
    `spill(batch)` stores a cleaned batch (a part file) and returns what stands for it: once a shard
    has a second batch, every batch goes there and the documents are the tuple of what it returned, so
    memory holds one batch, not the shard (a large compressed file is one shard). Without it, or with
    one batch, the documents are one table.

    `pieces`: each part of the shard found there is replayed instead of read (`models.ingest.pieces`), and each
    part read without error is left there; chunks are then cleaned as they are read (a piece's own rows), which
    gives the batches the same rows as cleaning them whole."""
    batches: list = []
    raw: list[pl.DataFrame] = []
    held = 0
    texts: dict[int, int] = {}
    errors: dict[int, tuple[int, int, str]] = {}
    words: dict[int, DistinctWords] = {}

    def clean_batch() -> None:
        nonlocal held
        if pieces is None:
            batch = _clean(pl.concat(raw), options)
            for (file,), rows in batch.group_by("file"):
                words.setdefault(file, DistinctWords()).add(words_of(rows["text"])[1])
        else:  # cleaned chunk by chunk, their words counted, as they came
            batch = pl.concat(raw)
        raw.clear()
        held = 0
        if spill is not None and batches:
            if len(batches) == 1:
                batches[0] = spill(batches[0])
            batch = spill(batch)
            release_freed_memory()
        batches.append(batch)

    with Progress("ingest", total=sum(part.size for part in shard), unit="bytes", callback=progress) as bar:
        for part in shard:
            texts.setdefault(part.file, 0)
            record = pieces.get(part) if pieces is not None else None
            if record is not None:  # read before: replayed chunk by chunk, as it was read
                for (n, raw_bytes), docs in zip(record.chunks, record.documents, strict=True):
                    texts[part.file] += n
                    if not n:
                        continue
                    raw.append(docs.with_columns(file=pl.lit(part.file, pl.UInt32)).select(*_SHARD_SCHEMA))
                    held += raw_bytes
                    if 2 * held >= chunk_bytes:
                        clean_batch()
                words.setdefault(part.file, DistinctWords()).add(record.words)
                bar.update(part.size)
                continue
            path = Path(part.path)
            reported = [0]  # of the part's bytes, told to the progress bar as a large file streams
            chunks: list[tuple[int, int]] | None = []  # what the piece record keeps (None: not kept)
            cleaned: list[pl.DataFrame] = []
            part_words = DistinctWords()

            def read(n: int, reported: list[int] = reported) -> None:
                reported[0] += n
                bar.update(n)

            try:
                for docs in _range_chunks(part, options, chunk_bytes, read):
                    texts[part.file] += len(docs)
                    raw_bytes = int(docs.str.len_bytes().sum()) if len(docs) else 0
                    if pieces is not None:
                        chunks.append((len(docs), raw_bytes))
                    if not len(docs):
                        if pieces is not None:
                            cleaned.append(pl.DataFrame(schema=_PIECE_SCHEMA))
                        continue
                    frame = pl.DataFrame({"file": part.file, "source": path.name, "text": docs,
                                          "file_split": file_split(path)},
                                         schema={"file": pl.UInt32, "source": pl.String, "text": pl.String,
                                                 "file_split": pl.String})
                    if pieces is not None:
                        frame = _clean(frame, options)
                        found = words_of(frame["text"])[1]
                        words.setdefault(part.file, DistinctWords()).add(found)
                        part_words.add(found)
                        cleaned.append(frame.drop("file"))
                    raw.append(frame)
                    held += raw_bytes
                    if 2 * held >= chunk_bytes:  # the text of a chunk of raw bytes (lines, JSON) is less
                        clean_batch()
            except InputError as exc:  # the file's documents read before it stay: the merge leaves them out
                errors[part.file] = (int(isinstance(exc, _ParseError)), part.start, str(exc))
                chunks = None  # a piece with an error is read again: its error is reported again
                if options.bad_files != "skip":
                    break
            if pieces is not None and chunks is not None:
                pieces.put(part, PieceRecord(chunks, cleaned, part_words.unique()))
            bar.update(part.size - reported[0])
    if raw:
        clean_batch()
    distinct = pl.concat([pl.DataFrame({"file": file, "word": pl.from_arrow(found.unique())}, schema=_WORDS_SCHEMA)
                          for file, found in sorted(words.items())]) if words else pl.DataFrame(schema=_WORDS_SCHEMA)
    if len(batches) > 1 and spill is not None:
        return ShardResult(tuple(batches), texts, errors, distinct)
    documents = pl.concat(batches) if batches else pl.DataFrame(schema=_SHARD_SCHEMA)
    return ShardResult(documents, texts, errors, distinct)


def _clean(raw: pl.DataFrame, options: IngestOptions) -> pl.DataFrame:
    """Raw documents (file, source, text, file_split) -> cleaned, non-empty, with id and split."""
    return pl.concat(in_threads(lambda part: _clean_rows(part, options), raw))


def _clean_rows(raw: pl.DataFrame, options: IngestOptions) -> pl.DataFrame:
    docs = raw.with_columns(
        text=clean_series(raw["text"], lowercase=options.lowercase, sentences=options.split_sentences)
    ).filter(pl.col("text").str.len_bytes() > 0)
    # SHA-1 over bytes, not str (no decoding and encoding back), taken out a slice at a time (less fresh memory)
    texts, step, sha1 = docs["text"].cast(pl.Binary), 1 << 14, hashlib.sha1
    ids = [sha1(t).hexdigest()[:16] for i in range(0, len(texts), step) for t in texts.slice(i, step).to_list()]
    docs = docs.with_columns(doc_id=pl.Series(ids, dtype=pl.String))
    docs = docs.with_columns(split=pl.coalesce("file_split", _split_from_id(pl.col("doc_id"), options)),
                             **per_document())
    return docs.select(*_SHARD_SCHEMA)


def merge_shards(files: list[Path], results: Iterable[ShardResult], options: IngestOptions,
                 write: Callable[[pl.DataFrame, Any], None] | None = None) -> Corpus:
    """The corpus from its shards' results, in shard (= file, offset) order: a file with an error
    in any range fails the ingestion or, with `bad_files="skip"`, is left out whole; duplicates
    are removed keeping the first.

    Streamed: `results` may be a generator yielding shards in order as they finish, merged while later
    shards are still being read: at once with `bad_files="fail"` while its files have no error so far (a
    large file's byte ranges merge one by one), else once its files are complete (the next shard starts
    at a later file: a file's byte ranges are consecutive shards), as skipping a file needs all of it.
    `write(docs, encoded, texts)`: hand the kept documents to it table by table instead of returning them (the
    Corpus then has `documents=None`), with the table's `encoded` rows when they are exactly the kept ones (no
    duplicate of an earlier table, no bad file), else None; `texts`, the table's encoded rows in any case (or
    None), where the kept documents of a table without `text` find theirs by `doc_id` (a text's id is its hash).
    With results whose documents are LazyFrames (part files), the merge then holds one shard's documents at a
    time, plus the id of every document kept (for the duplicates) and the distinct words (for the stats)."""
    texts: dict[int, int] = {}
    errors: dict[int, tuple[int, int, str]] = {}
    counts, kept, seen = CorpusCounts(), [], _SeenIds()
    in_kept_files = 0  # documents of the files kept, duplicates included

    def merge(result: ShardResult) -> None:
        nonlocal in_kept_files
        bad = sorted(file for file in result.texts if file in errors)
        for file in bad:
            if options.bad_files != "skip":
                raise InputError(errors[file][2])
        # a dropped duplicate's words are its kept first copy's: the kept files' distinct words are the corpus's
        counts.add_words(result.words.lazy().filter(~pl.col("file").is_in(bad)).collect()["word"].to_arrow())
        tables = result.documents if isinstance(result.documents, tuple) else (result.documents,)
        encoded = result.encoded if isinstance(result.encoded, tuple) else (result.encoded,) * len(tables)
        for frame, segment in zip(tables, encoded, strict=True):
            docs = frame.lazy().filter(~pl.col("file").is_in(bad)).collect() if bad else frame.lazy().collect()
            in_kept_files += docs.height
            if options.dedupe:  # the first of each text among the files kept
                first = seen.first_copies(docs["doc_id"])
                if not first.all():
                    docs = docs.filter(pl.Series(first, dtype=pl.Boolean))
            counts.add(docs)
            docs = docs.select(column for column in DOCUMENT_COLUMNS if column in docs.columns)
            if write is None:
                kept.append(docs)
            else:  # without a bad file the kept rows are among the shard's first copies: the same when as many
                exact = not bad and segment is not None and segment.rows == docs.height
                write(docs, segment if exact else None, segment)

    waiting: list[ShardResult] = []  # shards whose last file may go on in the next shard
    for result in results:
        for file, n in result.texts.items():
            texts[file] = texts.get(file, 0) + n
        for file, error in result.errors.items():
            errors[file] = min(errors.get(file, error), error)  # decode before parse errors, then the earliest
        while waiting and result.texts and max(waiting[0].texts, default=-1) < min(result.texts):
            merge(waiting.pop(0))
        waiting.append(result)
        while waiting and options.bad_files != "skip" and not any(file in errors for file in waiting[0].texts):
            merge(waiting.pop(0))  # needs no later range: an error there fails the whole ingestion anyway
    for result in waiting:
        merge(result)

    skipped = [{"source": str(path), "reason": errors[i][2]} if i in errors
               else {"source": str(path), "reason": "no documents (empty file)"}
               for i, path in enumerate(files) if i in errors or not texts.get(i)]
    if not any(texts.get(i) for i in range(len(files)) if i not in errors):
        reasons = "; ".join(s["reason"] for s in skipped if "empty file" not in s["reason"])
        raise InputError(f"no documents found in {', '.join(map(shown, files))}: the corpus would be empty"
                         + (f" (skipped: {reasons})" if reasons else ""))
    if counts.documents == 0:
        raise InputError(f"no non-empty documents in {', '.join(map(shown, files))}: the corpus would be empty")
    stats = counts.stats(files, in_kept_files - counts.documents, skipped)
    return Corpus(None if write is not None else pl.concat(kept), stats)


class _SeenIds:
    """The ids of the documents kept so far, as a sorted uint64 array (8 bytes a document: a document id
    is 16 hex digits, `_clean_rows`): which of a batch's documents are the first copy of their text."""

    def __init__(self) -> None:
        self.sorted = np.empty(0, dtype=np.uint64)

    def first_copies(self, doc_ids: pl.Series) -> np.ndarray:
        codes = _codes(doc_ids)
        first = first_in_table(doc_ids, codes)
        at = np.minimum(np.searchsorted(self.sorted, codes), max(len(self.sorted) - 1, 0))
        if len(self.sorted):
            first &= self.sorted[at] != codes  # and not seen before
        new = np.sort(codes[first])
        self.sorted = np.insert(self.sorted, np.searchsorted(self.sorted, new), new)
        return first


def _codes(doc_ids: pl.Series) -> np.ndarray:
    return doc_ids.str.to_integer(base=16, dtype=pl.UInt64).to_numpy()


def first_in_table(doc_ids: pl.Series, codes: np.ndarray | None = None) -> np.ndarray:
    """Which of these documents are the first copy of their text in this table (what a shard can tell)."""
    codes = _codes(doc_ids) if codes is None else codes
    first = np.zeros(len(codes), dtype=bool)
    first[np.unique(codes, return_index=True)[1]] = True
    return first


def build_tagged(files: list[Path], options: IngestOptions, progress: Callable | None = None) -> pl.DataFrame:
    """Tagged sentences (sent_id, source, split, words, upos, xpos) of the CoNLL-U files, in order,
    case and duplicates kept (a tagger learns from every sentence as written)."""
    frames: list[pl.DataFrame] = []
    for path, _texts, tagged in iter_files(tagged_files(files), options, progress, []):
        frames.append(tagged.with_columns(source=pl.lit(path.name), file_split=pl.lit(file_split(path))))
    if not frames or not sum(f.height for f in frames):
        raise InputError("no CoNLL-U sentences among the sources: add a .conllu file to tag")
    sentence_hash = pl.col("sent_id").map_elements(lambda s: hashlib.sha1(s.encode()).hexdigest()[:16],
                                                   return_dtype=pl.String)
    return pl.concat(frames).with_columns(
        split=pl.coalesce("file_split", _split_from_id(sentence_hash, options))
    ).select("sent_id", "source", "split", "words", "upos", "xpos")
