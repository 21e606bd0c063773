import unicodedata

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st
from lexiflow.models.text import (
    _NFC_UNSAFE,
    WORD_PATTERN,
    normalize,
    normalize_series,
    pretokenize,
    sentence_words,
    split_sentences,
)


def test_sentences_break_after_final_punctuation_not_abbreviations():
    text = (
        "Mr. Smith went to Washington. He said \"Hi!\" Then J. R. Tolkien wrote 3.5 books.  "
        "It was e.g. fine. (Yes.) No? no."
    )
    assert split_sentences(text) == [
        "Mr. Smith went to Washington.",
        'He said "Hi!"',
        "Then J. R. Tolkien wrote 3.5 books.",
        "It was e.g. fine.",
        "(Yes.)",
        "No? no.",
    ]


def test_normalize_is_nfc_and_collapses_whitespace():
    assert normalize("Cafe\u0301 \n\t X", lowercase=True) == "caf\u00e9 x"
    assert normalize("  A  B ") == "A B"


def test_pretokenizer_keeps_numbers_contractions_and_hyphenated_words():
    assert pretokenize("Don't stop-me now, it costs $1,000.50 @-@ café") == [
        "Don't", "stop-me", "now", ",", "it", "costs", "$", "1,000.50", "@", "-", "@", "café",
    ]
    assert pretokenize("a <unk> b<s>") == ["a", "<unk>", "b", "<s>"]
    assert WORD_PATTERN  # documented constant shared with the tokenizers


def test_nfc_fast_path_skips_only_text_nfc_leaves_unchanged():
    """`normalize_series` runs NFC only on rows matching `_NFC_UNSAFE`: every code point outside
    that class must be NFC-stable alone, have combining class 0 and never end a canonical pair."""
    chars = [chr(c) for c in range(0x80, 0x110000) if not 0xD800 <= c < 0xE000]
    matched = pl.Series(chars).str.contains(_NFC_UNSAFE).to_list()
    pair_ends = {
        int(d.split()[1], 16)
        for ch in chars
        if (d := unicodedata.decomposition(ch)) and not d.startswith("<") and len(d.split()) == 2
    }
    unsafe = [ch for ch, hit in zip(chars, matched, strict=True) if not hit and (
        unicodedata.normalize("NFC", ch) != ch or unicodedata.combining(ch) or ord(ch) in pair_ends)]
    assert unsafe == []
    assert not pl.Series(["plain ascii", "café", "naïve — “quoted”", "東京"]).str.contains(_NFC_UNSAFE).any()


_PIECES = [*"aeAE o\t\n.\x00\x1b\x85", "e\u0301", "\u0301", "\u2126", "\u1100", "\u1161", "\u11a8", "\uac00",
           "\u0958", "\u0323\u0307", "\u212b", "\u1e69", "\U0002f800"]


@given(st.lists(st.lists(st.sampled_from(_PIECES), max_size=12).map("".join), max_size=20))
@settings(max_examples=200, deadline=None)
def test_normalize_series_equals_python_nfc(texts):
    controls = {c: None for c in [*range(0x00, 0x09), *range(0x0E, 0x20), *range(0x7F, 0x85), *range(0x86, 0xA0)]}
    expected = [" ".join(unicodedata.normalize("NFC", t.translate(controls)).split()) for t in texts]
    assert normalize_series(pl.Series(texts, dtype=pl.String)).to_list() == expected


def test_control_characters_never_reach_the_sentence_splitter():
    # NUL stands in for protected periods while sentences are split: a NUL in the input must not become "."
    assert split_sentences("Dr.\x00 Who\x1b went home. Then\x00 he slept.") == ["Dr. Who went home.", "Then he slept."]
    assert normalize("a\x00b\u0085c\x07") == "ab c"


@settings(max_examples=50, deadline=None)
@given(st.lists(st.text(alphabet=st.sampled_from("ab .!?\"(A1\u00a0\x00\u0301"), max_size=30), max_size=6))
def test_sentence_words_is_split_sentences_then_pretokenize_per_text(texts):
    assert sentence_words(texts) == [pretokenize(s) for t in texts for s in split_sentences(t)]
