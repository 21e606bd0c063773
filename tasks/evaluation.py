"""The `evaluation` stage: intrinsic metrics of one or more embeddings, a markdown report, and the
same as Prefect markdown/table artifacts in the UI."""

from __future__ import annotations

import logging

import polars as pl
from lexiflow.models.config import from_section
from lexiflow.storage import ArtifactRef, ArtifactWriter
from lexiflow.storage.formats import read_manifest, read_vectors
from lexiflow.tasks.params import EvaluationParams
from lexiflow.tasks.stage import stage

# The model modules import torch or gensim: the functions that use them import them (a cached run imports none).

logger = logging.getLogger("lexiflow.evaluation")


def _method(ref: ArtifactRef) -> str:
    return read_manifest(ref)["metrics"].get("method", ref.version)


@stage("evaluation")
def evaluate_embeddings(out: ArtifactWriter, embeddings: ArtifactRef, params: EvaluationParams) -> None:
    from lexiflow.models import embedding_plots, evaluation, extrinsic, vectors

    words, _counts, matrix = read_vectors(embeddings)
    result = evaluation.evaluate(vectors.keyed_vectors(words, matrix), params.analogy_vocabulary, params.probes,
                                 progress=out.progress)
    name = _method(embeddings)
    if params.genre_treebank:  # extrinsic: held-out genre accuracy beside the intrinsic scores
        result["metrics"].update(extrinsic.genre_accuracy(words, matrix, params.genre_treebank,
                                                          from_section(extrinsic.ClassifierConfig, params)))
    out.metrics.update(result["metrics"])
    out.metrics.update({"method": name, "embeddings": str(embeddings)})
    out.write_parquet("metrics.parquet", pl.DataFrame([{"embeddings": name, **result["metrics"]}]))
    out.write_parquet("neighbours.parquet", result["neighbours"])
    out.write_parquet("analogy_sections.parquet", result["analogy_sections"])
    report = evaluation.report_markdown(f"Evaluation of {name} embeddings ({embeddings})", {name: result})
    drawable = len(embedding_plots.frequent_rows(matrix, params.projection_words))
    if drawable >= embedding_plots.MIN_PROJECTION_WORDS:
        embedding_plots.plot_projection(matrix, words, out.path("projection.png"), n_words=params.projection_words,
                                        title=f"{name} embeddings")
    elif params.projection_words:  # a toy vocabulary: the metrics still stand, only the map is left out
        note = (f"No PCA/t-SNE map: {drawable} trained words, a map needs at least "
                f"{embedding_plots.MIN_PROJECTION_WORDS}.")
        logger.warning("%s: %s", name, note)
        report += f"\n{note}\n"
    out.write_text("report.md", report)
