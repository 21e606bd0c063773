"""The `tagger` stage: an HMM part-of-speech tagger trained on the `tagged_corpus` train split,
its free settings tuned on the valid (dev) split, accuracy reported on test — overall, on known
and unknown words, per tag — with a confusion-matrix heatmap."""

from __future__ import annotations

import polars as pl
from lexiflow.models import hmm, tagging_metrics
from lexiflow.models.ingest import sources as ingest
from lexiflow.storage import ArtifactRef, ArtifactWriter
from lexiflow.storage.formats import read_table
from lexiflow.tasks.params import TaggerParams
from lexiflow.tasks.stage import stage

OTHER = {"upos": "xpos", "xpos": "upos"}


def tagged_split(table: pl.DataFrame, split: str, column: str, refine: bool) -> list[list[tuple]]:
    rows = table.filter(pl.col("split") == split).select("words", column, OTHER[column]).iter_rows()
    if refine:
        return [list(zip(w, t, r, strict=True)) for w, t, r in rows]
    return [list(zip(w, t, strict=True)) for w, t, _ in rows]


@stage("tagger")
def train_tagger(out: ArtifactWriter, tagged: ArtifactRef, column: str, params: TaggerParams) -> None:
    table = read_table(tagged, "sentences.parquet")
    train, dev = (tagged_split(table, s, column, params.refine_states) for s in ("train", "valid"))
    if not train:  # every CoNLL-U source is named as a dev/test file
        raise ingest.no_train_split(f"tagged corpus {tagged.version}", dict(table.group_by("split").len().iter_rows()))
    tagger = hmm.HMMTagger(order=params.order).fit(train, dev=dev or None)
    tagger.save(out.folder)
    held_out = [split for split in ("test", "valid") if (table["split"] == split).any()]
    if not held_out:  # every sentence trained the tagger (sources named as train files): nothing to measure on
        out.metrics.update({"column": column, "evaluated_on": None, "method": params.method, "accuracy": None,
                            "known_accuracy": None, "unknown_accuracy": None, "tokens": 0, "unknown_tokens": 0})
        out.write_text("report.md", f"# {column.upper()} HMM tagger (order {params.order})\n\nNot evaluated: the "
                       "tagged corpus has no valid or test sentences. Add a dev or test CoNLL-U file "
                       "(`*-ud-dev.conllu`, `*-ud-test.conllu`) to the sources for accuracy figures.\n")
        return
    evaluated = held_out[0]
    gold_rows = table.filter(pl.col("split") == evaluated)
    words, gold = gold_rows["words"].to_list(), gold_rows[column].to_list()
    pred = tagger.tag_many(words, method=params.method, beam_width=params.beam_width)
    scores = tagging_metrics.accuracy_report(words, gold, pred, tagger.is_known)
    per_tag = tagging_metrics.per_tag_scores(gold, pred)
    out.write_parquet("per_tag.parquet", per_tag)
    tagging_metrics.plot_confusion(gold, pred, out.path("confusion.png"),
                                   title=f"{column.upper()} confusion ({evaluated}, row-normalised)")
    out.metrics.update({"column": column, "evaluated_on": evaluated, "method": params.method, **scores})
    lines = [f"# {column.upper()} HMM tagger (order {params.order})", "",
             f"On the {evaluated} split ({int(scores['tokens'])} tokens, {int(scores['unknown_tokens'])} unknown): "
             f"accuracy **{scores['accuracy']:.4f}**, known words {scores['known_accuracy']:.4f}, "
             f"unknown words {scores['unknown_accuracy']:.4f}.", "", "| tag | support | precision | recall | F1 |",
             "|---|---|---|---|---|"]
    for r in per_tag.sort("support", descending=True).iter_rows(named=True):
        lines.append(f"| {r['tag']} | {r['support']} | {r['precision']:.3f} | {r['recall']:.3f} | {r['f1']:.3f} |")
    out.write_text("report.md", "\n".join(lines) + "\n")
