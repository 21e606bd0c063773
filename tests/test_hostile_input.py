"""Hostile input at the ingestion layer: every kind of bad file gets one clear line naming the file
(and line), or a documented skip counted in the corpus stats; never another exception.
The same directory goes through the CLI in tests/test_reliability.py."""

from __future__ import annotations

import bz2
import codecs
import gzip
import subprocess
import sys
import tracemalloc

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from lexiflow.models.errors import InputError
from lexiflow.models.ingest import IngestOptions, build_corpus, build_tagged, read_file, resolve_sources

from benchmarks.hostile import BOMB_LIMIT, dictionary_bomb, hostile_directory


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hostile")
    return folder, hostile_directory(folder)


def test_at_least_ten_kinds(hostile):
    _folder, expected = hostile
    assert len(expected) >= 10


def test_each_bad_file_alone_fails_with_one_line_naming_it(hostile):
    folder, expected = hostile
    options = IngestOptions(max_file_bytes=BOMB_LIMIT)
    for name, message in expected.items():
        if name == "empty.txt":
            assert read_file(folder / name, options)[0] == []  # empty: nothing to read, skipped by the corpus
            continue
        with pytest.raises(InputError) as info:
            build_corpus([folder / name], options)
        text = str(info.value)
        assert message in text and "\n" not in text and len(text) < 400, (name, text)


def test_skip_policy_leaves_out_and_counts_every_bad_file(hostile, tmp_path):
    folder, expected = hostile
    good = tmp_path / "good.txt"
    good.write_text("A good line.\nAnother good line.\n")
    files = resolve_sources([str(folder), str(good)])
    corpus = build_corpus(files, IngestOptions(max_file_bytes=BOMB_LIMIT, bad_files="skip", lowercase=False))
    assert corpus.documents["text"].to_list() == ["A good line.", "Another good line."]
    assert corpus.stats["skipped_inputs"] == len(expected)
    reasons = {s["source"].rsplit("/", 1)[-1]: s["reason"] for s in corpus.stats["skipped"]}
    assert set(reasons) == set(expected)
    assert all(expected[name] in reason and "\n" not in reason for name, reason in reasons.items())


def test_skip_policy_with_nothing_left_fails_listing_the_reasons(hostile):
    folder, _expected = hostile
    with pytest.raises(InputError, match=r"the corpus would be empty \(skipped: .*binary.txt: looks like a binary"):
        build_corpus(resolve_sources([str(folder)]), IngestOptions(max_file_bytes=BOMB_LIMIT, bad_files="skip"))


def test_tagged_corpus_skips_bad_conllu_files(hostile, tmp_path):
    folder, _expected = hostile
    good = tmp_path / "good.conllu"
    good.write_text("1\tA\t_\tDET\tDT\t_\t0\troot\t_\t_\n")
    files = [folder / "columns.conllu", folder / "ids.conllu", good]
    with pytest.raises(InputError, match="columns.conllu:2"):
        build_tagged(files, IngestOptions())
    tagged = build_tagged(files, IngestOptions(bad_files="skip"))
    assert tagged["words"].to_list() == [["A"]]


def test_utf16_and_utf32_with_bom_are_decoded_and_a_lone_bom_is_an_empty_file(tmp_path):
    for encoding, bom in (("utf-16-le", codecs.BOM_UTF16_LE), ("utf-16-be", codecs.BOM_UTF16_BE),
                          ("utf-32-le", codecs.BOM_UTF32_LE)):
        path = tmp_path / f"{encoding}.txt"
        path.write_bytes(bom + "Caf\u00e9 au lait.\nSecond line.\n".encode(encoding))
        assert read_file(path, IngestOptions())[0] == ["Caf\u00e9 au lait.", "Second line."]
    bom_only = tmp_path / "bom.txt"
    bom_only.write_bytes(codecs.BOM_UTF8)
    assert read_file(bom_only, IngestOptions())[0] == []


