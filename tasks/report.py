"""The `report` stage: one markdown report (with its PNGs) over everything a run evaluated —
embeddings side by side, language-model perplexities, tagger accuracy — and the same in the
Prefect UI as table, markdown and image artifacts."""

from __future__ import annotations

import json
import logging
import re

from lexiflow.models import evaluation
from lexiflow.storage import ArtifactRef, ArtifactStore, ArtifactWriter
from lexiflow.storage.formats import read_manifest
from lexiflow.tasks.report_image import publish_chart, publish_image
from lexiflow.tasks.stage import stage
from prefect.artifacts import create_markdown_artifact, create_table_artifact

SEQ2SEQ_COLUMNS = ("model", "parameters", "train_pairs", "beam_width", "valid_bleu", "test_bleu", "valid_chrf",
                   "test_chrf")
FINETUNE_COLUMNS = ("task", "mode", "accuracy", "dev_accuracy", "trainable", "total", "trainable_%", "evaluated_on")
LM_COLUMNS = ("model", "vocabulary_size", "train_tokens", "parameters", "valid_perplexity", "test_perplexity")
FIGURE_LINK = re.compile(r"!\[[^\]]*\]\(([^)\s]+\.png)\)")


def _copy_pngs(out: ArtifactWriter, ref: ArtifactRef, prefix: str) -> list[str]:
    """Copy an input artifact's PNGs into the report (so report.md's links work), return their names."""
    store = ArtifactStore(ref.store)
    names = []
    for entry in read_manifest(ref)["files"]:
        if entry["name"].endswith(".png"):
            name = f"{prefix}-{entry['name']}"
            with store.open(ref.kind, ref.version, entry["name"]) as src:
                out.path(name).write_bytes(src.read())
            names.append(name)
    return names


def _table(rows: list[dict], columns: tuple[str, ...]) -> list[str]:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(evaluation.format_cell(row.get(c)) for c in columns) + " |")
    return lines


@stage("report")
def write_report(out: ArtifactWriter, evaluations: list[ArtifactRef], lms: list[ArtifactRef] | None = None,
                 taggers: list[ArtifactRef] | None = None, translations: list[ArtifactRef] | None = None,
                 finetuned: list[ArtifactRef] | None = None) -> None:
    store = ArtifactStore(evaluations[0].store)
    lines = ["# lexiflow evaluation report", ""]
    manifests = [read_manifest(ref) for ref in evaluations]
    rows = [{**m["metrics"], "embeddings": m["metrics"]["method"]} for m in manifests]
    lines += ["## Word embeddings", ""]
    lines += _table(rows, ("embeddings", "ws353_spearman", "simlex999_spearman", "analogy_add_accuracy",
                           "analogy_mul_accuracy", "analogy_coverage", "ws353_oov_rate", "simlex999_oov_rate",
                           "vocabulary"))
    for ref, manifest in zip(evaluations, manifests, strict=True):
        detail = store.read_text(ref.kind, ref.version, "report.md")
        detail = detail[detail.find("## "):]  # its neighbours and analogy sections; the table is above
        lines += ["", detail.replace("## ", "### ")]
        # figures named by method (one evaluation per method in a run): its projection, and the loss
        # curve of the embeddings it evaluated (trained methods)
        trained = ArtifactRef(store=ref.store, **manifest["inputs"]["embeddings"])
        method = manifest["metrics"]["method"]
        lines += [f"![{name}]({name})" for name in _copy_pngs(out, ref, method) + _copy_pngs(out, trained, method)]
    if lms:
        lines += ["", "## Language models", "", "Perplexity per token (every word and `</s>`), each sentence "
                  "scored from `<s>`; validation tunes, test is reported once.", ""]
        lines += _table([read_manifest(ref)["metrics"] for ref in lms], LM_COLUMNS)
        for ref in lms:
            model = read_manifest(ref)["metrics"]["model"]
            lines += [f"![{name}]({name})" for name in _copy_pngs(out, ref, f"lm-{model}")]
    for ref in taggers or []:
        detail = store.read_text(ref.kind, ref.version, "report.md")
        lines += ["", re.sub(r"(?m)^(#+) ", r"#\1 ", detail)]  # its headings, one level down
        column = read_manifest(ref)["metrics"]["column"]
        lines += [f"![{name}]({name})" for name in _copy_pngs(out, ref, f"tagger-{column}")]
    if translations:
        lines += _translation_section(out, translations)
    if finetuned:
        lines += _finetune_section(finetuned)
    out.write_text("report.md", "\n".join(lines) + "\n")
    out.metrics.update({"embeddings": len(evaluations), "lms": len(lms or []), "taggers": len(taggers or []),
                        "translations": len(translations or []), "finetuned": len(finetuned or [])})


