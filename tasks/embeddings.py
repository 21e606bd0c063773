"""Embedding stages. Each writes an `embeddings` artifact: `vectors.parquet` (id, word, count,
vector), and the word2vec text (`vectors.txt`) and binary (`vectors.bin`) exports gensim loads."""

from __future__ import annotations

import numpy as np

from models import svd, vectors, vocab
from storage import ArtifactRef, ArtifactWriter
from storage.formats import read_matrix, read_table, write_vectors
from tasks.params import SVDParams
from tasks.stage import stage


def write_embeddings(out: ArtifactWriter, vocabulary, word_vectors: np.ndarray, method: str) -> None:
    """Words (specials excluded) in frequency order, as Parquet and both word2vec formats."""
    n_special = len(vocab.SPECIALS)
    words = vocabulary["token"].to_list()[n_special:]
    counts = vocabulary["count"].to_numpy()[n_special:]
    matrix = word_vectors[n_special:]
    write_vectors(out, vocabulary["id"].to_numpy()[n_special:], words, counts, matrix)
    kv = vectors.keyed_vectors(words, matrix, counts)
    kv.save_word2vec_format(str(out.path("vectors.txt")), binary=False)
    kv.save_word2vec_format(str(out.path("vectors.bin")), binary=True)
    out.metrics.update({"method": method, "words": len(words), "dim": int(matrix.shape[1])})


@stage("embeddings", code=[svd, vectors])
def svd_embeddings(out: ArtifactWriter, ppmi: ArtifactRef, params: SVDParams) -> None:
    word_vectors, singular_values = svd.svd_vectors(read_matrix(ppmi), params.dim, params.power, params.add_context,
                                                    params.n_iter, params.seed)
    write_embeddings(out, read_table(ppmi, "vocab.parquet"), word_vectors, "svd")
    out.metrics["explained_top_singular_value"] = float(singular_values[0])
