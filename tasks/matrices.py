"""Count-based stages: `cooccurrence` (word–word and term–document counts) and `ppmi`."""

from __future__ import annotations

import polars as pl

from models import cooccurrence, ppmi, vocab
from storage import ArtifactRef, ArtifactWriter
from storage.formats import VOCAB, read_matrix, read_table, write_matrix
from tasks.params import CooccurrenceParams, PPMIParams
from tasks.stage import stage


@stage("cooccurrence", code=[cooccurrence, vocab])
def count_cooccurrence(out: ArtifactWriter, tokens: ArtifactRef, tokenizer: ArtifactRef,
                       params: CooccurrenceParams) -> None:
    """Counts over all splits (intrinsic evaluation uses external word lists, not held-out text);
    special tokens, <unk> included, are dropped before windowing. Also the term–document matrix."""
    table = read_table(tokens, "tokens.parquet")
    vocabulary = read_table(tokenizer, "vocab.parquet")
    n_special = len(vocab.SPECIALS)
    ids, offsets = cooccurrence.id_stream(table["ids"], min_id=n_special)
    matrix = cooccurrence.cooccurrence_matrix(ids, offsets, vocabulary.height, params.window, params.weighting,
                                              progress=out.progress)
    write_matrix(out, "matrix.parquet", matrix)
    per_doc = table.group_by("doc_index", maintain_order=True).agg(pl.col("ids").explode())["ids"]
    doc_ids, doc_offsets = cooccurrence.id_stream(per_doc, min_id=n_special)
    write_matrix(out, "termdoc.parquet",
                 cooccurrence.term_document_matrix(doc_ids, doc_offsets, vocabulary.height))
    out.write_parquet("vocab.parquet", vocabulary, VOCAB)
    out.metrics.update({"nonzeros": int(matrix.nnz), "tokens": len(ids), "total_weight": float(matrix.sum()),
                        "vocabulary_size": vocabulary.height, "documents": len(per_doc)})


@stage("ppmi", code=[ppmi])
def compute_ppmi(out: ArtifactWriter, cooccurrence: ArtifactRef, params: PPMIParams) -> None:
    matrix = ppmi.ppmi_matrix(read_matrix(cooccurrence), params.alpha, params.shift)
    write_matrix(out, "matrix.parquet", matrix)
    out.write_parquet("vocab.parquet", read_table(cooccurrence, "vocab.parquet"), VOCAB)
    out.metrics.update({"nonzeros": int(matrix.nnz), "mean_value": float(matrix.data.mean()) if matrix.nnz else 0.0})
