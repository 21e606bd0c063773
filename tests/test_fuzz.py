"""Property-based fuzzing (hypothesis) of every parser and of the text pipeline that exists:
CoNLL-U, MediaWiki XML/markup, JSONL, the normalizer, sentence splitter and word pre-tokenizer
(models/text.py), and the word vocabulary (models/vocab.py). No unexpected exceptions (only
`InputError` for bad input); round-trips where the code promises them.

`LEXIFLOW_FUZZ_EXAMPLES` sets the examples per property (default 100; the benchmark runs more).
`EXAMPLES` counts the examples actually run, for the benchmark's report.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from xml.sax.saxutils import escape

import polars as pl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from models import text, vocab
from models.conllu import Sentence, format_sentence, parse_lines
from models.errors import InputError
from models.ingest import IngestOptions, _jsonl_documents, _wiki_documents, read_file

EXAMPLES: Counter = Counter()
FUZZ = settings(max_examples=int(os.environ.get("LEXIFLOW_FUZZ_EXAMPLES", "100")), deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
PATH = Path("fuzz")

# Text with the characters that matter to the parsers: separators, digits, markup, Unicode
# line/space separators, combining marks, astral characters.
TRICKY = st.sampled_from(list("\t\n\r #-._=|[]{}<>'\"/\\&;:,!?\u2028\u0085\u00a0\u0301\U0001f600\ufeffİßﬁ\u200b"))
TEXT = st.text(alphabet=st.one_of(st.characters(blacklist_categories=("Cs",)), TRICKY), max_size=80)
WORD = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp"), blacklist_characters="\t\n\r"),
               min_size=1, max_size=12)


# ---- CoNLL-U -----------------------------------------------------------------------------------
@FUZZ
@given(st.lists(st.one_of(TEXT, st.builds("\t".join, st.lists(TEXT, min_size=8, max_size=11))), max_size=12))
def test_conllu_parser_accepts_or_rejects_cleanly(lines):
    EXAMPLES["conllu garbage"] += 1
    try:
        for sent in parse_lines(lines, source=str(PATH)):
            assert len(sent.words) == len(sent.upos) == len(sent.xpos) > 0
    except InputError as exc:
        assert str(exc).startswith(f"{PATH}:") and "\n" not in str(exc)


@FUZZ
@given(st.lists(st.lists(st.tuples(WORD, WORD, WORD), min_size=1, max_size=8), min_size=1, max_size=5))
def test_conllu_round_trip(sentences):
    EXAMPLES["conllu round trip"] += 1
    sents = [Sentence(words=[w for w, _, _ in s], upos=[u for _, u, _ in s], xpos=[x for _, _, x in s],
                      sent_id=f"s{i}") for i, s in enumerate(sentences)]
    block = "".join(format_sentence(s) for s in sents)
    parsed = list(parse_lines(block.split("\n")))
    assert [(p.words, p.upos, p.xpos, p.sent_id) for p in parsed] == [(s.words, s.upos, s.xpos, s.sent_id)
                                                                        for s in sents]


# ---- JSONL -------------------------------------------------------------------------------------
@FUZZ
@given(st.lists(st.fixed_dictionaries({"text": TEXT}, optional={"id": st.integers(), "meta": TEXT}), max_size=8),
       st.booleans())
def test_jsonl_round_trip(objects, ascii_only):
    EXAMPLES["jsonl round trip"] += 1
    body = "\n".join(json.dumps(o, ensure_ascii=ascii_only) for o in objects) + "\n"
    assert _jsonl_documents(PATH, body, "text") == [o["text"] for o in objects]


@FUZZ
@given(TEXT)
def test_jsonl_garbage_is_input_error_or_documents(body):
    EXAMPLES["jsonl garbage"] += 1
    try:
        docs = _jsonl_documents(PATH, body, "text")
        assert all(isinstance(d, str) for d in docs)
    except InputError as exc:
        assert str(exc).startswith(f"{PATH}:") and "\n" not in str(exc)


# ---- MediaWiki ---------------------------------------------------------------------------------
MARKUP = st.lists(st.one_of(TEXT, st.sampled_from(["[[", "]]", "{{", "}}", "'''", "''", "<ref>", "</ref>", "|",
                                                   "==", "[http://x.org a]", "{|", "|}", "<!--", "-->", "#REDIRECT",
                                                   "[[File:a.png|thumb|x]]", "&amp;", "<nowiki>", "*", "\n"])),
                  max_size=30).map("".join)


def _xml_safe(s: str) -> str:
    """Characters XML 1.0 allows (the dump itself would have no others)."""
    return "".join(c for c in s if c in "\t\n\r" or 0x20 <= ord(c) <= 0xD7FF or 0xE000 <= ord(c) <= 0xFFFD
                   or ord(c) >= 0x10000)


@FUZZ
@given(st.lists(st.tuples(MARKUP, st.sampled_from(["0", "1", "14"])), min_size=1, max_size=4))
def test_wiki_markup_never_crashes_and_keeps_article_pages_only(pages):
    EXAMPLES["wiki markup"] += 1
    xml = "<mediawiki xmlns='http://www.mediawiki.org/xml/export-0.10/'>" + "".join(
        f"<page><title>T{i}</title><ns>{ns}</ns><revision><text>{escape(_xml_safe(body))}</text></revision></page>"
        for i, (body, ns) in enumerate(pages)) + "</mediawiki>"
    docs = _wiki_documents(PATH, xml.encode())
    articles = [b for b, ns in pages if ns == "0" and _xml_safe(b) and not _xml_safe(b).lstrip().lower()
                .startswith("#redirect")]
    assert len(docs) == len(articles) and all(isinstance(d, str) for d in docs)


@FUZZ
@given(st.binary(max_size=200), st.integers(0, 120))
def test_garbled_wiki_xml_is_input_error_or_documents(noise, cut):
    EXAMPLES["wiki garbage"] += 1
    base = b"<mediawiki><page><title>A</title><ns>0</ns><revision><text>x [[y]]</text></revision></page></mediawiki>"
    for data in (noise, base[:cut] + noise, base[:cut] + noise + base[cut:]):
        try:
            docs = _wiki_documents(PATH, data)
            assert all(isinstance(d, str) for d in docs)
        except InputError as exc:
            assert str(exc).startswith(f"{PATH}") and "\n" not in str(exc)


@FUZZ
@given(st.binary(max_size=300), st.sampled_from(["a.txt", "a.jsonl", "a.conllu", "a.xml", "a.parquet", "a.txt.gz",
                                                 "a.txt.bz2"]))
def test_any_bytes_in_any_format_give_documents_or_one_line_error(data, name):
    EXAMPLES["any file"] += 1
    path = _scratch() / name
    path.write_bytes(data)
    try:
        docs, _tagged = read_file(path, IngestOptions(max_file_bytes=1 << 20))
        assert all(isinstance(d, str) for d in docs)
    except InputError as exc:
        assert str(path) in str(exc) and "\n" not in str(exc)


def _scratch() -> Path:
    import tempfile

    global _SCRATCH
    if "_SCRATCH" not in globals():
        _SCRATCH = Path(tempfile.mkdtemp(prefix="lexiflow-fuzz-"))
    return _SCRATCH


# ---- text: normalizer, sentence splitter, pre-tokenizer ----------------------------------------
# Whitespace as models/text.py means it: Unicode White_Space (the regex `\s` of polars/Rust). Python's
# str.isspace also counts the separators U+001C..U+001F, which are not White_Space.
WHITE_SPACE = set("\t\n\x0b\x0c\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000") | set(map(chr, range(0x2000, 0x200B)))
NO_NUL = st.text(alphabet=st.one_of(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), TRICKY),
                 max_size=80)


@FUZZ
@given(NO_NUL)
def test_normalize_is_idempotent_and_clean(raw):
    EXAMPLES["normalize"] += 1
    once = text.normalize(raw)
    assert text.normalize(once) == once
    assert not once or (once[0] not in WHITE_SPACE and once[-1] not in WHITE_SPACE)
    assert all(c == " " or c not in WHITE_SPACE for c in once) and "  " not in once


@FUZZ
@given(NO_NUL)
def test_sentence_split_only_inserts_breaks(raw):
    EXAMPLES["sentences"] += 1
    sentences = text.split_sentences(raw)
    assert " ".join(sentences) == text.normalize(raw)
    assert all(s and "\n" not in s for s in sentences)


@FUZZ
@given(NO_NUL)
def test_pretokenize_gives_spaceless_tokens_in_order_and_is_stable(raw):
    EXAMPLES["pretokenize"] += 1
    tokens = text.pretokenize(raw)
    assert all(t and not WHITE_SPACE & set(t) for t in tokens)
    position = 0
    for token in tokens:  # tokens are pieces of the input, in order
        position = raw.index(token, position) + len(token)
    assert text.pretokenize(" ".join(tokens)) == tokens  # re-tokenizing the tokens changes nothing


@FUZZ
@given(st.lists(NO_NUL, max_size=6), st.booleans(), st.booleans())
def test_vectorized_cleaning_equals_one_at_a_time(raws, lowercase, sentences):
    EXAMPLES["clean series"] += 1
    series = text.clean_series(pl.Series(raws, dtype=pl.String), lowercase=lowercase, sentences=sentences)
    singles = [text._apply([r], text.clean_expr(pl.col("t"), lowercase=lowercase, sentences=sentences))[0]
               for r in raws]
    assert series.to_list() == singles


# ---- vocabulary ------------------------------------------------------------------------------
@FUZZ
@given(st.lists(st.lists(WORD, max_size=10), max_size=10), st.integers(1, 3), st.one_of(st.none(), st.integers(1, 5)))
def test_vocabulary_encodes_known_words_to_themselves_and_the_rest_to_unk(sentences, min_count, max_size):
    EXAMPLES["vocabulary"] += 1
    series = pl.Series("words", sentences, dtype=pl.List(pl.String))
    v = vocab.Vocabulary.count(series, min_count, max_size)
    tokens = v.tokens
    assert tokens[:4] == list(vocab.SPECIALS) and len(set(tokens)) == len(tokens)
    counts = Counter(w for s in sentences for w in s)
    words = tokens[4:]
    assert all(counts[w] >= min_count and w not in vocab.SPECIALS for w in words)
    assert max_size is None or len(words) <= max_size
    # Ids follow descending count, ties by code point: the same counts always give the same ids.
    assert words == sorted(words, key=lambda w: (-counts[w], w))
    ids = v.encode(series).to_list()
    for sentence, encoded in zip(sentences, ids, strict=True):
        assert [tokens[i] if tokens[i] in words else vocab.SPECIALS[vocab.UNK_ID] for i in encoded] == [
            w if w in words else vocab.SPECIALS[vocab.UNK_ID] for w in sentence]
    # Order of the input sentences does not change the vocabulary.
    assert vocab.Vocabulary.count(pl.Series("words", sentences[::-1], dtype=pl.List(pl.String)), min_count,
                                  max_size).tokens == tokens