def test_wiki_pages_with_missing_parts_are_skipped_not_crashed_on(tmp_path):
    dump = tmp_path / "odd.xml"
    dump.write_text(
        '<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/">'
        "<page><title>No revision</title><ns>0</ns></page>"
        "<page><title>No text</title><revision><id>1</id></revision></page>"
        "<page><title>Talk</title><ns>1</ns><revision><text>talk page</text></revision></page>"
        "<page><title>R</title><ns>0</ns><redirect title='X'/><revision><text>#REDIRECT [[X]]</text></revision></page>"
        "<page><title>Kept</title><revision><text>'''Bold''' [[link|shown]] text.</text></revision></page>"
        "</mediawiki>")
    assert read_file(dump, IngestOptions())[0] == ["Bold shown text."]


def test_line_based_formats_split_at_newline_only(tmp_path):
    """U+2028 and U+0085 are legal inside JSON strings and CoNLL-U words; they must not cut lines."""
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text('{"text": "one\u2028two\u0085three"}\r\n', encoding="utf-8")
    assert read_file(jsonl, IngestOptions())[0] == ["one\u2028two\u0085three"]
    conllu = tmp_path / "s.conllu"
    conllu.write_text("1\tx\u2028y\t_\tX\t_\t_\t0\troot\t_\t_\n", encoding="utf-8")
    assert read_file(conllu, IngestOptions())[1]["words"].to_list() == [["x\u2028y"]]


@pytest.mark.slow
def test_a_single_20_mb_line_is_one_document_with_bounded_memory(tmp_path):
    """No line-length limit anywhere: a 20 MB line (the benchmark runs 200 MB) becomes one document,
    with peak Python-side memory a small multiple of the line."""
    line = ("word " * 4_000_000).encode()  # 20 MB, no sentence break
    path = tmp_path / "long.txt"
    path.write_bytes(line + b"\n")
    tracemalloc.start()
    corpus = build_corpus([path], IngestOptions())
    _current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert corpus.stats["documents"] == 1 and corpus.stats["tokens"] == 4_000_000
    assert corpus.documents["text"].str.len_bytes().to_list() == [len(line) - 1]
    assert peak < 8 * len(line), peak  # bytes read + decoded text + list of lines (polars memory is not traced)


def test_parquet_text_column_must_hold_text(tmp_path):
    path = tmp_path / "t.parquet"
    pl.DataFrame({"text": ["a", None, "b"]}).write_parquet(path)
    assert read_file(path, IngestOptions())[0] == ["a", "b"]  # nulls are not documents
    pl.DataFrame({"text": [[1], [2]]}).write_parquet(path)
    with pytest.raises(InputError, match=r"t.parquet: column 'text' holds large_list<element: int64>, not text"):
        read_file(path, IngestOptions())


def test_a_plain_file_over_the_limit_is_refused_by_its_size_before_it_is_read(tmp_path):
    path = tmp_path / "huge.txt"
    with path.open("wb") as f:
        f.truncate((64 << 20) + 1)  # sparse: 64 MiB of NULs, on no disk
    tracemalloc.start()
    with pytest.raises(InputError) as info:
        read_file(path, IngestOptions(max_file_bytes=64 << 20))
    _current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert str(info.value) == (f"{path}: {(64 << 20) + 1} bytes, more than corpus.max_file_bytes ({64 << 20}); "
                               "raise it if intended, or split the file")  # not "once decompressed": it is not
    assert peak < 1 << 20, peak  # nothing of it was read


@pytest.mark.parametrize("compress", [gzip.compress, bz2.compress])
def test_a_decompression_bomb_is_refused_while_it_streams_under_the_default_limit(tmp_path, compress):
    """4 GiB decompressed are allowed by default; a bomb stops at a few tens of MB, not there."""
    path = tmp_path / f"bomb.txt.{'gz' if compress is gzip.compress else 'bz2'}"
    path.write_bytes(compress(b"\0" * (48 << 20)))
    tracemalloc.start()
    with pytest.raises(InputError, match=r"bomb.txt.(gz|bz2): decompresses to more than 100 times its size"):
        read_file(path, IngestOptions())
    _current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 80 << 20, peak


