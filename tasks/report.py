"""The `report` stage: one markdown report (with its PNGs) over everything a run evaluated —
embeddings side by side, language-model perplexities, tagger accuracy — and the same in the
Prefect UI as table, markdown and image artifacts."""

from __future__ import annotations

import json
import logging
import math
import re
from typing import Any

from lexiflow.models import evaluation
from lexiflow.storage import ArtifactRef, ArtifactStore, ArtifactWriter
from lexiflow.storage.formats import read_manifest
from lexiflow.tasks.report_image import publish_chart, publish_image
from lexiflow.tasks.stage import STAGE_RETRIES, stage
from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

SEQ2SEQ_COLUMNS = ("model", "parameters", "train_pairs", "beam_width", "valid_bleu", "test_bleu", "valid_chrf",
                   "test_chrf")
FINETUNE_COLUMNS = ("task", "mode", "train_fraction", "accuracy", "dev_accuracy", "trainable", "total", "trainable_%",
                    "evaluated_on")
LM_COLUMNS = ("model", "tokenizer", "device", "vocabulary_size", "train_tokens", "parameters", "valid_perplexity",
              "valid_word_perplexity", "test_perplexity", "test_word_perplexity")
# The figure that sums up an artifact of each kind, in the lineage table.
KEY_METRIC = {"corpus": "tokens", "tagged_corpus": "sentences", "tokenizer": "vocabulary_size",
              "tokenized_corpus": "unk_rate", "cooccurrence": "nonzeros", "ppmi": "nonzeros", "embeddings": "dim",
              "evaluation": "ws353_spearman", "lm": "valid_perplexity", "tagger": "accuracy",
              "report": "ws353_spearman",
              "parallel_corpus": "pairs", "seq2seq": "test_bleu", "elmo": "valid_loss",
              "encoder": "mlm_accuracy", "finetuned": "accuracy", "checks": "passed"}
TAGGER_COLUMNS = ("column", "model", "evaluated_on", "accuracy", "known_accuracy", "unknown_accuracy", "tokens",
                  "unknown_tokens", "elmo_weights", "elmo_gamma")
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


def for_people(value: Any) -> Any:
    """A figure rounded for a table people read (4 significant digits); the artifacts keep full precision."""
    if isinstance(value, float):
        return value if not math.isfinite(value) else float(f"{value:.4g}")
    return value


def device_label(device: dict[str, Any] | None) -> str:
    """`cuda NVIDIA H100 ×2 bf16`, `cpu Intel(R) Xeon(R) ... (2 threads) fp32`: what a training ran on."""
    if not isinstance(device, dict):
        return "–"
    threads = f" ({device['threads']} threads)" if device.get("threads") else ""
    return f"{device['type']} {device['name']}{threads} ×{device['count']} {device['precision']}"


def lineage_rows(refs: list[ArtifactRef]) -> list[dict[str, Any]]:
    """Every artifact the given ones were made from, inputs first (each once): kind, version, tag (method,
    tokenizer kind, model, tag column), the kind's key metric (rounded) and what it was made from."""
    from lexiflow.storage.formats import DISTINGUISHED_BY

    manifests: dict[tuple[str, str], dict[str, Any]] = {}

    def visit(ref: ArtifactRef) -> None:
        if (ref.kind, ref.version) in manifests:
            return
        manifest = read_manifest(ref)
        for entry in manifest["inputs"].values():
            visit(ArtifactRef(store=ref.store, kind=entry["kind"], version=entry["version"]))
        manifests[(ref.kind, ref.version)] = manifest

    for ref in refs:
        visit(ref)
    rows = []
    for (kind, version), manifest in manifests.items():
        metrics, key = manifest["metrics"], KEY_METRIC.get(kind)
        rows.append({"artifact": f"{kind}:{version}", "tag": str(metrics.get(DISTINGUISHED_BY.get(kind, ""), "")),
                     "key metric": f"{key} {evaluation.format_cell(for_people(metrics.get(key)))}" if key else "",
                     "made from": ", ".join(f"{name} {entry['kind']}:{entry['version']}"
                                            for name, entry in manifest["inputs"].items())})
    return rows


def _table(rows: list[dict], columns: tuple[str, ...]) -> list[str]:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(evaluation.format_cell(row.get(c)) for c in columns) + " |")
    return lines


