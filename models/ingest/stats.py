"""Corpus statistics (documents, sentences, tokens, types, per split), added up a table at a time,
and `in_threads`, which runs a polars string operation on one row slice per core."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
from lexiflow.models.threads import current_threads

_THREAD_MIN_BYTES = 4 << 20  # below this a thread's start and the concat cost more than they save


def in_threads(fn: Callable, rows: pl.DataFrame | pl.Series, text: str = "text") -> list:
    """`fn` over consecutive row slices of `rows`, one slice per polars thread (POLARS_MAX_THREADS,
    within the stage's thread limit: models/threads.py), results in row order. polars' and Arrow's
    string kernels release the GIL, so a slice per core runs ~2x faster on 2 cores (a single Series op
    runs on one)."""
    column = rows[text] if isinstance(rows, pl.DataFrame) else rows
    size = int(column.str.len_bytes().cast(pl.UInt64).sum() or 0)
    n = max(1, min(current_threads(pl.thread_pool_size()), size // _THREAD_MIN_BYTES, len(rows)))
    if n == 1:
        return [fn(rows)]
    step = -(-len(rows) // n)
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(fn, [rows.slice(i, step) for i in range(0, len(rows), step)]))


def per_document() -> dict[str, pl.Expr]:
    """Each cleaned document's words (split at spaces and newlines, as `words_of` counts them), sentences
    (lines), bytes and characters of text, and odd characters (the release check's: `checks.ODD_CHARACTERS`):
    columns a shard adds, so the merge only sums them (and needs no text), and a rebuild's check reads the sum."""
    from lexiflow.models.checks import ODD_CHARACTERS

    text = pl.col("text")
    newlines = text.str.count_matches("\n", literal=True)
    return {"n_words": (text.str.count_matches(" ", literal=True) + newlines + 1).cast(pl.UInt32),
            "n_sentences": (newlines + 1).cast(pl.UInt32), "n_bytes": text.str.len_bytes().cast(pl.UInt32),
            "n_chars": text.str.len_chars().cast(pl.UInt32), "n_odd": text.str.count_matches(ODD_CHARACTERS)
            .cast(pl.UInt32)}


class DistinctWords:
    """Distinct words added array by array (a word may repeat across arrays), merged into one set
    once the words added since the last merge outnumber it (and COMPACT_WORDS): each merge at least
    doubles what it covers, so the merges cost O(total) altogether."""

    COMPACT_WORDS = 1 << 22

    def __init__(self) -> None:
        self._words: list[pa.Array] = []
        self._compacted = 0  # distinct words in self._words[0] after the last merge

    def add(self, words: pa.Array | pa.ChunkedArray) -> None:
        self._words.extend(words.chunks if isinstance(words, pa.ChunkedArray) else [words])
        if sum(map(len, self._words)) - self._compacted > max(self.COMPACT_WORDS, self._compacted):
            self._words = [self.unique()]
            self._compacted = len(self._words[0])

    def unique(self) -> pa.Array:
        return pc.unique(pa.chunked_array(self._words, pa.large_string()))

    def __len__(self) -> int:
        return pc.count_distinct(pa.chunked_array(self._words, pa.large_string())).as_py()


class CorpusCounts:
    """The corpus stats, added up a table of documents at a time (the same figures as counting
    them all at once). Tokens and types here are whitespace-separated words of the cleaned text
    (cheap); the tokenizer stage reports counts under its own pre-tokenization. The documents carry
    their counts (`per_document`) and the shards their distinct words (`add_words`): the merge node
    only adds them up."""

    def __init__(self) -> None:
        self.documents = self.sentences = self.tokens = self.text_bytes = self.characters = self.odd = 0
        self.per_split: dict[str, int] = {}
        self.words = DistinctWords()

    def add(self, docs: pl.DataFrame) -> None:
        self.documents += docs.height
        # UInt64 sums: polars sums UInt32 columns without widening (one part may hold > 4 GiB)
        self.sentences += int(docs["n_sentences"].cast(pl.UInt64).sum())
        self.tokens += int(docs["n_words"].cast(pl.UInt64).sum())
        self.text_bytes += int(docs["n_bytes"].cast(pl.UInt64).sum())
        self.characters += int(docs["n_chars"].cast(pl.UInt64).sum())
        self.odd += int(docs["n_odd"].cast(pl.UInt64).sum())
        for split, n in docs.group_by("split").len().iter_rows():
            self.per_split[split] = self.per_split.get(split, 0) + n

    def add_words(self, words: pa.Array | pa.ChunkedArray) -> None:
        """Distinct words of some documents (`_words`); a word may have been added before."""
        self.words.add(words)

    def stats(self, files: list[Path], duplicates: int, skipped: list[dict]) -> dict:
        return {
            "documents": self.documents,
            "sentences": self.sentences,
            "tokens": self.tokens,
            "types": len(self.words),
            "bytes": int(sum(p.stat().st_size for p in files)),
            "text_bytes": self.text_bytes,
            # the release check's figure (tasks/checks.py measures it only for a corpus made before)
            "odd_character_share": self.odd / self.characters if self.characters else None,
            "files": len(files),
            "duplicates_removed": duplicates,
            "skipped_inputs": len(skipped),
            "skipped": skipped,
            **{f"documents_{split}": n for split, n in sorted(self.per_split.items())},
        }


def words_of(texts: pl.Series, chunk_bytes: int = 1 << 24) -> tuple[int, pa.ChunkedArray]:
    """Word count and each chunk's distinct words of `texts`, 2× faster than splitting the Series,
    which makes a 16-byte view per word: here a chunk of texts is joined in one buffer, numpy finds
    the word ends and Arrow the distinct words, each word keeping its following space (so they
    compare as the words do). Chunks of ~16 MB reuse their memory (first-touched memory costs about
    as much as the counting); they run in threads."""
    step = max(1, -(-len(texts) * chunk_bytes // max(1, int(texts.str.len_bytes().cast(pl.UInt64).sum()))))
    counted = [part for rows in in_threads(lambda rows: [_chunk_words(rows.slice(i, step))
                                                          for i in range(0, len(rows), step)], texts)
               for part in rows]
    distinct = pa.chunked_array([unique for _tokens, unique in counted], pa.large_string())
    return sum(tokens for tokens, _unique in counted), distinct


def _chunk_words(texts: pl.Series) -> tuple[int, pa.Array]:
    """Word count and distinct words of a chunk of texts (see `words_of`)."""
    joined = texts.str.replace_all("\n", " ", literal=True).str.join(" ").cast(pl.Binary).item() + b" "
    ends = np.flatnonzero(np.frombuffer(joined, np.uint8) == ord(" ")) + 1
    words = pa.LargeStringArray.from_buffers(len(ends), pa.py_buffer(np.concatenate(([0], ends))),
                                             pa.py_buffer(joined))
    return len(words), pc.unique(words)
