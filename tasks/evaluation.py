"""The `evaluation` stage: intrinsic metrics of one or more embeddings, a markdown report, and the
same as Prefect markdown/table artifacts in the UI."""

from __future__ import annotations

import logging

import polars as pl
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from models import evaluation, vectors
from storage import ArtifactRef, ArtifactStore, ArtifactWriter
from storage.formats import read_vectors
from tasks.params import EvaluationParams
from tasks.stage import stage


def _method(ref: ArtifactRef) -> str:
    return ArtifactStore(ref.store).manifest(ref.kind, ref.version)["metrics"].get("method", ref.version)


@stage("evaluation", code=[evaluation, vectors])
def evaluate_embeddings(out: ArtifactWriter, embeddings: ArtifactRef, params: EvaluationParams) -> None:
    words, _counts, matrix = read_vectors(embeddings)
    result = evaluation.evaluate(vectors.keyed_vectors(words, matrix), params.analogy_vocabulary, params.probes)
    name = _method(embeddings)
    out.metrics.update(result["metrics"])
    out.metrics["embeddings"] = str(embeddings)
    out.write_parquet("metrics.parquet", pl.DataFrame([{"embeddings": name, **result["metrics"]}]))
    out.write_parquet("neighbours.parquet", result["neighbours"])
    out.write_parquet("analogy_sections.parquet", result["analogy_sections"])
    out.write_text("report.md", evaluation.report_markdown(f"Evaluation of {name} embeddings ({embeddings})",
                                                           {name: result}))


def publish_report(evaluations: list[ArtifactRef]) -> str:
    """Show the evaluation reports in the Prefect UI (one table row per embeddings, the markdown
    reports, a link to each artifact). Returns the combined markdown."""
    store = ArtifactStore(evaluations[0].store)
    rows, reports = [], []
    try:
        for ref in evaluations:
            manifest = store.manifest(ref.kind, ref.version)
            reports.append(store.read_text(ref.kind, ref.version, "report.md")
                           + f"\nArtifact: `{store.path(ref.kind, ref.version)}`\n")
            rows.append({"evaluation": str(ref), **{k: v for k, v in manifest["metrics"].items()
                                                     if isinstance(v, int | float | str)}})
    except OSError as exc:  # storage down after every artifact is published: skip the UI copy, keep the run
        logging.getLogger("lexiflow").warning("evaluation report not shown in the Prefect UI: %s", exc)
        return ""
    markdown = "\n\n".join(reports)
    try:
        create_table_artifact(rows, key="embedding-evaluation", description="Intrinsic evaluation of embeddings")
        create_markdown_artifact(markdown, key="embedding-report", description="Embedding evaluation report")
    except Exception:  # no Prefect run context (plain function call): the report is still returned
        pass
    return markdown
