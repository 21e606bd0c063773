from models.text import WORD_PATTERN, normalize, pretokenize, pretokenize_many, split_sentences


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
    assert pretokenize_many(["a b", ""]) == [["a", "b"], []]
    assert pretokenize("a <unk> b<s>") == ["a", "<unk>", "b", "<s>"]
    assert WORD_PATTERN  # documented constant shared with the tokenizers
