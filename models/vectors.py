"""Word vectors as gensim `KeyedVectors` (the interface downstream users already know), and a
reweighting of their singular values."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl
from gensim.models import KeyedVectors


def keyed_vectors(words: Sequence[str], vectors: np.ndarray, counts: np.ndarray | None = None) -> KeyedVectors:
    """Words in the given order (most frequent first, so `restrict_vocab` works as in gensim);
    counts, when given, are kept as gensim's `count` attribute (written to word2vec exports' order).
    Zero rows (specials, words a method never trained) are left out: a zero vector has no direction,
    and gensim's cosines with it are NaN, which would poison similarity rankings and analogies."""
    keep = np.flatnonzero(np.any(vectors != 0, axis=1))
    kv = KeyedVectors(vector_size=vectors.shape[1], dtype=np.float32)
    kv.add_vectors([words[i] for i in keep], np.ascontiguousarray(vectors[keep], dtype=np.float32))
    if counts is not None:
        kv.expandos["count"] = np.asarray(counts, dtype=np.int64)[keep]
    return kv


def save_text(kv: KeyedVectors, path: str) -> None:
    """`kv` in the word2vec text format, in the order gensim's `save_word2vec_format(binary=False)` writes
    (most frequent first where counts are kept), each value the shortest decimal that reads back as the same
    float32, as gensim's `str` of it (which writes 1e-05 where this writes 0.00001). gensim formats one value per
    Python call: 2.8 s for 24 k words of 300 dimensions, the larger part of an SVD rebuild; polars 0.35 s."""
    counts = kv.expandos.get("count")
    order = np.argsort(-counts, kind="stable") if counts is not None else np.arange(len(kv))
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(f"{len(kv)} {kv.vector_size}\n")
        if len(kv):
            values = pl.Series(kv.vectors[order]).cast(pl.Array(pl.String, kv.vector_size)).arr.join(" ")
            words = pl.Series([kv.index_to_key[i] for i in order], dtype=pl.String)
            f.write("\n".join((words + " " + values).to_list()) + "\n")


def reweight_spectrum(vectors: np.ndarray, power: float) -> np.ndarray:
    """X = U Σ Vᵀ → U Σ^power Vᵀ / σ₁^(power−1): the singular values raised to `power`, the leading
    one kept (so the vectors' scale stays).

    power > 1 stretches the leading directions against the trailing ones. Artetxe et al. (2018,
    "Uncovering divergent linguistic information in word embeddings") tune such a transformation to
    move a space between similarity and relatedness; on our dev halves power > 1 raised SimLex-999
    and lowered WS353 (docs/embeddings.md). Computed from the d × d Gram matrix
    (X·V·Σ^(power−1)·Vᵀ), so the singular vectors' signs do not matter and zero rows stay zero;
    directions with σ ≈ 0 (rank-deficient X) are dropped rather than blown up when power < 1.
    power 1 returns the vectors unchanged.
    """
    if power == 1 or not vectors.any():
        return vectors
    gram = vectors.T.astype(np.float64) @ vectors.astype(np.float64)
    eigenvalues, basis = np.linalg.eigh(gram)  # eigenvalues σ², ascending
    ratio = eigenvalues / eigenvalues[-1]
    present = ratio > len(ratio) * np.finfo(vectors.dtype).eps
    scale = np.zeros_like(ratio)
    scale[present] = ratio[present] ** ((power - 1) / 2)  # (σ/σ₁)^(power−1)
    transform = (basis * scale) @ basis.T
    return (vectors @ transform).astype(vectors.dtype)
