"""Streaming reads: compressed text and JSONL, Parquet and MediaWiki XML are read in chunks of about the
shard size (issue 27), giving exactly the corpus the whole reading gives, with memory bounded by the
chunk, not the file; large Wikipedia multistream dumps are sharded by their bz2 streams (issue 28)."""

from __future__ import annotations

import bz2
import gzip
import json
import logging
import re
import tracemalloc
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from lexiflow.models.errors import InputError
from lexiflow.models.ingest import (
    IngestOptions,
    build_corpus,
    ingest_shard,
    merge_shards,
    plan_shards,
    read_file,
    resolve_sources,
    sharding,
)
from lexiflow.models.ingest.multistream import Streams
from lexiflow.models.ingest.readers import read_chunks
from lexiflow.storage import ArtifactStore
from lexiflow.tasks.corpus import ingest_corpus
from lexiflow.tasks.params import CorpusParams, ParallelParams

from tests.conftest import WIKITEXT_VALID
from tests.stages import publish
from tests.test_sharding import assert_same_artifacts

ENWIKI = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
WHOLE = 1 << 40  # a chunk size no file here reaches: the file in one chunk, as it was read before streaming


@pytest.fixture(scope="module")
def compressed(tmp_path_factory, shared_data) -> dict[str, Path]:
    """WikiText-2 valid (1.1 MB, real text) gzipped and bz2-compressed, and as JSON lines gzipped."""
    folder = tmp_path_factory.mktemp("compressed")
    data = WIKITEXT_VALID.read_bytes()
    files = {"gz": folder / "wiki.valid.tokens.gz", "bz2": folder / "wiki.valid.tokens.bz2",
             "jsonl": folder / "wiki.valid.jsonl.gz"}
    files["gz"].write_bytes(gzip.compress(data, compresslevel=6))
    files["bz2"].write_bytes(bz2.compress(data))
    lines = read_file(WIKITEXT_VALID, IngestOptions())[0]
    files["jsonl"].write_bytes(gzip.compress("".join(json.dumps({"text": t}) + "\n" for t in lines).encode()))
    return files


def chunk_sizes(path: Path, options: IngestOptions, chunk_bytes: int) -> list[int]:
    return [int(chunk.str.len_bytes().sum()) for chunk in read_chunks(path, options, chunk_bytes)]


@pytest.mark.parametrize("kind", ["gz", "bz2", "jsonl"])
def test_compressed_text_streams_in_chunks_of_whole_lines_giving_the_whole_readings_corpus(compressed, kind):
    path, options = compressed[kind], IngestOptions()
    longest = max(map(len, WIKITEXT_VALID.read_bytes().split(b"\n")))
    sizes = chunk_sizes(path, options, 64 << 10)
    assert len(sizes) > 10 and max(sizes) <= (64 << 10) + longest  # a chunk passes the size by a line at most
    read: list[int] = []  # the progress bar is told the compressed bytes read, block by block
    chunks = pl.concat(list(read_chunks(path, options, 64 << 10, read.append)))
    assert len(read) > 5 and sum(read) == path.stat().st_size
    plain = read_file(WIKITEXT_VALID, options)[0]  # the uncompressed file, read whole: an independent reference
    assert chunks.to_list() == plain
    streamed = build_corpus([path], options, chunk_bytes=64 << 10)
    whole = build_corpus([path], options, chunk_bytes=WHOLE)
    assert streamed.documents.equals(whole.documents) and streamed.stats == whole.stats
    reference = build_corpus([WIKITEXT_VALID], options).documents
    assert streamed.documents.drop("source").equals(reference.drop("source"))  # same texts, ids, splits, order