def test_compressed_text_within_the_limits_is_read(tmp_path):
    text = "".join(f"Line {i} of ordinary text, compressed the usual three to five times.\n" for i in range(400_000))
    path = tmp_path / "ok.txt.gz"
    path.write_bytes(gzip.compress(text.encode()))  # ~28 MB: past the ratio check's floor
    docs = read_file(path, IngestOptions())[0]
    assert len(docs) == 400_000 and docs[-1] == text.splitlines()[-1]


BOMB_CHILD = """
import sys
from pathlib import Path
from lexiflow.models.errors import InputError
from lexiflow.models.ingest import IngestOptions, build_corpus
try:
    build_corpus([Path(sys.argv[1])], IngestOptions())
    print("read", end=" ")
except InputError as exc:
    print(str(exc).split(": ", 1)[1][:60], end=" ")
print(next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM")))  # peak KiB
"""


def test_a_tiny_parquet_file_whose_dictionary_expands_to_100_gb_is_refused_in_bounded_memory(tmp_path):
    """One 1 MiB value repeated 100,000 times: ~700 bytes on disk, 100 GB of text decoded (the process
    aborted before). Under the default 4 GiB limit it is refused from the dictionary's value lengths."""
    path = tmp_path / "bomb.parquet"
    assert dictionary_bomb(path, value_bytes=1 << 20, rows=100_000) < 2000
    out = subprocess.run([sys.executable, "-c", BOMB_CHILD, str(path)], capture_output=True, text=True, check=True)
    message, peak_kib = out.stdout.rsplit(" ", 1)
    assert message.startswith("column 'text' expands to more than corpus.max_file_bytes"), out.stdout
    assert int(peak_kib) < 400 << 10, peak_kib  # < 400 MiB resident, interpreter and libraries included


def test_dictionary_encoded_text_columns_are_text(tmp_path):
    """What pandas writes for a categorical column: an Arrow dictionary of strings."""
    path = tmp_path / "categorical.parquet"
    values = pa.DictionaryArray.from_arrays(pa.array([0, 1, None, 0], pa.int8()), pa.array(["First doc.", "Second."]))
    pq.write_table(pa.table({"text": values, "n": [1, 2, 3, 4]}), path)
    assert pq.read_schema(path).field("text").type == pa.dictionary(pa.int8(), pa.string())
    assert read_file(path, IngestOptions())[0] == ["First doc.", "Second.", "First doc."]


def test_recursive_globs_terminate_over_links_to_parent_folders(tmp_path):
    (tmp_path / "docs" / "sub").mkdir(parents=True)
    (tmp_path / "docs" / "a.txt").write_text("a")
    (tmp_path / "docs" / "sub" / "b.txt").write_text("b")
    (tmp_path / "docs" / ".hidden.txt").write_text("h")
    (tmp_path / "docs" / "self").symlink_to(tmp_path / "docs")  # two links to itself: 2^depth paths
    (tmp_path / "docs" / "sub" / "up").symlink_to(tmp_path / "docs")
    expected = [tmp_path / "docs" / "a.txt", tmp_path / "docs" / "sub" / "b.txt"]
    assert resolve_sources([str(tmp_path / "docs" / "**" / "*.txt")]) == expected
    assert resolve_sources([str(tmp_path / "docs")]) == expected  # the folder path, the same files
    assert resolve_sources([str(tmp_path / "docs" / "*.txt")]) == expected[:1]


def test_names_with_newlines_or_escape_codes_are_quoted_in_one_line_messages(tmp_path):
    with pytest.raises(InputError) as info:
        resolve_sources([str(tmp_path / "no\nsuch\x1b.txt")])
    assert str(info.value) == f"{str(tmp_path / 'no')!r}"[:-1] + "\\nsuch\\x1b.txt': no such file or directory; " \
        "check the path in corpus.sources"
    path = tmp_path / "bad\nname.txt"
    path.write_bytes(b"ok\n\xff\n")
    with pytest.raises(InputError) as info:
        build_corpus([path], IngestOptions())
    assert str(info.value).startswith(f"{str(path)!r}:2: invalid UTF-8") and str(info.value).isprintable()
