"""Wikipedia multistream dumps, read in parallel: shards of whole bz2 streams found by the dump's index.

Layout (what Wikipedia publishes as `*-pages-articles-multistream.xml.bz2`, and what the tests build):
the dump is a concatenation of independent bz2 streams. The first holds the XML header: the opening
`<mediawiki ...>` tag and the `<siteinfo>` element. Each following stream holds up to 100 whole
`<page>` elements. The last holds the closing `</mediawiki>`. Decompressed one after the other (as
`bz2` does for a multi-stream file) they are the ordinary dump. The index, `<dump name without
.xml.bz2>-index.txt.bz2` beside it (`...-multistream-index1.txt-p1p41242.bz2` for the numbered
parts), is a bz2 text file of one line per page, `offset:page_id:title`, where `offset` is the byte
at which the page's stream starts in the dump (the header and closing streams are not listed).

A shard is a range of consecutive page streams, about `shard_bytes` of the compressed dump: it opens
the dump, decompresses the header stream and then only its own streams (seeking to the first), and
parses their pages inside the header's root element. The shards' pages, in shard order, are the
dump's pages in order, so the corpus is the same as the whole reading's. Each shard checks that its
streams hold as many pages as the index lists for them.
"""

from __future__ import annotations

import bz2
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain
from pathlib import Path

import numpy as np
import polars as pl
from lexiflow.models.errors import InputError, shown
from lexiflow.models.ingest.readers import XML_FEED, check_expansion, one_line, open_source, wiki_chunks, wiki_pages
from lexiflow.models.ingest.sources import multistream_index

log = logging.getLogger("lexiflow.ingest")
STREAM_MAGIC = b"1AY&SY"  # a bz2 stream is `BZh` + block size digit, then a block (magic 0x314159265359)


@dataclass(frozen=True)
class Streams:
    """Consecutive page streams of a dump: bytes [start, stop) of `path` (file number `file` of the
    sources), after the header stream of `header` bytes; `pages` pages, listed by `index` from line `line`."""

    path: str
    file: int
    start: int
    stop: int
    header: int
    pages: int
    index: str
    line: int

    @property
    def size(self) -> int:
        return self.stop - self.start


def plan_streams(path: Path, file: int, shard_bytes: int) -> list[Streams] | None:
    """Ranges of whole page streams of about `shard_bytes` compressed bytes each, from the index beside
    the dump; None when there is no index (the dump is read whole, one shard)."""
    index = multistream_index(path)
    if index is None or not index.is_file():
        return None
    size = path.stat().st_size
    streams = read_index(path, index, size)  # (offset, pages, first line) per page stream
    ranges: list[Streams] = []
    first = 0
    for i in range(1, len(streams) + 1):
        stop = streams[i][0] if i < len(streams) else size  # the last range takes the closing stream
        if stop - streams[first][0] >= shard_bytes or i == len(streams):
            ranges.append(Streams(str(path), file, streams[first][0], stop, streams[0][0],
                                  sum(pages for _, pages, _ in streams[first:i]), str(index), streams[first][2]))
            first = i
    return ranges


def read_index(dump: Path, index: Path, size: int) -> list[tuple[int, int, int]]:
    """(offset, pages, first line) of each page stream the index lists, checked against the dump: lines
    of the form `offset:page_id:title`, offsets in order, each the start of a bz2 stream of the dump
    after its header stream. A bad line is refused with its line number. The lines are checked a
    decompressed block at a time by a regular expression and numpy (English Wikipedia's index has
    ~24 M lines: a Python loop over them takes minutes)."""

    def bad(line_no: int, what: str) -> InputError:
        return InputError(f"{shown(index)}:{line_no}: {what}; take the dump and its index from the same dump "
                          "(or remove the index to read the dump in one shard)")

    offsets, lines = [], 0
    for block in _index_blocks(index):
        found = _INDEX_LINE.findall(block)
        if len(found) != block.count(b"\n"):
            line_no, line = next((i, line) for i, line in enumerate(block.split(b"\n"), start=lines + 1)
                                 if not _INDEX_LINE.fullmatch(line + b"\n"))
            raise bad(line_no, f"expected offset:page_id:title, not {one_line(line.decode(errors='replace'))!r}")
        offsets.append(np.array(found, dtype=np.bytes_).astype(np.int64))
        lines += len(found)
    if not lines:
        raise InputError(f"{shown(index)}: lists no page; take the dump and its index from the same dump")
    every = np.concatenate(offsets)
    if (back := np.flatnonzero(np.diff(every) < 0)).size:
        raise bad(int(back[0]) + 2, f"offset {every[back[0] + 1]} comes before the previous one ({every[back[0]]})")
    if (outside := np.flatnonzero((every <= 0) | (every >= size))).size:
        raise bad(int(outside[0]) + 1, f"offset {every[outside[0]]} is not inside the page streams of {shown(dump)} "
                                       f"({size} bytes)")
    starts, first_rows, pages = np.unique(every, return_index=True, return_counts=True)
    with open_source(dump) as data:
        if data.read(3) != b"BZh":
            raise InputError(f"{shown(dump)}: not a bz2 file; a multistream dump starts with its header stream")
        for at, row in zip(starts.tolist(), first_rows.tolist(), strict=True):
            data.seek(at)
            head = data.read(10)
            if not (head[:3] == b"BZh" and head[3:4] in b"123456789" and head[4:] == STREAM_MAGIC):
                raise bad(row + 1, f"no bz2 stream starts at byte {at} of {shown(dump)}")
    return list(zip(starts.tolist(), pages.tolist(), (first_rows + 1).tolist(), strict=True))