def test_errors_in_a_later_chunk_are_the_whole_readings(tmp_path):
    """Line numbers count the chunks before; a read error (truncation) comes before a decoding error,
    which comes before a JSON error, even when the JSON error is in an earlier chunk."""
    text = b"".join(b"line %d of text\n" % i for i in range(5000))
    cases = {
        "late.txt.gz": gzip.compress(text + b"bad \xc3\x28 byte\n" + text),
        "order.jsonl.gz": gzip.compress(b'{"text": "a"}\n{oops\n' + b'{"text": "b"}\n' * 9000 + b'{"text": "\xff"}\n'),
        "json.jsonl.bz2": bz2.compress(b'{"text": "a"}\n' * 9000 + b'{"text": 3}\n'),
        "truncated.txt.gz": gzip.compress(b"bad \xff\n" + text * 20)[:-300],
    }
    expected = {"late.txt.gz": f":5001: invalid UTF-8 (byte {len(text) + 4})", "order.jsonl.gz": ":9003: invalid UTF-8",
                "json.jsonl.bz2": ":9001: no string field 'text'", "truncated.txt.gz": ": cannot read"}
    for name, content in cases.items():
        path = tmp_path / name
        path.write_bytes(content)
        messages = []
        for chunk_bytes in (4096, WHOLE):
            with pytest.raises(InputError) as info:
                build_corpus([path], IngestOptions(), chunk_bytes=chunk_bytes)
            messages.append(str(info.value))
        assert messages[0] == messages[1] and messages[0].startswith(f"{path}{expected[name]}"), messages


def test_memory_follows_the_chunk_not_the_file(tmp_path, monkeypatch):
    """Gzip text files of 6 and 12 MiB read in 256 KiB chunks by a spilling shard: no batch handed to
    cleaning holds more than a chunk (and a line), the Python-side peak (decompressed blocks, the chunk's
    bytes) does not grow with the file and is a fraction of it, and the spilled batches merge into
    the corpus the whole reading gives."""
    chunk = 1 << 18
    batches: list[int] = []
    clean = sharding._clean
    monkeypatch.setattr(sharding, "_clean", lambda raw, options: batches.append(
        int(raw["text"].str.len_bytes().sum())) or clean(raw, options))
    spilled: list[Path] = []

    def spill(docs: pl.DataFrame) -> pl.LazyFrame:
        spilled.append(tmp_path / f"part-{len(spilled)}.parquet")
        docs.write_parquet(spilled[-1])
        return pl.scan_parquet(spilled[-1])

    options, peaks, sizes = IngestOptions(split_sentences=False), [], []
    for n in (100_000, 200_000):
        lines = [f"Line {i}: the {i % 97} cats of house {i % 1013} sat on {i % 7} mats. Then they left."
                 for i in range(n)]
        path = tmp_path / f"big-{n}.txt.gz"
        path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode(), compresslevel=1))
        sizes.append(sum(map(len, lines)) + len(lines))
        batches.clear()
        spilled.clear()
        tracemalloc.start()
        result = ingest_shard([sharding.FileRange(str(path), 0)], options, chunk_bytes=chunk, spill=spill)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    assert sizes[1] > 48 * chunk and len(batches) >= 48 and max(batches) <= chunk + max(map(len, lines)) + 1
    # Flat in the file's size: doubling the file adds well under an eighth of the added bytes. Not a
    # ratio of the two peaks: tracemalloc also counts other threads' allocations (a full suite leaves
    # Prefect's log shipper and a closed cluster's loop running), ~0.3 MB on a CI run.
    assert peaks[1] < sizes[1] / 3 and peaks[1] - peaks[0] < (sizes[1] - sizes[0]) / 8, (peaks, sizes)
    assert isinstance(result.documents, tuple) and len(result.documents) == len(spilled) == len(batches)
    written: list[pl.DataFrame] = []
    corpus = merge_shards([path], [result], options, lambda docs, *_: written.append(docs))
    assert len(written) == len(batches)
    whole = build_corpus([path], options, chunk_bytes=WHOLE)
    assert pl.concat(written).equals(whole.documents)
    assert corpus.stats == whole.stats