def _finetune_section(finetuned: list[ArtifactRef]) -> list[str]:
    """Per task: from scratch, frozen, full, adapters, LoRA side by side, with the encoder's MLM accuracy."""
    rows = [read_manifest(ref)["metrics"] for ref in finetuned]
    for row in rows:
        row["trainable_%"] = 100 * row["trainable_share"] if row.get("trainable_share") is not None else None
    mlm = rows[0].get("encoder_masked_lm_accuracy")
    lines = ["", "## Pretraining and fine-tuning", "", f"The BERT-style encoder's held-out masked-LM accuracy: "
             f"{evaluation.format_cell(mlm)}. Each task fine-tuned on the tagged corpus' train split, stopped on "
             "valid, scored on test (word accuracy for upos, sentence accuracy for genre); scratch is the same "
             "encoder randomly initialised.", ""]
    return lines + _table(sorted(rows, key=lambda r: r["task"]), FINETUNE_COLUMNS)


def _translation_section(out: ArtifactWriter, translations: list[ArtifactRef]) -> list[str]:
    """BLEU per model side by side, sample translations and attention heatmaps (source x target)."""
    store = ArtifactStore(translations[0].store)
    lines = ["", "## Translation", "", "Corpus BLEU (sacreBLEU-equal, 13a) and chrF; every translation of a source "
             "sentence in the split is a reference. Validation tunes, test is reported once.", ""]
    lines += _table([read_manifest(ref)["metrics"] for ref in translations], SEQ2SEQ_COLUMNS)
    for ref in translations:
        model = read_manifest(ref)["metrics"]["model"]
        samples = json.loads(store.read_text(ref.kind, ref.version, "samples.json"))
        lines += ["", f"### {model}: sample translations (validation)", "", "| source | translation | reference |",
                  "|---|---|---|"]
        lines += [f"| {s['source']} | {s['translation']} | {' / '.join(s['references'])} |".replace("\n", " ")
                  for s in samples]
        lines += [""] + [f"![{name}]({name})" for name in _copy_pngs(out, ref, f"seq2seq-{model}")]
    return lines


def publish_report(report: ArtifactRef) -> str:
    """Show the report in the Prefect UI: the markdown, a table row per evaluated artifact, the headline
    chart and each of the report's figures as an image artifact."""
    store = ArtifactStore(report.store)
    try:
        manifest = read_manifest(report)
        markdown = store.read_text(report.kind, report.version, "report.md") + \
            f"\nArtifact: `{store.path(report.kind, report.version)}`\n"
        rows = []
        for name, ref in manifest["inputs"].items():
            metrics = store.manifest(ref["kind"], ref["version"])["metrics"]
            rows.append({"input": name, "artifact": f"{ref['kind']}:{ref['version']}",
                         **{k: v for k, v in metrics.items() if isinstance(v, int | float | str)}})
        # every row with every column: the UI takes the table's columns from its first row only, which
        # hid the language models' perplexities and the taggers' accuracy behind the embeddings' figures
        columns = list(dict.fromkeys(column for row in rows for column in row))
        rows = [{column: row.get(column) for column in columns} for row in rows]
        # the UI cannot follow report.md's relative image links: each figure is its own image artifact
        figures = {}
        for entry in manifest["files"]:
            if entry["name"].endswith(".png"):
                with store.open(report.kind, report.version, entry["name"]) as f:
                    figures[entry["name"]] = f.read()
    except OSError as exc:  # storage down after everything is published: skip the UI copy, keep the run
        logging.getLogger("lexiflow").warning("evaluation report not shown in the Prefect UI: %s", exc)
        return ""
    try:
        create_table_artifact(rows, key="evaluation-table", description="Evaluation of this run's artifacts")
        ui_markdown = FIGURE_LINK.sub(lambda m: f"*Figure: image artifact `{figure_key(m[1])}`*", markdown)
        create_markdown_artifact(ui_markdown, key="evaluation-report", description="lexiflow evaluation report")
        publish_chart([{**row, "embeddings": row["method"]} for row in rows
                       if row["artifact"].startswith("evaluation:")])  # all rows have every column now
        for name, png in figures.items():
            publish_image(png, figure_key(name), name)
    except Exception:  # no Prefect run context (a plain function call): the report is still returned
        pass
    return markdown


def figure_key(name: str) -> str:
    """A report PNG's image-artifact key (Prefect keys: lowercase letters, digits and dashes); the
    names carry the method or model, not a version, so each key's history spans the runs."""
    return "report-" + re.sub(r"[^a-z0-9]+", "-", name.removesuffix(".png").lower()).strip("-")