_INDEX_LINE = re.compile(rb"^(\d+):\d+:[^\n]*\n", re.M)


def _index_blocks(index: Path) -> Iterator[bytes]:
    """The index decompressed, in blocks of whole lines (a last line without a newline gets one)."""
    with open_source(index) as raw:
        try:
            with bz2.BZ2File(raw) as f:
                rest = b""
                while block := f.read(16 << 20):
                    block = rest + block
                    cut = block.rfind(b"\n") + 1
                    rest = block[cut:]
                    yield block[:cut]
                if rest:
                    yield rest + b"\n"
        except (OSError, EOFError, ValueError) as exc:
            raise InputError(f"{shown(index)}: cannot read ({one_line(exc)}); the index is damaged or not bz2 "
                             "data, download it again") from None


def streams_chunks(part: Streams, limit: int, chunk_bytes: int | None) -> Iterator[pl.Series]:
    """The articles of a range of page streams, in chunks of about `chunk_bytes` characters: the header
    stream, then the range's streams, then the root's end tag (unless the range holds the closing
    stream), parsed as one dump."""
    path = Path(part.path)
    size = path.stat().st_size
    blocks = chain(_decompressed(path, 0, part.header, limit), _decompressed(path, part.start, part.stop, limit),
                   [b"</mediawiki>\n"] if part.stop < size else [])

    def where(line: int) -> str:
        return f"{shown(path)} (bz2 streams at bytes {part.start}-{part.stop}, XML line {line} after the header)"

    def counted(pages: Iterator[str | None]) -> Iterator[str | None]:
        n = 0
        for page in pages:
            n += 1
            yield page
        if n != part.pages:
            raise InputError(f"{shown(path)}: the bz2 streams at bytes {part.start}-{part.stop} hold {n} pages, "
                             f"{shown(part.index)}:{part.line} on lists {part.pages}; the index does not belong to "
                             "this dump (take both from the same dump)")

    return wiki_chunks(counted(wiki_pages(path, blocks, where)), chunk_bytes)


def _decompressed(path: Path, start: int, stop: int, limit: int) -> Iterator[bytes]:
    """Bytes [start, stop) of a bz2 file, whole streams, decompressed in blocks (limits as for a file)."""
    with open_source(path) as raw:
        raw.seek(start)
        left, total = stop - start, 0
        stream, data = bz2.BZ2Decompressor(), b""
        try:
            while True:
                if stream.eof:
                    data, stream = stream.unused_data, bz2.BZ2Decompressor()
                    if not data and not left:
                        return
                if stream.needs_input and not data:
                    if not left:
                        raise EOFError("the range ends inside a bz2 stream")
                    data = raw.read(min(XML_FEED, left))
                    if not data:
                        raise EOFError("the file ended")
                    left -= len(data)
                out, data = stream.decompress(data, max_length=16 << 20), b""
                if out:
                    total += len(out)
                    check_expansion(path, total, stop - start - left, limit)
                    yield out
        except (OSError, EOFError, ValueError) as exc:
            raise InputError(f"{shown(path)}: cannot read the bz2 streams at bytes {start}-{stop} ({one_line(exc)}); "
                             "the dump is damaged, or its index does not belong to it") from None


def one_shard_why(path: Path, size: int, shard_bytes: int) -> None:
    """Log why a compressed file larger than a shard is one shard (its chunks then run one after another)."""
    index = multistream_index(path)
    if index is not None:
        why = f"no multistream index {shown(index.name)} beside it"
    else:
        why = "a compressed stream cannot be entered in the middle"
    log.info("%s: %d bytes, read in one shard (%s); its chunks of %d bytes run one after another", shown(path),
             size, why, shard_bytes)