def test_parquet_streams_by_record_batch_and_slices_dictionary_batches(tmp_path):
    texts = [f"Document number {i} about {'cats' if i % 3 else 'dogs'}." for i in range(20_000)]
    plain = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"text": texts}), plain, row_group_size=4000)
    categorical = tmp_path / "categorical.parquet"  # one 64 Ki-row batch whose few values repeat: sliced
    values = pa.DictionaryArray.from_arrays(pa.array([i % 3 for i in range(30_000)], pa.int32()),
                                            pa.array(["one " * 50, "two " * 30, "three"]))
    pq.write_table(pa.table({"text": values}), categorical)
    options = IngestOptions()
    for path, expected in ((plain, texts), (categorical, ["one " * 50, "two " * 30, "three"] * 10_000)):
        sizes = chunk_sizes(path, options, 16 << 10)
        assert len(sizes) > 10 and max(sizes) <= (16 << 10) + 200
        assert pl.concat(list(read_chunks(path, options, 16 << 10))).to_list() == expected == read_file(path,
                                                                                                       options)[0]
        assert build_corpus([path], options, chunk_bytes=16 << 10).documents.equals(
            build_corpus([path], options, chunk_bytes=WHOLE).documents)


def test_wiki_xml_streams_page_by_page():
    [dump] = resolve_sources(["builtin:enwiki"])
    options = IngestOptions()
    chunks = list(read_chunks(dump, options, 256 << 10))
    assert len(chunks) > 10
    assert pl.concat(chunks).to_list() == read_file(dump, options)[0]  # the same cleaning follows


def test_the_corpus_stage_streams_a_compressed_file_into_the_same_artifact(tmp_path, compressed):
    """One large compressed file is one shard: with a small shard size its batches spill to parts
    and the merge streams them; the artifact is the one read whole, row for row, with the same version (its
    row groups are the batches')."""
    params = CorpusParams(sources=[str(compressed["bz2"]), str(compressed["jsonl"])])
    refs = [publish(ArtifactStore(tmp_path / name), ingest_corpus, params=params, parallel=parallel)
            for name, parallel in (("whole", ParallelParams(runner="local")),
                                   ("streamed", ParallelParams(runner="local", shard_bytes=128 << 10)))]
    assert_same_artifacts({"corpus": refs[0]}, {"corpus": refs[1]}, same_shards=False)
    groups = [pq.ParquetFile(ArtifactStore(tmp_path / name).path("corpus", ref.version, "documents.parquet"))
              .num_row_groups for name, ref in zip(("whole", "streamed"), refs, strict=True)]
    assert groups[0] == 1 < groups[1]


# ---- Wikipedia multistream dumps ----------------------------------------------------------------
def write_multistream(xml: bytes, folder: Path, per_stream: int,
                      name: str = "enwiki-20240601-pages-articles-multistream.xml.bz2") -> tuple[Path, Path]:
    """A multistream dump of `xml` laid out as Wikipedia does (models/ingest/multistream.py): a bz2
    stream for the header (`<mediawiki>` and `<siteinfo>`), one per `per_stream` pages, one for the
    closing tag; the index beside it, one `offset:page_id:title` line per page."""
    head_end = xml.index(b"</siteinfo>\n") + len(b"</siteinfo>\n")
    pages = re.findall(rb"  <page>\n.*?</page>\n", xml[head_end:], re.S)
    tail = xml[head_end + sum(map(len, pages)):]
    assert xml[:head_end] + b"".join(pages) + tail == xml and tail.strip() == b"</mediawiki>"
    groups = [pages[i: i + per_stream] for i in range(0, len(pages), per_stream)]
    dump, index, offset = [bz2.compress(xml[:head_end])], [], 0
    for group in groups:
        offset += len(dump[-1])
        for page in group:
            page_id = re.search(rb"<id>(\d+)</id>", page)[1].decode()
            title = re.search(rb"<title>(.*?)</title>", page)[1].decode()
            index.append(f"{offset}:{page_id}:{title}\n")
        dump.append(bz2.compress(b"".join(group)))
    dump.append(bz2.compress(tail))
    path = folder / name
    path.write_bytes(b"".join(dump))
    index_path = folder / name.replace(".xml.bz2", "-index.txt.bz2")
    index_path.write_bytes(bz2.compress("".join(index).encode()))
    return path, index_path