@stage("report")
def write_report(out: ArtifactWriter, evaluations: list[ArtifactRef], lms: list[ArtifactRef] | None = None,
                 taggers: list[ArtifactRef] | None = None, translations: list[ArtifactRef] | None = None,
                 finetuned: list[ArtifactRef] | None = None, checks: ArtifactRef | None = None) -> None:
    store = ArtifactStore(evaluations[0].store)
    lines = ["# lexiflow evaluation report", ""]
    manifests = [read_manifest(ref) for ref in evaluations]
    rows = [{**m["metrics"], "embeddings": m["metrics"]["method"]} for m in manifests]
    lines += ["## Word embeddings", ""]
    lines += _table(rows, ("embeddings", "ws353_spearman", "simlex999_spearman", "analogy_add_accuracy",
                           "analogy_mul_accuracy", "analogy_coverage", "genre_test_accuracy", "ws353_oov_rate",
                           "simlex999_oov_rate", "vocabulary"))
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
        lines += ["", "## Language models", "", "Perplexity per token (every token and `</s>`, each sentence "
                  "scored from `<s>`) and per word (the same total log-probability over the words and `</s>`, so "
                  "models with different tokenizers compare); validation tunes, test is reported once.", ""]
        lm_rows = []
        for ref in lms:
            metrics = read_manifest(ref)["metrics"]
            tokenizer = read_manifest(ArtifactRef(store=ref.store, kind="tokenizer", version=metrics["tokenizer"]))
            lm_rows.append({**metrics, "tokenizer": tokenizer["metrics"].get("kind", "?"),
                            "device": device_label(metrics.get("device"))})
        lines += _table(lm_rows, LM_COLUMNS)
        for ref in lms:
            metrics = read_manifest(ref)["metrics"]
            if metrics.get("logit_lens"):
                lines += ["", f"Logit lens ({metrics['model']}): next-token predictions read out after each layer "
                          "(0 = the embedding) through the final norm and the unembedding, on validation text.", ""]
                lines += _table(metrics["logit_lens"], ("layer", "perplexity", "accuracy"))
            lines += [f"![{name}]({name})" for name in _copy_pngs(out, ref, f"lm-{metrics['model']}")]
    if taggers:
        metrics = [read_manifest(ref)["metrics"] for ref in taggers]
        rows = [{**m, "model": m.get("model", "hmm"),
                 "elmo_weights": " / ".join(f"{w:.2f}" for w in m["elmo_weights"]) if "elmo_weights" in m else None}
                for m in metrics]
        lines += ["", "## Taggers", "", "Accuracy per tag set and kind, side by side (`elmo_weights`: the learned "
                  "softmax weights of the biLM layers, layer 0 first; `elmo_gamma` their scale).", ""]
        lines += _table(sorted(rows, key=lambda r: (r["column"], r["model"])), TAGGER_COLUMNS)
    for ref in taggers or []:
        detail = store.read_text(ref.kind, ref.version, "report.md")
        lines += ["", re.sub(r"(?m)^(#+) ", r"#\1 ", detail)]  # its headings, one level down
        m = read_manifest(ref)["metrics"]
        model = m.get("model", "hmm")  # one heatmap per tagger: the HMM's keep their names of old
        prefix = f"tagger-{m['column']}" if model == "hmm" else f"tagger-{model.replace('+', '-')}-{m['column']}"
        lines += [f"![{name}]({name})" for name in _copy_pngs(out, ref, prefix)]
    if translations:
        lines += _translation_section(out, translations)
    if finetuned:
        lines += _finetune_section(finetuned)
    if checks:
        lines += _checks_section(checks)
    lines += ["", "## Lineage", "", "Every artifact behind this report, inputs first.", ""]
    lines += _table(lineage_rows([*evaluations, *(lms or []), *(taggers or []), *(translations or [])]),
                    ("artifact", "tag", "key metric", "made from"))
    out.write_text("report.md", "\n".join(lines) + "\n")
    out.metrics.update({"embeddings": len(evaluations), "lms": len(lms or []), "taggers": len(taggers or []),
                        "translations": len(translations or []), "finetuned": len(finetuned or []),
                        # the headline of the first method, the one `embeddings@production` releases
                        "ws353_spearman": read_manifest(evaluations[0])["metrics"].get("ws353_spearman")})


