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
