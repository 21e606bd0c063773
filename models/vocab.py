"""Word-level vocabulary: counting, pruning and id encoding, vectorized with polars.

Ids 0..3 are the special tokens `<unk> <s> </s> <pad>`; words follow by descending count, ties
broken by the word's code points (so the same counts always give the same ids). Words below
`min_count`, or beyond `max_size`, map to `<unk>`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import numpy as np
import polars as pl
from lexiflow.models.errors import ParameterError
from pydantic import Field

SPECIALS = ("<unk>", "<s>", "</s>", "<pad>")
UNK_ID, BOS_ID, EOS_ID, PAD_ID = range(4)


@dataclass(frozen=True)
class Vocabulary:
    """Tokens by id and their training counts (specials count 0)."""

    frame: pl.DataFrame  # id: UInt32, token: String, count: UInt64

    @classmethod
    def from_counts(
        cls,
        counts: pl.DataFrame,
        min_count: Annotated[int, Field(ge=1, description="Words seen fewer times in the train split become "
                                                         "<unk>.")] = 5,
        max_size: Annotated[int | None, Field(ge=1, description="Keep at most this many words (most frequent "
                                                               "first).")] = None,
    ) -> Vocabulary:
        """`counts` has columns token, count. max_size counts words only, not the specials."""
        if min_count < 1:
            raise ParameterError(f"min_count={min_count}: must be at least 1")
        if max_size is not None and max_size < 1:
            raise ParameterError(f"max_size={max_size}: must be at least 1 (or None for no limit)")
        words = (
            counts.filter(pl.col("count") >= min_count, ~pl.col("token").is_in(list(SPECIALS)))
            .sort(["count", "token"], descending=[True, False])
            .head(max_size if max_size is not None else counts.height)
        )
        specials = pl.DataFrame({"token": list(SPECIALS), "count": [0] * len(SPECIALS)})
        frame = pl.concat([specials.cast({"count": pl.UInt64}), words.select("token", pl.col("count").cast(pl.UInt64))])
        return cls(frame.with_row_index("id").cast({"id": pl.UInt32}))

    @classmethod
    def count(cls, token_lists: pl.Series, min_count: int = 1, max_size: int | None = None) -> Vocabulary:
        """Build from a Series of token lists."""
        return cls.from_counts(token_counts(token_lists), min_count, max_size)

    def __len__(self) -> int:
        return self.frame.height

    @property
    def tokens(self) -> list[str]:
        return self.frame["token"].to_list()

    @property
    def counts(self) -> np.ndarray:
        return self.frame["count"].to_numpy()

    def encode_corpus(self, texts: pl.Series) -> pl.Series:
        """Texts -> id lists, through the word pre-tokenizer (the subword tokenizers' interface)."""
        from lexiflow.models.text import pretokenize_expr

        return self.encode(texts.to_frame("t").select(pretokenize_expr(pl.col("t")))["t"])

    def decode(self, ids) -> str:
        """Words joined by spaces; `<s>`, `</s>`, `<pad>` dropped (the subword tokenizers' interface)."""
        tokens = self.tokens
        return " ".join(tokens[i] for i in ids if i not in (BOS_ID, EOS_ID, PAD_ID))

    def encode(self, token_lists: pl.Series) -> pl.Series:
        """Token lists -> id lists (UInt32), unknown words -> `<unk>`."""
        mapping = dict(zip(self.frame["token"], self.frame["id"], strict=True))
        return token_lists.list.eval(
            pl.element().replace_strict(mapping, default=UNK_ID, return_dtype=pl.UInt32)
        ).alias("ids")


def token_counts(token_lists: pl.Series) -> pl.DataFrame:
    """token, count (UInt64) of a Series of token lists; counts of shards add (`merge_counts`)."""
    counts = token_lists.explode().drop_nulls().value_counts(name="count").rename({token_lists.name: "token"})
    return counts.cast({"count": pl.UInt64})


def merge_counts(counts: list[pl.DataFrame]) -> pl.DataFrame:
    """Sum token counts of several shards (any order: the vocabulary sorts them)."""
    return pl.concat(counts).group_by("token").agg(pl.col("count").sum())


def sentences(documents: pl.DataFrame, first_doc: int = 0) -> pl.DataFrame:
    """Corpus documents -> one row per sentence: doc_index, sentence, split, text. `first_doc`:
    the index of the first document (a shard of a corpus)."""
    return (
        documents.with_row_index("doc_index", offset=first_doc)
        .select("doc_index", "split", pl.col("text").str.split("\n").alias("text"))
        .explode("text")
        .with_columns(sentence=pl.int_range(pl.len()).over("doc_index").cast(pl.UInt32))
        .select("doc_index", "sentence", "split", "text")
    )


def sentence_tokens(documents: pl.DataFrame) -> pl.DataFrame:
    """Corpus documents -> one row per sentence: doc_index, sentence, split, words (pre-tokenized)."""
    from lexiflow.models.text import pretokenize_expr

    return sentences(documents).with_columns(pretokenize_expr(pl.col("text")).alias("words")).drop("text")
