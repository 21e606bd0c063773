import bz2
import gzip
import json
from pathlib import Path

import polars as pl
import pyarrow.compute as pc
import pytest
from lexiflow.models.errors import InputError, ParameterError
from lexiflow.models.ingest import (
    CorpusCounts,
    IngestOptions,
    build_corpus,
    build_tagged,
    fingerprint,
    read_file,
    resolve_sources,
)
from lexiflow.models.ingest.readers import line_documents
from lexiflow.models.ingest.sources import file_split
from lexiflow.models.ingest.stats import DistinctWords, per_document, words_of

OPTS = IngestOptions()


def corpus_of(paths, **options):
    return build_corpus(resolve_sources([str(p) for p in paths]), IngestOptions(**options))


def test_plain_text_lines_are_cleaned_split_and_deduplicated(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("Hello World. Second  sentence here.\n\nCafe\u0301 au lait!\nHello World. Second sentence here.\n")
    c = corpus_of([f])
    assert c.documents["text"].to_list() == ["hello world.\nsecond sentence here.", "caf\u00e9 au lait!"]
    assert c.stats["duplicates_removed"] == 1 and c.stats["sentences"] == 3 and c.stats["documents"] == 2
    assert c.stats["tokens"] == 8  # whitespace-separated words of the cleaned text
    assert c.documents["doc_id"].str.len_chars().to_list() == [16, 16]


def test_every_format_and_compression(tmp_path, shared_data):
    (tmp_path / "t.txt.gz").write_bytes(gzip.compress(b"gz line one\n"))
    (tmp_path / "t2.txt.bz2").write_bytes(bz2.compress(b"bz line two\n"))
    (tmp_path / "d.jsonl").write_text(json.dumps({"text": "json doc", "id": 1}) + "\n\n")
    pl.DataFrame({"text": ["parquet doc"], "n": [1]}).write_parquet(tmp_path / "p.parquet")
    (tmp_path / "s.conllu").write_text("1\tTagged\t_\tVERB\tVB\t_\t0\troot\t_\t_\n"
                                       "2\tword\t_\tNOUN\tNN\t_\t1\tobj\t_\t_\n")
    c = corpus_of([tmp_path], lowercase=False)
    assert sorted(c.documents["text"].to_list()) == sorted(
        ["gz line one", "bz line two", "json doc", "parquet doc", "Tagged word"])
    tagged = build_tagged(resolve_sources([str(tmp_path)]), OPTS)
    assert tagged.row(0, named=True)["upos"] == ["VERB", "NOUN"] and tagged["words"][0].to_list() == ["Tagged", "word"]


def test_wikipedia_dump_markup_is_stripped():
    c = corpus_of(["builtin:enwiki"])
    text = " ".join(c.documents["text"].to_list())
    assert c.stats["documents"] > 100 and c.stats["tokens"] > 400_000
    assert "'''" not in text and "[[" not in text and "<mediawiki" not in text
    assert "anarchism is a political philosophy" in text


def test_split_follows_document_id_or_file_name(tmp_path, shared_data):
    f = tmp_path / "many.txt"
    f.write_text("\n".join(f"document number {i}" for i in range(2000)))
    c1, c2 = corpus_of([f]), corpus_of([f])
    assert c1.documents.equals(c2.documents)
    shares = c1.documents["split"].value_counts(normalize=True).sort("split")
    assert dict(shares.iter_rows()) == pytest.approx({"test": 0.05, "train": 0.9, "valid": 0.05}, abs=0.02)
    dev = build_tagged([shared_data / "ud-english-ewt" / "en_ewt-ud-dev.conllu"], OPTS)
    assert set(dev["split"]) == {"valid"} and dev.height == 2001


@pytest.mark.parametrize("name, split", [
    ("train.txt", "train"), ("test.jsonl", "test"), ("dev.conllu", "valid"), ("Valid.txt.gz", "valid"),
    ("en_ewt-ud-train.conllu", "train"), ("en_ewt-ud-dev.conllu", "valid"), ("wiki.test.tokens", "test"),
    ("ptb.valid.txt", "valid"), ("train-00000-of-00002.parquet", "train"),
    ("validation-00000-of-00001.parquet", "valid"), ("test", "test"),
    ("my_test_notes.txt", None), ("latest.txt", None), ("contest.txt", None), ("devices.jsonl", None),
    ("notes.txt", None),
])
def test_split_words_that_start_or_end_a_part_of_the_file_name_give_its_split(name, split):
    assert file_split(Path(name)) == split


def test_held_out_files_keep_their_split(tmp_path):
    """Test text never leaks into training through the hashed split, and a name that merely mentions
    a split word is not held out whole."""
    for name in ("train.txt", "test.txt", "my_test_notes.txt"):
        (tmp_path / name).write_text("\n".join(f"{name} document {i}" for i in range(400)))
    docs = corpus_of([tmp_path]).documents
    splits = {name: set(group["split"]) for (name,), group in docs.group_by("source")}
    assert splits == {"train.txt": {"train"}, "test.txt": {"test"}, "my_test_notes.txt": {"train", "valid", "test"}}


def test_fingerprint_follows_content_not_name(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("same"), b.write_text("same")
    assert fingerprint([a])[0]["sha256"] == fingerprint([b])[0]["sha256"]
    b.write_text("other")
    assert fingerprint([a])[0]["sha256"] != fingerprint([b])[0]["sha256"]


@pytest.mark.parametrize("name, content, message", [
    ("missing.txt", None, r"missing.txt: no such file or directory"),
    ("bin.txt", b"\x00\x01\x02binary", r"bin.txt: looks like a binary"),
    ("bad.txt", b"ok line\nsecond \xff\xfe line\n", r"bad.txt:2: invalid UTF-8"),
    ("bad.conllu", b"# c\n1\tA\t_\tX\n", r"bad.conllu:2: expected 10 tab-separated"),
    ("bad.jsonl", b'{"text": "a"}\n{"body": "b"}\n', r"bad.jsonl:2: no string field 'text'"),
    ("t.txt.gz", gzip.compress(b"x" * 1000)[:20], r"t.txt.gz: cannot read"),
    ("empty.txt", b"", r"no documents found"),
    ("blank.txt", b"  \n\n \n", r"no non-empty documents"),
])
def test_bad_input_raises_one_line_error_naming_the_file(tmp_path, name, content, message):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(InputError, match=message) as info:
        corpus_of([path])
    assert "\n" not in str(info.value)


def test_empty_file_among_others_is_skipped_and_counted(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "full.txt").write_text("some text\n")
    c = corpus_of([tmp_path])
    assert c.stats["skipped_inputs"] == 1 and c.stats["documents"] == 1


def test_an_existing_file_with_glob_characters_in_its_name_is_that_file(tmp_path):
    (tmp_path / "notes[1].txt").write_text("bracketed\n")
    (tmp_path / "notes1.txt").write_text("what the pattern would match\n")
    assert resolve_sources([str(tmp_path / "notes[1].txt")]) == [(tmp_path / "notes[1].txt").resolve()]
    assert resolve_sources([str(tmp_path / "notes[0-9].txt")]) == [(tmp_path / "notes1.txt").resolve()]


def test_bad_parameters():
    with pytest.raises(ParameterError, match="valid_fraction"):
        IngestOptions(valid_fraction=1.5)
    with pytest.raises(ParameterError, match="text_unit='paragraphs': use 'line', 'paragraph' or 'file'"):
        IngestOptions(text_unit="paragraphs")
    with pytest.raises(ParameterError, match="unknown built-in"):
        resolve_sources(["builtin:nope"])
    with pytest.raises(ParameterError, match="sources is empty"):
        resolve_sources([])


@pytest.mark.parametrize("data", [
    b"", b"\n", b"a\n\n", b"no final newline", b"\xef\xbb\xbf", b"\xef\xbb\xbfbom\r\nthen crlf\r\n\r\nend",
    b"lone\rcr\n", b"cr at the end\r", b"two\r\r\n", "other\u2028breaks\x85and\x0cform feed\n".encode(),
    " caf\u00e9 \u201cquoted\u201d\t\n\n".encode(), b"\x1cfile separator\n",
])
def test_plain_text_lines_are_those_of_str_splitlines(tmp_path, data):
    """Lines are cut from the bytes (fast path) or from the decoded text (other line breaks): the
    same lines either way, for a whole file and for a byte range."""
    path = tmp_path / "t.txt"
    path.write_bytes(data)
    expected = data.decode("utf-8-sig").splitlines()
    assert read_file(path, OPTS)[0] == expected
    body = data.removeprefix(b"\xef\xbb\xbf")
    assert line_documents(path, body, start=7).to_list() == body.decode().splitlines()


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_paragraphs_are_cut_at_blank_lines_whatever_the_line_ends(tmp_path, newline):
    path = tmp_path / "p.txt"
    path.write_bytes(f"First paragraph.{newline}Still first.{newline}{newline}Second.{newline} \t{newline}Third."
                     .encode())
    docs = corpus_of([path], text_unit="paragraph", split_sentences=False).documents["text"].to_list()
    assert docs == ["first paragraph. still first.", "second.", "third."]


def test_invalid_utf8_is_reported_at_its_line_by_the_fast_path_too(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"fine\r\nstill fine\n\xed\xa0\x80 surrogate\n")
    with pytest.raises(InputError, match=r"bad.txt:3: invalid UTF-8 \(byte 17\)"):
        read_file(path, OPTS)


def test_word_counts_are_those_of_splitting_at_spaces_and_newlines(monkeypatch):
    texts = pl.Series(["a b", "b\nc", "a  b ", " x", "b"])  # irregular spacing: empty words count too
    words = texts.str.replace_all("\n", " ").str.split(" ").explode()

    def counts(texts: pl.Series, **options) -> tuple[int, int]:
        tokens, distinct = words_of(texts, **options)
        return tokens, pc.count_distinct(distinct).as_py()

    assert counts(texts) == (words.len(), words.n_unique()) == (11, 5)
    assert counts(texts, chunk_bytes=3) == (11, 5)  # one or two texts a chunk
    assert counts(pl.Series([], dtype=pl.String)) == (0, 0)
    # The corpus stats add up table by table, merging the distinct words as they grow: the same figures.
    docs = pl.DataFrame({"text": texts, "split": ["train", "test", "train", "valid", "train"]}).with_columns(
        **per_document())
    monkeypatch.setattr(DistinctWords, "COMPACT_WORDS", 2)
    whole, by_row = CorpusCounts(), CorpusCounts()
    whole.add(docs)
    whole.add_words(words_of(docs["text"])[1])
    for i in range(docs.height):
        by_row.add(docs.slice(i, 1))
        by_row.add_words(words_of(docs["text"].slice(i, 1))[1])
    assert whole.stats([], 0, []) == by_row.stats([], 0, [])
    assert (by_row.tokens, by_row.stats([], 0, [])["types"], by_row.sentences) == (11, 5, 6)
    assert by_row.per_split == {"train": 3, "test": 1, "valid": 1}
