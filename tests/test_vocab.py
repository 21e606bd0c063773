import polars as pl
import pytest
from lexiflow.models.errors import ParameterError
from lexiflow.models.vocab import SPECIALS, UNK_ID, Vocabulary


def test_ids_are_specials_then_count_descending_with_code_point_ties():
    lists = pl.Series("w", [["b", "a", "c", "a"], ["c", "d"], []])
    vocab = Vocabulary.count(lists, min_count=1)
    assert vocab.tokens == [*SPECIALS, "a", "c", "b", "d"]
    assert vocab.counts.tolist() == [0, 0, 0, 0, 2, 2, 1, 1]


def test_min_count_and_max_size_prune_to_unk():
    lists = pl.Series("w", [["x", "x", "x", "y", "y", "z"]])
    assert Vocabulary.count(lists, min_count=2).tokens[4:] == ["x", "y"]
    vocab = Vocabulary.count(lists, max_size=1)
    assert vocab.tokens[4:] == ["x"]
    assert vocab.encode_batch(pl.Series("w", [["x", "y"], []]), is_pretokenized=True).to_list() == [[4, UNK_ID], []]


def test_bad_parameters():
    with pytest.raises(ParameterError, match="min_count=0"):
        Vocabulary.count(pl.Series("w", [["a"]]), min_count=0)


def test_encoding_casts_to_codes_equal_to_the_ids_and_any_other_numbering_encodes_by_lookup():
    vocab = Vocabulary.count(pl.Series("w", [["x", "x", "über", "é", "y", ""]]), min_count=1)
    assert vocab.tokens == [*SPECIALS, "x", "", "y", "é", "über"]  # count, then code point
    lists = pl.Series("w", [["über", "<unk>", "x", "x", "é"], ["", "y", "<s>"], [], ["nope", "x"]])
    encoded = vocab.encode_batch(lists, is_pretokenized=True)
    assert vocab._codes is not None and encoded.dtype == pl.List(pl.UInt32)
    assert encoded.to_list() == [[8, UNK_ID, 4, 4, 7], [5, 6, 1], [], [UNK_ID, 4]]
    # A vocabulary numbered otherwise (a hand-made vocab.parquet with gaps) has no codes: its own ids still.
    gapped = Vocabulary(vocab.frame.with_columns(pl.col("id") * 10))
    assert gapped._codes is None
    assert gapped.encode_batch(lists, is_pretokenized=True).to_list() == [[80, 0, 40, 40, 70], [50, 60, 10], [],
                                                                          [UNK_ID, 40]]
