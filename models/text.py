"""Text normalization, sentence splitting and the word-level pre-tokenizer.

One implementation, as polars expressions, serves ingestion (whole corpora, vectorized) and
single strings (`normalize`, `split_sentences`, `pretokenize`), so a text is cut the same way
wherever it is seen. The rules:

- normalize: Unicode NFC, every whitespace run (newlines included) becomes one space, stripped;
  lowercasing is a separate, optional step applied after sentence splitting (it needs capitals).
- sentences: a break after `.`, `!` or `?` (and any closing quotes/brackets) followed by space and
  an uppercase letter, a digit or an opening quote/bracket; not after common abbreviations
  (Mr., Dr., e.g., ...) or a single capital initial (J. Smith). Sentences are joined by `\n`.
- words (`WORD_PATTERN`): the special tokens `<unk> <s> </s> <pad>` whole (corpora such as
  WikiText mark rare words with `<unk>`), numbers with inner `.`/`,` (3.14, 1,000), words with
  inner apostrophes or hyphens (don't, well-known), and every other non-space character alone.
"""

from __future__ import annotations

from collections.abc import Iterable

import polars as pl

WORD_PATTERN = r"</?(?:unk|s|pad)>|\d+(?:[.,]\d+)+|\w+(?:['’-]\w+)*|[^\w\s]"

_ABBREVIATION = r"\b(Mr|Mrs|Ms|Dr|Prof|Sr|Jr|St|Mt|Gen|Col|Lt|Sgt|Rev|vs|etc|approx|Inc|Ltd|Co|Corp|No|Fig|Vol|[A-Z])\."
_PROTECT = "\x00"  # stands in for a non-final period while sentences are split
_SENTENCE_BREAK = r"([.!?][\"'”’)\]]*) ([\"'“‘(\[]?[\p{Lu}\d])"


def normalize_expr(expr: pl.Expr) -> pl.Expr:
    """NFC, whitespace runs to one space, stripped."""
    return expr.str.normalize("NFC").str.replace_all(r"\s+", " ").str.strip_chars(" ")


def split_sentences_expr(expr: pl.Expr) -> pl.Expr:
    """Insert `\\n` between sentences of normalized text."""
    return (
        expr.str.replace_all(_ABBREVIATION, "${1}" + _PROTECT)
        .str.replace_all(r"\b(e\.g|i\.e)\.", "${1}" + _PROTECT)
        .str.replace_all(_SENTENCE_BREAK, "${1}\n${2}")
        .str.replace_all(_PROTECT, ".", literal=True)
    )


def pretokenize_expr(expr: pl.Expr) -> pl.Expr:
    """A list of word tokens per text (sentence breaks are whitespace here)."""
    return expr.str.extract_all(WORD_PATTERN)


def clean_expr(expr: pl.Expr, *, lowercase: bool, sentences: bool) -> pl.Expr:
    """The full ingestion text path: normalize, optionally split sentences, optionally lowercase."""
    out = normalize_expr(expr)
    if sentences:
        out = split_sentences_expr(out)
    return out.str.to_lowercase() if lowercase else out


def _apply(texts: Iterable[str], expr: pl.Expr) -> list:
    return pl.DataFrame({"t": list(texts)}, schema={"t": pl.String}).select(expr)["t"].to_list()


def normalize(text: str, *, lowercase: bool = False) -> str:
    return _apply([text], clean_expr(pl.col("t"), lowercase=lowercase, sentences=False))[0]


def split_sentences(text: str) -> list[str]:
    joined = _apply([text], split_sentences_expr(normalize_expr(pl.col("t"))))[0]
    return [s for s in joined.split("\n") if s]


def pretokenize(text: str) -> list[str]:
    return _apply([text], pretokenize_expr(pl.col("t")))[0]


def pretokenize_many(texts: Iterable[str]) -> list[list[str]]:
    return _apply(texts, pretokenize_expr(pl.col("t")))
