"""Text normalization, sentence splitting and the word-level pre-tokenizer.

One implementation, as polars expressions, serves ingestion (whole corpora, vectorized) and
single strings (`normalize`, `split_sentences`, `pretokenize`), so a text is cut the same way
wherever it is seen. The rules:

- normalize: control characters removed (NUL, escape, C1 controls ...; whitespace is kept), Unicode
  NFC, every whitespace run (newlines included) becomes one space, stripped;
  lowercasing is a separate, optional step applied after sentence splitting (it needs capitals).
- sentences: a break after `.`, `!` or `?` (and any closing quotes/brackets) followed by space and
  an uppercase letter, a digit or an opening quote/bracket; not after common abbreviations
  (Mr., Dr., e.g., ...) or a single capital initial (J. Smith). Sentences are joined by `\n`.
- words (`WORD_PATTERN`): the special tokens `<unk> <s> </s> <pad>` whole (corpora such as
  WikiText mark rare words with `<unk>`), numbers with inner `.`/`,` (3.14, 1,000), words with
  inner apostrophes or hyphens (don't, well-known), and every other non-space character alone.
  Word characters are letters, marks, decimal digits, connectors (`_`) and the zero-width
  (non-)joiners (Persian `می‌خواهم` is one word); `²` is not one (`mc²` is `mc`, `²`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import polars as pl

# A word character, spelled out as Rust regex (polars) defines `\w`: the exported tokenizer.json runs
# WORD_PATTERN in Oniguruma, whose `\w` differs (it drops the zero-width (non-)joiners that Persian
# writes inside words, and adds Latin-1's ² ³ ¹ ¼ ½ ¾); these properties mean the same in both.
WORD_CHARS = r"\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}"
WORD_PATTERN = (r"</?(?:unk|s|pad)>|\p{Nd}+(?:[.,]\p{Nd}+)+"
                r"|[" + WORD_CHARS + r"]+(?:['’-][" + WORD_CHARS + r"]+)*|[^" + WORD_CHARS + r"\s]")
# The same on printable ASCII text, for Python's `re` (no \p{...}): there the word characters are
# letters, digits and `_` (tests/test_tokenizers.py checks both agree on random printable ASCII).
ASCII_WORD_PATTERN = r"</?(?:unk|s|pad)>|[0-9]+(?:[.,][0-9]+)+|[A-Za-z0-9_]+(?:['-][A-Za-z0-9_]+)*|[^A-Za-z0-9_\s]"

# ASCII word boundaries (the abbreviations are ASCII): Unicode `\b` keeps the regex off its fast DFA (2× slower).
_ABBREVIATION = (r"(?-u:\b)(Mr|Mrs|Ms|Dr|Prof|Sr|Jr|St|Mt|Gen|Col|Lt|Sgt|Rev|vs|etc|approx|Inc|Ltd|Co|Corp|No|Fig|Vol"
                 r"|[A-Z])\.")
# C0/C1 controls except whitespace (\t \n \v \f \r, U+0085), spelled so Rust regex and Oniguruma read it alike.
CONTROL = r"[\x{0}-\x{8}\x{E}-\x{1F}\x{7F}-\x{84}\x{86}-\x{9F}]"
_PROTECT = "\x00"  # stands in for a non-final period while sentences are split (normalized text has no NUL)
_SENTENCE_BREAK = r"([.!?][\"'”’)\]]*) ([\"'“‘(\[]?[\p{Lu}\d])"
# Characters NFC can change or combine with what precedes them, beyond combining marks (\p{M})
# and unassigned code points (\p{Cn}, covering Unicode versions newer than these tables): the
# NFC_Quick_Check=No singletons, non-mark second halves of canonical pairs and Hangul jamo
# (tests/test_text.py recomputes the set from `unicodedata`). Text without any of them is NFC.
_NFC_UNSAFE = (
    r"[\p{M}\p{Cn}"
    r"\x{0374}\x{037E}\x{0387}\x{0958}-\x{095F}\x{09DC}-\x{09DD}\x{09DF}\x{0A33}\x{0A36}"
    r"\x{0A59}-\x{0A5B}\x{0A5E}\x{0B5C}-\x{0B5D}\x{0F43}\x{0F4D}\x{0F52}\x{0F57}\x{0F5C}\x{0F69}"
    r"\x{1161}-\x{1175}\x{11A8}-\x{11C2}\x{1F71}\x{1F73}\x{1F75}\x{1F77}\x{1F79}\x{1F7B}\x{1F7D}"
    r"\x{1FBB}\x{1FBE}\x{1FC9}\x{1FCB}\x{1FD3}\x{1FDB}\x{1FE3}\x{1FEB}\x{1FEE}-\x{1FEF}\x{1FF9}"
    r"\x{1FFB}\x{1FFD}\x{2000}-\x{2001}\x{2126}\x{212A}-\x{212B}\x{2329}-\x{232A}\x{2ADC}"
    r"\x{F900}-\x{FA0D}\x{FA10}\x{FA12}\x{FA15}-\x{FA1E}\x{FA20}\x{FA22}\x{FA25}-\x{FA26}"
    r"\x{FA2A}-\x{FA6D}\x{FA70}-\x{FAD9}\x{FB1D}\x{FB1F}\x{FB2A}-\x{FB36}\x{FB38}-\x{FB3C}\x{FB3E}"
    r"\x{FB40}-\x{FB41}\x{FB43}-\x{FB44}\x{FB46}-\x{FB4E}\x{1D15E}-\x{1D164}\x{1D1BB}-\x{1D1C0}"
    r"\x{2F800}-\x{2FA1D}"
    r"]"
)
# A row `normalize_expr` changes: a control, an NFC-unsafe character, or whitespace that is not one
# inner space.
_NEEDS_NORMALIZING = CONTROL + "|" + _NFC_UNSAFE + r"|\s\s|[^ \S]|^ | $"


def normalize_expr(expr: pl.Expr) -> pl.Expr:
    """Controls removed, NFC, whitespace runs to one space, stripped."""
    return expr.str.replace_all(CONTROL, "").str.normalize("NFC").str.replace_all(r"\s+", " ").str.strip_chars(" ")


def _where(texts: pl.Series, needs: pl.Series, transform: Callable[[pl.Series], pl.Series]) -> pl.Series:
    """Apply a costly transform only to the rows that need it (a cheap test finds them)."""
    if not needs.any():
        return texts
    if needs.all():
        return transform(texts)
    return texts.scatter(needs.arg_true(), transform(texts.filter(needs)))


def normalize_series(texts: pl.Series) -> pl.Series:
    """`normalize_expr` on a Series, fast: most text has no controls, is already NFC and has single
    spaces, so one scan finds the rows `normalize_expr` would change and only those go through it
    (regex replacement and NFC cost ~10× a scan; three separate scans cost 3× one)."""
    needs = texts.str.contains(_NEEDS_NORMALIZING)
    return _where(texts, needs, lambda s: s.to_frame("t").select(normalize_expr(pl.col("t")))["t"])


def clean_series(texts: pl.Series, *, lowercase: bool, sentences: bool) -> pl.Series:
    """`clean_expr` on a Series, with the fast normalization."""
    out = normalize_series(texts)
    if sentences:
        out = _where(out, out.str.contains(r"[.!?]"), lambda s: s.to_frame("t").select(
            split_sentences_expr(pl.col("t")))["t"])
    return out.str.to_lowercase() if lowercase else out


def split_sentences_expr(expr: pl.Expr) -> pl.Expr:
    """Insert `\\n` between sentences of normalized text."""
    return (
        expr.str.replace_all(_ABBREVIATION, "${1}" + _PROTECT)
        .str.replace_all(r"(?-u:\b)(e\.g|i\.e)\.", "${1}" + _PROTECT)  # one pass with the above is 10× slower
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


def hf_normalizer(lowercase: bool) -> dict:
    """This module's text path as a Hugging Face `tokenizers` normalizer, for exported `tokenizer.json`
    files: controls removed, NFC, then lowercased when the corpus was. (Whitespace runs need no
    step: every pre-tokenizer drops whitespace.)"""
    steps: list[dict] = [{"type": "Replace", "pattern": {"Regex": CONTROL}, "content": ""}, {"type": "NFC"}]
    if lowercase:  # polars lowercases a word-final capital sigma to ς (Unicode's rule), Hugging Face to σ
        steps += [{"type": "Replace", "pattern": {"Regex": r"(?<=\p{Cased})Σ(?!\p{Cased})"}, "content": "ς"},
                  {"type": "Lowercase"}]
    return {"type": "Sequence", "normalizers": steps}


def _apply(texts: Iterable[str], expr: pl.Expr) -> list:
    return pl.DataFrame({"t": list(texts)}, schema={"t": pl.String}).select(expr)["t"].to_list()


def normalize(text: str, *, lowercase: bool = False) -> str:
    return _apply([text], clean_expr(pl.col("t"), lowercase=lowercase, sentences=False))[0]


def split_sentences(text: str) -> list[str]:
    joined = _apply([text], split_sentences_expr(normalize_expr(pl.col("t"))))[0]
    return [s for s in joined.split("\n") if s]


def sentence_words(texts: Iterable[str]) -> list[list[str]]:
    """The words of every sentence of every text, in order (`split_sentences` then `pretokenize`, vectorized)."""
    sentences = pl.Series(_apply(texts, split_sentences_expr(normalize_expr(pl.col("t"))).str.split("\n")),
                          dtype=pl.List(pl.String)).explode()
    return _apply(sentences.filter(sentences != ""), pretokenize_expr(pl.col("t")))


def pretokenize(text: str) -> list[str]:
    return _apply([text], pretokenize_expr(pl.col("t")))[0]
