"""Benchmark corpora built from the real data beside the project (never committed)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import polars as pl
from lexiflow.models.cooccurrence import id_stream
from lexiflow.models.ingest import IngestOptions, build_corpus, resolve_sources
from lexiflow.models.vocab import SPECIALS, Vocabulary, sentence_tokens

from benchmarks.harness import SHARED_DATA

WIKITEXT_VALID = SHARED_DATA / "wikitext-2" / "wiki.valid.tokens"


@lru_cache(maxsize=1)
def enwiki_ids() -> tuple[np.ndarray, np.ndarray, int]:
    """The default corpus as a word-id stream (min count 5): (ids, sentence offsets, vocab size)."""
    corpus = build_corpus(resolve_sources(["builtin:enwiki"]), IngestOptions())
    sentences = sentence_tokens(corpus.documents)
    vocab = Vocabulary.count(sentences["words"], min_count=5)
    ids, offsets = id_stream(vocab.encode_batch(sentences["words"], is_pretokenized=True), min_id=len(SPECIALS))
    return ids, offsets, len(vocab)


def repeated_stream(n_tokens: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, int]:
    """At least n_tokens of real sentences: the enwiki stream's sentences in shuffled order, repeated."""
    ids, offsets, vocab_size = enwiki_ids()
    lengths = np.diff(offsets)
    rng = np.random.default_rng(seed)
    reps = int(np.ceil(n_tokens / len(ids)))
    order = np.concatenate([rng.permutation(len(lengths)) for _ in range(reps)])
    starts, lens = offsets[:-1][order], lengths[order]
    idx = np.repeat(starts - np.concatenate(([0], np.cumsum(lens)[:-1])), lens) + np.arange(lens.sum())
    return ids[idx], np.concatenate(([0], np.cumsum(lens))), vocab_size


def plain_text_file(path: Path, target_bytes: int) -> Path:
    """WikiText-2 lines, numbered so that no two are duplicates, until target_bytes."""
    lines = [line.strip() for line in WIKITEXT_VALID.read_text(encoding="utf-8").splitlines() if line.strip()]
    written, i = 0, 0
    with path.open("w", encoding="utf-8") as f:
        while written < target_bytes:
            line = f"{i}. {lines[i % len(lines)]}\n"
            f.write(line)
            written += len(line.encode())
            i += 1
    return path


def documents_frame(path: Path) -> pl.DataFrame:
    return pl.DataFrame({"text": path.read_text(encoding="utf-8").splitlines()})