@pytest.fixture(scope="module")
def multistream(tmp_path_factory):
    [single] = resolve_sources(["builtin:enwiki"])
    xml = bz2.decompress(single.read_bytes())
    dump, index = write_multistream(xml, tmp_path_factory.mktemp("multistream"), per_stream=10)
    assert bz2.decompress(dump.read_bytes()) == xml  # the streams, one after the other, are the dump
    return dump, index, single


def test_a_multistream_dump_is_sharded_by_its_streams_into_the_same_corpus(multistream):
    dump, index, single = multistream
    options = IngestOptions()
    assert resolve_sources([str(dump.parent)]) == [dump]  # the index beside it is not a source
    shards = plan_shards([dump], options, dump.stat().st_size // 5)
    assert 4 <= len(shards) <= 6 and all(isinstance(part, Streams) for shard in shards for part in shard)
    parts = [part for shard in shards for part in shard]
    assert parts[-1].stop == dump.stat().st_size and sum(p.pages for p in parts) == 206
    assert all(a.stop == b.start for a, b in zip(parts, parts[1:], strict=False))
    sharded = merge_shards([dump], [ingest_shard(shard, options, chunk_bytes=64 << 10) for shard in shards], options)
    whole = build_corpus([dump], options)
    assert sharded.documents.equals(whole.documents) and sharded.stats == whole.stats
    original = build_corpus([single], options).documents  # the single-stream dump gensim ships
    assert whole.documents.drop("source").equals(original.drop("source")) and whole.documents.height > 100


def test_a_single_stream_dump_is_one_shard_and_says_why(multistream, caplog):
    _dump, _index, single = multistream
    with caplog.at_level(logging.INFO, logger="lexiflow.ingest"):
        shards = plan_shards([single], IngestOptions(), 100_000)
    assert shards == [[sharding.FileRange(str(single), 0)]]
    assert f"{single}: {single.stat().st_size} bytes, read in one shard" in caplog.text
    assert "a compressed stream cannot be entered in the middle" in caplog.text


def test_a_damaged_or_mismatched_index_is_refused_naming_its_line(multistream, tmp_path):
    dump, index, _single = multistream
    lines = bz2.decompress(index.read_bytes()).decode().splitlines(keepends=True)
    copy = tmp_path / dump.name
    copy.write_bytes(dump.read_bytes())
    index_copy = tmp_path / index.name
    first = int(lines[0].split(":")[0])
    shifted = f"{first + 1}:{lines[10].split(':', 1)[1]}"  # the second stream's first page, one byte off
    wrong_count = [*lines[:10], f"{first}:{lines[10].split(':', 1)[1]}", *lines[11:]]  # 11 pages, then 9
    cases = {
        "not a line": ([*lines[:3], "garbage without colons\n", *lines[3:]], f"{index_copy}:4: expected "
                                                                             "offset:page_id:title"),
        "off by one": ([*lines[:10], shifted, *lines[11:]], f"{index_copy}:11: no bz2 stream starts at byte"),
        "backwards": ([*lines[:10], f"{first}:{lines[10].split(':', 1)[1]}", *lines[11:20], lines[9], *lines[20:]],
                      f"{index_copy}:21: offset {first} comes before"),
        "pages": (wrong_count, f"{copy}: the bz2 streams at bytes {first}-"),
    }
    for case, (content, message) in cases.items():
        index_copy.write_bytes(bz2.compress("".join(content).encode()))
        with pytest.raises(InputError) as info:
            shards = plan_shards([copy], IngestOptions(), 1)  # a shard per stream
            for shard in shards:
                result = ingest_shard(shard, IngestOptions())
                if result.errors:
                    raise InputError(result.errors[0][2])
        assert str(info.value).startswith(message) and "\n" not in str(info.value), (case, str(info.value))
    assert str(info.value).endswith(f"hold 10 pages, {index_copy}:1 on lists 11; the index does not belong to "
                                    "this dump (take both from the same dump)")
    index_copy.write_bytes(bz2.compress("".join(lines).encode())[:-20])  # truncated
    with pytest.raises(InputError, match=re.escape(f"{index_copy}: cannot read (")):
        plan_shards([copy], IngestOptions(), copy.stat().st_size // 5)
