"""What BPE and WordPiece share: normalization, pre-tokenization, word counting, special tokens,
corpus encoding per word type, the Parquet/JSON save format and the Hugging Face export pieces.

Text path (the same in `fit`, `encode`, `encode_batch` and the exported `tokenizer.json`):

1. normalize: control characters removed, Unicode NFC and, with `lowercase` (set from the corpus it
   learns from), lowercased: what ingestion does to the corpus, so single-string `encode` of raw
   text gives what the pipeline gives (and the exported `tokenizer.json`'s normalizer does the same).
2. pre-tokenize: `pretokenizer="word"` is lexiflow's word pre-tokenizer `models.text.WORD_PATTERN`
   (regex matches, whitespace dropped); `"whitespace"` splits on Unicode whitespace only (Hugging
   Face's `WhitespaceSplit`), used to compare merges with `BpeTrainer` exactly.
3. each word is segmented on its own; a text's ids are its words' ids in order.

`normalize(text)` renders steps 1-2 back as a string: the words joined by single spaces. For any
text whose characters were all seen in training, `decode(encode(text)) == normalize(text)`, with
one exception: WordPiece matches a word that is a special token (the word pre-tokenizer keeps
`<unk>`, `<s>`, `</s>`, `<pad>` whole) to that token's id, as Hugging Face's WordPiece does (WikiText's
literal `<unk>` becomes the unknown id), so `decode` drops such `<s>`, `</s>`, `<pad>` words.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Sequence
from itertools import chain
from pathlib import Path
from typing import Annotated, Any, ClassVar

import numpy as np
import polars as pl
import pyarrow as pa
from lexiflow.models.errors import InputError, ParameterError
from lexiflow.models.estimator import Estimator
from lexiflow.models.progress import Progress
from lexiflow.models.text import ASCII_WORD_PATTERN, CONTROL, WORD_PATTERN, hf_normalizer
from pydantic import Field

log = logging.getLogger("lexiflow.tokenizers")

PRETOKENIZER_PATTERNS = {"word": WORD_PATTERN, "whitespace": r"\S+"}
# The pre-tokenizers on printable ASCII, where NFC changes nothing: one text's pieces need no polars call.
ASCII_PRETOKENIZERS = {"word": re.compile(ASCII_WORD_PATTERN), "whitespace": re.compile(r"\S+")}
DEFAULT_SPECIALS = ("<unk>", "<s>", "</s>", "<pad>")
# Pipeline parameters every subword tokenizer takes (models/config.py).
VocabSize = Annotated[int, Field(ge=16, le=1_000_000, description="Subword vocabulary size (specials included).")]
MinFrequency = Annotated[int, Field(ge=1, description="Subword training ignores pairs seen fewer times.")]
FORMAT_VERSION = 1
_CHUNK = 200_000  # texts per polars batch while counting words (bounded memory on streamed corpora)
_CHUNK_BYTES = 1 << 22  # and at most ~4 MB of text per batch: its pieces, exploded, are the peak memory


def pretokenize_series(texts: pl.Series, pattern: str, lowercase: bool = False) -> pl.Series:
    """Normalize (controls removed, NFC, optionally lowercased) and pre-tokenize a Series of texts into a
    Series of word lists (nulls -> [])."""
    texts = texts.cast(pl.String).fill_null("").str.replace_all(CONTROL, "").str.normalize("NFC")
    return (texts.str.to_lowercase() if lowercase else texts).str.extract_all(pattern)


def count_words(texts: Iterable[str] | pl.Series, pattern: str, lowercase: bool = False) -> pl.DataFrame:
    """Word-type counts `(word, count)` of a corpus, vectorized in polars and streamed in chunks.

    Sorted by word so that everything downstream is independent of the input order.
    """
    def chunks() -> Iterable[pl.Series]:
        if isinstance(texts, pl.Series):
            sizes = texts.cast(pl.String).str.len_bytes().fill_null(0).cum_sum().to_numpy()
            cuts = np.searchsorted(sizes, np.arange(_CHUNK_BYTES, int(sizes[-1]) if len(sizes) else 0, _CHUNK_BYTES))
            for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), len(texts)], strict=True):
                if b > a:
                    yield texts[a:b]
            return
        batch: list[str] = []
        size = 0
        for t in texts:
            batch.append(t)
            size += len(t)
            if len(batch) >= _CHUNK or size >= _CHUNK_BYTES:
                yield pl.Series(batch, dtype=pl.String)
                batch, size = [], 0
        if batch:
            yield pl.Series(batch, dtype=pl.String)

    # Count space-separated pieces first (a cheap literal split), then normalize and pre-tokenize
    # only the distinct pieces. Exact: no pre-token spans a space, and NFC never composes across a
    # space (a space has no canonical composition), so per-piece NFC equals whole-text NFC.
    parts = []
    with Progress("tokenizer word count", unit="texts") as progress:
        for chunk in chunks():
            pieces = chunk.cast(pl.String).fill_null("").str.split(" ").explode().alias("piece")
            parts.append(pieces.to_frame().lazy().group_by("piece").len("count").collect(engine="streaming"))
            if len(parts) >= 8:  # fold the per-chunk counts: their distinct pieces, not all of them, stay
                parts = [pl.concat(parts).group_by("piece").agg(pl.col("count").sum())]
            progress.update(len(chunk))
    if not parts:
        raise InputError("tokenizer fit: the corpus is empty (no texts); pass an iterable of strings")
    pieces = pl.concat(parts).group_by("piece").agg(pl.col("count").sum())
    counts = (
        pieces.with_columns(word=pretokenize_series(pieces["piece"], pattern, lowercase))
        .explode("word").drop_nulls("word")
        .group_by("word").agg(pl.col("count").sum()).sort("word")
    )
    if counts.height == 0:
        raise InputError("tokenizer fit: the corpus has no words (every text is empty or whitespace)")
    return counts.with_columns(pl.col("count").cast(pl.Int64))


class SubwordTokenizer(Estimator):
    """Base class: special tokens, text path, corpus encoding and persistence (an `Estimator`:
    `get_params` reads the subclass's `__init__`).

    Subclasses implement `fit`, `_encode_word(word) -> list[int]`, `_decode_tokens`, the HF model
    JSON and the state columns of `merges.parquet`.
    """

    kind: ClassVar[str] = ""

    def __init__(
        self,
        vocab_size: int,
        special_tokens: Sequence[str] = DEFAULT_SPECIALS,
        unk_token: str | None = None,
        pretokenizer: str = "word",
        min_frequency: int = 2,
        lowercase: bool = False,
    ) -> None:
        self.vocab_size = vocab_size
        self.lowercase = lowercase
        self.special_tokens = tuple(special_tokens)
        self.unk_token = unk_token
        self.pretokenizer = pretokenizer
        self.min_frequency = min_frequency

    # ---- parameters -------------------------------------------------------------------------
    def _check_params(self) -> None:
        if self.pretokenizer not in PRETOKENIZER_PATTERNS:
            raise ParameterError(f"pretokenizer={self.pretokenizer!r}: choose 'word' or 'whitespace'")
        if not self.special_tokens:
            raise ParameterError("special_tokens is empty: give at least the unknown token, e.g. ('<unk>',)")
        if len(set(self._specials)) != len(self._specials):
            raise ParameterError(f"special_tokens={self.special_tokens!r} has duplicates")
        if not isinstance(self.min_frequency, int) or self.min_frequency < 1:
            raise ParameterError(f"min_frequency={self.min_frequency!r}: use an integer >= 1")
        if not isinstance(self.vocab_size, int) or self.vocab_size <= len(self._specials):
            raise ParameterError(
                f"vocab_size={self.vocab_size!r}: must be an integer larger than the "
                f"{len(self._specials)} special tokens"
            )

    @property
    def _specials(self) -> tuple[str, ...]:
        """The special tokens as placed at ids 0.. : a custom `unk_token` not listed replaces the first."""
        specials = self.special_tokens
        if self.unk_token is not None and self.unk_token not in specials:
            specials = (self.unk_token, *specials[1:])
        return specials

    @property
    def _pattern(self) -> str:
        return PRETOKENIZER_PATTERNS[self.pretokenizer]

    @property
    def unk_id(self) -> int:
        return self._specials.index(self.unk_token) if self.unk_token is not None else 0

    def _role(self, i: int) -> int | None:
        return i if len(self._specials) > i else None

    @property
    def bos_id(self) -> int | None:
        return self._role(1)

    @property
    def eos_id(self) -> int | None:
        return self._role(2)

    @property
    def pad_id(self) -> int | None:
        return self._role(3)

    @property
    def special_ids(self) -> tuple[int, ...]:
        return tuple(range(len(self._specials)))  # the specials come first

    # ---- learned state helpers ---------------------------------------------------------------
    def _set_vocab(self, tokens: list[str]) -> None:
        self.vocab_ = tokens
        self.token_to_id_ = {t: i for i, t in enumerate(tokens)}
        self._cache: dict[str, tuple[int, ...]] = {}
        self._piece_cache: dict[str, tuple[int, ...]] = {}  # space-separated piece of a text -> its ids

    @property
    def vocab(self) -> dict[str, int]:
        self._check_fitted()
        return dict(self.token_to_id_)

    def __len__(self) -> int:
        self._check_fitted()
        return len(self.vocab_)

    def id_to_token(self, i: int) -> str:
        return self.vocab_[i]

    def token_to_id(self, token: str) -> int | None:
        return self.token_to_id_.get(token)

    # ---- text path ---------------------------------------------------------------------------
    def pretokenize(self, text: str) -> list[str]:
        """Normalization + pre-tokenization of one text: its words."""
        return pretokenize_series(pl.Series([text], dtype=pl.String), self._pattern, self.lowercase)[0].to_list()

    def normalize(self, text: str) -> str:
        """The text as the tokenizer sees it: normalized, pre-tokenized, words joined by single spaces."""
        return " ".join(self.pretokenize(text))

    def _encode_word_cached(self, word: str) -> tuple[int, ...]:
        ids = self._cache.get(word)
        if ids is None:
            ids = tuple(self._encode_word(word))
            if len(self._cache) < 1_000_000:
                self._cache[word] = ids
        return ids

    def _encode_word(self, word: str) -> list[int]:
        raise NotImplementedError

    def encode(self, text: str) -> list[int]:
        """Ids of one text. Per space-separated piece (exact: no word spans a space, see count_words),
        cached: a piece seen before costs a dict lookup; the new pieces of a text are normalized and
        pre-tokenized together in one polars call."""
        self._check_fitted()
        pieces = text.split(" ")
        try:
            return list(chain.from_iterable(map(self._piece_cache.__getitem__, pieces)))
        except KeyError:
            self._cache_pieces(pieces)
            return list(chain.from_iterable(map(self._piece_cache.__getitem__, pieces)))

    def _cache_pieces(self, pieces: list[str]) -> None:
        """Encode the pieces not cached yet: printable ASCII ones with Python's `re` (NFC changes no
        ASCII), the others normalized and pre-tokenized together in one polars call."""
        cache = self._piece_cache
        if len(cache) > 1_000_000:
            cache.clear()
        new = [p for p in set(pieces) if p not in cache]
        ascii_words = ASCII_PRETOKENIZERS[self.pretokenizer].findall
        rest = [p for p in new if not (p.isascii() and p.isprintable())]
        words_of = {p: ascii_words(p.lower() if self.lowercase else p) for p in new if p.isascii() and p.isprintable()}
        if rest:
            words_of.update(zip(rest, pretokenize_series(pl.Series(rest, dtype=pl.String), self._pattern,
                                                         self.lowercase).to_list(), strict=True))
        for piece, words in words_of.items():
            cache[piece] = tuple(i for w in words for i in self._encode_word_cached(w))

    def tokenize(self, text: str) -> list[str]:
        """The subword strings of `encode(text)`."""
        return [self.vocab_[i] for i in self.encode(text)]

    def encode_words(self, words: Sequence[str]) -> list[list[int]]:
        """Ids of each (already pre-tokenized) word; an empty word has none (no characters, no word end)."""
        self._check_fitted()
        return [list(self._encode_word_cached(w)) if w else [] for w in words]

    def decode(self, ids: Iterable[int]) -> str:
        """Text from ids: words joined by single spaces; `<s>`, `</s>`, `<pad>` are dropped, unknowns
        render as the unknown token."""
        self._check_fitted()
        drop = {i for i in (self.bos_id, self.eos_id, self.pad_id) if i is not None}
        return self._decode_tokens([self.vocab_[i] for i in ids if i not in drop])

    def _decode_tokens(self, tokens: list[str]) -> str:
        raise NotImplementedError

    def encode_batch(self, texts: pl.Series | Sequence[str] | Sequence[Sequence[str]], *,
                     is_pretokenized: bool = False) -> pl.Series:
        """One `list[u32]` of ids per text (a Series, for corpora; `.to_list()` gives lists of ints),
        encoding each distinct word once and mapping back. `is_pretokenized`: each item is already a
        list of words, taken as they are (no NFC, no pre-tokenization).

        Steps: split texts at spaces (polars), encode each distinct piece once (its words, each
        through the word cache), join every occurrence to its piece's index, gather the ids with
        numpy and cut them per text.
        """
        self._check_fitted()
        if not isinstance(texts, pl.Series):
            texts = pl.Series(texts, dtype=pl.List(pl.String) if is_pretokenized else pl.String)
        # Space-separated pieces first (exact, see count_words); each distinct piece is normalized,
        # pre-tokenized and encoded once, then every occurrence is mapped to its piece by a join.
        lists = (texts.fill_null([]).list.eval(pl.element().fill_null("")) if is_pretokenized
                 else texts.cast(pl.String).fill_null("").str.split(" "))
        words_per_text = lists.list.len().to_numpy().astype(np.int64)
        flat = lists.explode().drop_nulls().alias("piece")  # an empty list explodes to one null
        types = flat.unique().sort().to_frame().with_row_index("type")
        type_of = (flat.to_frame().join(types, on="piece", how="left", maintain_order="left")["type"]
                   .to_numpy().astype(np.int64))
        type_words = ([[w] if w else [] for w in types["piece"]] if is_pretokenized
                      else pretokenize_series(types["piece"], self._pattern, self.lowercase).to_list())
        encoded = []
        with Progress("tokenizer encode pieces", total=len(type_words), unit="types") as progress:
            for words in type_words:
                encoded.append([i for w in words for i in self._encode_word_cached(w)])
                progress.update()
        type_len = np.fromiter((len(e) for e in encoded), dtype=np.int64, count=len(encoded))
        type_ids = np.fromiter((i for e in encoded for i in e), dtype=np.uint32, count=int(type_len.sum()))
        type_start = np.concatenate([[0], np.cumsum(type_len)[:-1]]).astype(np.int64)
        occ_len = type_len[type_of]  # ids per word occurrence
        occ_start = np.concatenate([[0], np.cumsum(occ_len)[:-1]]).astype(np.int64)
        # position of each output id inside type_ids: the type's start + offset within the word
        gather = np.arange(int(occ_len.sum()), dtype=np.int64) - np.repeat(occ_start - type_start[type_of], occ_len)
        values = type_ids[gather]
        word_offsets = np.concatenate([[0], np.cumsum(words_per_text)])
        ids_per_word_cum = np.concatenate([[0], np.cumsum(occ_len)])
        offsets = ids_per_word_cum[word_offsets]
        arr = pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), pa.array(values, pa.uint32()))
        return pl.Series(texts.name or "ids", pl.from_arrow(arr)).cast(pl.List(pl.UInt32))

    # ---- persistence -------------------------------------------------------------------------
    def vocab_frame(self) -> pl.DataFrame:
        """`(id, token, count)`: count is how often the token occurs in the training corpus segmented
        with the final vocabulary (0 for special tokens)."""
        self._check_fitted()
        return pl.DataFrame(
            {"id": np.arange(len(self.vocab_), dtype=np.uint32), "token": self.vocab_,
             "count": np.asarray(self.counts_, dtype=np.int64)},
            schema={"id": pl.UInt32, "token": pl.String, "count": pl.Int64},
        )

    def merges_frame(self) -> pl.DataFrame:
        """`(rank, left, right, count, score)` in merge order."""
        self._check_fitted()
        return pl.DataFrame(
            {"rank": np.arange(len(self.merges_), dtype=np.uint32),
             "left": [a for a, _ in self.merges_], "right": [b for _, b in self.merges_],
             "count": np.asarray(self.merge_counts_, dtype=np.int64),
             "score": np.asarray(self.merge_scores_, dtype=np.float64)},
            schema={"rank": pl.UInt32, "left": pl.String, "right": pl.String, "count": pl.Int64, "score": pl.Float64},
        )

    def _hf_common(self) -> dict[str, Any]:
        # Special tokens are plain vocabulary entries, not `added_tokens`: like ours, HF then never
        # matches them inside input text (WikiText's literal "<unk>" is ordinary text: "<", "unk", ">").
        if self.pretokenizer == "word":
            pre = {"type": "Split", "pattern": {"Regex": WORD_PATTERN}, "behavior": "Removed", "invert": True}
        else:
            pre = {"type": "WhitespaceSplit"}
        return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
                "normalizer": hf_normalizer(self.lowercase), "pre_tokenizer": pre, "post_processor": None}

    def to_hf_json(self) -> str:
        """A Hugging Face `tokenizer.json` (load with `tokenizers.Tokenizer.from_str/from_file`)."""
        raise NotImplementedError

    def save(self, path: str | Path) -> None:
        """Write `vocab.parquet`, `merges.parquet`, `tokenizer.json` and `config.json` into `path`."""
        self._check_fitted()
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.vocab_frame().write_parquet(path / "vocab.parquet")
        self.merges_frame().write_parquet(path / "merges.parquet")
        if self._hf_exportable():
            (path / "tokenizer.json").write_text(self.to_hf_json(), encoding="utf-8")
        config = {"kind": self.kind, "format_version": FORMAT_VERSION, "params": self.get_params(),
                  **self._extra_config()}
        (path / "config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")

    def _extra_config(self) -> dict[str, Any]:
        return {"hf_export": "tokenizer.json" if self._hf_exportable() else None}

    def _hf_exportable(self) -> bool:
        return True

    @classmethod
    def load(cls, path: str | Path) -> SubwordTokenizer:
        """Rebuild a tokenizer written by `save` (exactly: same vocabulary, merges and encodings)."""
        path = Path(path)
        try:
            config = json.loads((path / "config.json").read_text(encoding="utf-8"))
            vocab = pl.read_parquet(path / "vocab.parquet").sort("id")
            merges = pl.read_parquet(path / "merges.parquet").sort("rank")
        except (OSError, ValueError, pl.exceptions.PolarsError) as exc:
            raise InputError(f"{path}: not a saved tokenizer ({exc}); write one with save(dir)") from exc
        if config.get("kind") != cls.kind:
            raise InputError(f"{path}/config.json: kind {config.get('kind')!r}, expected {cls.kind!r}")
        params = config["params"]
        if "special_tokens" in params:
            params["special_tokens"] = tuple(params["special_tokens"])
        tok = cls(**params)
        tok._restore(vocab, merges, config)
        return tok

    def _restore(self, vocab: pl.DataFrame, merges: pl.DataFrame, config: dict[str, Any]) -> None:
        self._set_vocab(vocab["token"].to_list())
        self.counts_ = vocab["count"].to_numpy().astype(np.int64)
        self.merges_ = list(zip(merges["left"].to_list(), merges["right"].to_list(), strict=True))
        self.merge_counts_ = merges["count"].to_list()
        self.merge_scores_ = merges["score"].to_list()
        self._after_restore(config)

    def _after_restore(self, config: dict[str, Any]) -> None:
        pass


def token_counts(n_tokens: int, words: list[list[int]], counts: Sequence[int]) -> np.ndarray:
    """How often each id occurs in the segmented training words (weighted by word counts)."""
    lens = np.fromiter((len(w) for w in words), dtype=np.int64, count=len(words))
    flat = np.fromiter((i for w in words for i in w), dtype=np.int64, count=int(lens.sum()))
    weights = np.repeat(np.asarray(counts, dtype=np.int64), lens)
    return np.bincount(flat, weights=weights, minlength=n_tokens).astype(np.int64)