def _checks_section(checks: ArtifactRef) -> list[str]:
    """The release checks: each artifact against the version released under its name (first builds: floors)."""
    metrics = read_manifest(checks)["metrics"]
    verdict = ("every blocking check passed" if metrics["passed"] else
               f"**{metrics['blocking_failures']} blocking check(s) failed**: a release would be refused")
    table = ArtifactStore(checks.store).read_text(checks.kind, checks.version, "checks.md")
    return ["", "## Release checks", "", f"Each artifact against the version released under its name, or the floors "
            f"when none is (`{checks}`): {verdict}.", "", table.rstrip("\n")]


def _finetune_section(finetuned: list[ArtifactRef]) -> list[str]:
    """Per task: from scratch, frozen, full, adapters, LoRA side by side, with the encoder's MLM accuracy."""
    rows = [read_manifest(ref)["metrics"] for ref in finetuned]
    for row in rows:
        row["trainable_%"] = 100 * row["trainable_share"] if row.get("trainable_share") is not None else None
    mlm = {k.removeprefix("encoder_"): evaluation.format_cell(v) for k, v in rows[0].items()
           if k.startswith("encoder_")}
    lines = ["", "## Pretraining and fine-tuning", "", "The BERT-style encoder at the held-out [MASK] positions: "
             f"accuracy {mlm['mask_accuracy']}, perplexity {mlm['mask_perplexity']} (unigram baseline "
             f"{mlm['unigram_perplexity']}: below it, the MLM reads the context).\n\n"
             "Each task fine-tuned on the tagged corpus' train split, stopped on "
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
                         **{k: for_people(v) for k, v in metrics.items() if isinstance(v, int | float | str)}})
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


@task(name="read-lineage", cache_policy=NO_CACHE, persist_result=False, **STAGE_RETRIES)
def read_lineage(refs: list[ArtifactRef]) -> list[dict[str, Any]]:
    """`lineage_rows` for the pipeline flow's own reads: a task, so they retry through a storage outage
    as stages do (a flow body has no retries)."""
    return lineage_rows(refs)


def publish_lineage(refs: dict[str, ArtifactRef]) -> list[dict[str, Any]]:
    """Show, on the pipeline's own run, every artifact it used or made (reused ones too) and how they were
    made: a table artifact `run-lineage` (kind:version, tag, key metric, inputs, location) and a markdown
    artifact `run-artifacts` with each location as a browser can open it (an object store's URL; a local
    path as text: browsers refuse file:// links from a web page). Returns the table's rows."""
    any_ref = next(iter(refs.values()))
    store = ArtifactStore(any_ref.store)
    names = {(ref.kind, ref.version): name for name, ref in refs.items()}
    if "checks" in refs:  # the released versions the checks compared against (inputs `released.<name>`)
        names = {**{(entry["kind"], entry["version"]): f"{name.removeprefix('released.')} (released)"
                    for name, entry in read_manifest(refs["checks"])["inputs"].items()
                    if name.startswith("released.")}, **names}
    rows = [{"name": names.get(tuple(row["artifact"].split(":")), "(input)"), **row,
             "location": store.location(*row["artifact"].split(":"))} for row in read_lineage(list(refs.values()))]
    lines = ["# Artifacts of this run", "", f"Store: `{store.url}`. Used or made by this run, inputs first "
             "(reused ones included).", "", "| name | artifact | tag | key metric | location |",
             "|---|---|---|---|---|"]
    for row in rows:
        where = (f"[{row['location']}]({row['location']})" if "://" in row["location"] else f"`{row['location']}`")
        lines.append(f"| {row['name']} | `{row['artifact']}` | {row['tag']} | {row['key metric']} | {where} |")
    try:
        create_table_artifact(rows, key="run-lineage", description="Lineage: every artifact of this run and what "
                                                                   "it was made from")
        create_markdown_artifact("\n".join(lines) + "\n", key="run-artifacts",
                                 description="Every artifact this run used or made, with its location")
    except Exception:  # no Prefect run context (a plain function call): nothing to show it in
        pass
    return rows


def figure_key(name: str) -> str:
    """A report PNG's image-artifact key (Prefect keys: lowercase letters, digits and dashes); the
    names carry the method or model, not a version, so each key's history spans the runs."""
    return "report-" + re.sub(r"[^a-z0-9]+", "-", name.removesuffix(".png").lower()).strip("-")
