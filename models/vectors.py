"""Word vectors as gensim `KeyedVectors`, the interface downstream users already know."""

from __future__ import annotations

import numpy as np
from gensim.models import KeyedVectors


def keyed_vectors(words: list[str], vectors: np.ndarray, counts: np.ndarray | None = None) -> KeyedVectors:
    """Words in the given order (most frequent first, so `restrict_vocab` works as in gensim);
    counts, when given, are kept as gensim's `count` attribute (written to word2vec exports' order)."""
    kv = KeyedVectors(vector_size=vectors.shape[1], dtype=np.float32)
    kv.add_vectors(words, vectors.astype(np.float32))
    if counts is not None:
        kv.expandos["count"] = np.asarray(counts, dtype=np.int64)
    return kv
