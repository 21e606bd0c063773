"""The `tagger` stage: a part-of-speech tagger of one kind — the HMM (`hmm`), the BiLSTM (`bilstm`) or the
BiLSTM with ELMo features from an `elmo` artifact (`bilstm+elmo`) — trained on the `tagged_corpus` train
split, tuned (HMM calibration) or early-stopped (BiLSTM) on the valid (dev) split, accuracy reported on
test — overall, on known and unknown words, per tag — with a confusion-matrix heatmap. The BiLSTM
trains with the other tag column as a second output head when `refine_states` is on (the HMM splits
its states by it), checkpointing into the artifact's scratch folder (a killed run resumes)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl
from lexiflow.models.config import from_section
from lexiflow.models.errors import ParameterError
from lexiflow.models.ingest import sources as ingest
from lexiflow.storage import ArtifactRef, ArtifactStore, ArtifactWriter
from lexiflow.storage.formats import read_table, read_vectors
from lexiflow.tasks.params import TaggerParams
from lexiflow.tasks.stage import stage

# The model modules import torch: the functions that train import them (a cached run imports none).
if TYPE_CHECKING:
    from lexiflow.models import neural_tagger

OTHER = {"upos": "xpos", "xpos": "upos"}
HMM_FIELDS = ("order", "method", "beam_width", "refine_states")
NEURAL_FIELDS = ("refine_states", "hidden_dim", "num_layers", "char_encoder", "word_dropout_alpha", "hmm_features",
                 "epochs", "batch_size", "lr", "patience", "device", "seed")
TITLES = {"hmm": "HMM tagger", "bilstm": "BiLSTM tagger", "bilstm+elmo": "BiLSTM+ELMo tagger"}


def tagger_parameters(arguments: dict) -> dict:
    """What a tagger artifact depends on: its column, kind and that kind's settings (not `kinds`/`columns`,
    which pick the artifacts, nor the other kind's settings)."""
    p = arguments["params"].model_dump(mode="json")
    fields = HMM_FIELDS if arguments["kind"] == "hmm" else NEURAL_FIELDS
    return {"column": arguments["column"], "kind": arguments["kind"], "params": {k: p[k] for k in fields}}


def neural_config(params: TaggerParams, kind: str, scratch: str) -> neural_tagger.TaggerConfig:
    from lexiflow.models import neural_tagger
    from lexiflow.models.lm import train

    schedule = from_section(train.TrainConfig, params, clip_grad_norm=5.0, warmup_steps=100, min_lr_ratio=0.05,
                            checkpoint_dir=scratch, checkpoint_every=200)
    return from_section(neural_tagger.TaggerConfig, params, aux_weight=1.0 if params.refine_states else 0.0,
                        elmo=kind == "bilstm+elmo", train=schedule)


def tagged_split(table: pl.DataFrame, split: str, column: str, refine: bool) -> list[list[tuple]]:
    rows = table.filter(pl.col("split") == split).select("words", column, OTHER[column]).iter_rows()
    if refine:
        return [list(zip(w, t, r, strict=True)) for w, t, r in rows]
    return [list(zip(w, t, strict=True)) for w, t, _ in rows]


@stage("tagger", parameters=tagger_parameters)
def train_tagger(out: ArtifactWriter, tagged: ArtifactRef, column: str, params: TaggerParams, kind: str = "hmm",
                 elmo: ArtifactRef | None = None, vectors: ArtifactRef | None = None) -> None:
    """`vectors`: an `embeddings` artifact whose vectors initialise a BiLSTM's word embeddings."""
    from lexiflow.models import hmm, neural_tagger, tagging_metrics
    from lexiflow.models.elmo import BiLM
    from lexiflow.models.vectors import keyed_vectors

    if (kind == "bilstm+elmo") != (elmo is not None):
        raise ParameterError(f"tagger kind {kind}: " + ("needs an `elmo` artifact (the biLM)" if elmo is None
                                                           else "takes no `elmo` artifact; use kind bilstm+elmo"))
    if kind == "hmm" and vectors is not None:
        raise ParameterError("tagger kind hmm takes no pretrained `vectors` (an HMM has no word embeddings); "
                             "use kind bilstm or bilstm+elmo")
    table = read_table(tagged, "sentences.parquet")
    train_rows, dev = (tagged_split(table, s, column, params.refine_states) for s in ("train", "valid"))
    if not train_rows:  # every CoNLL-U source is named as a dev/test file
        raise ingest.no_train_split(f"tagged corpus {tagged.version}", dict(table.group_by("split").len().iter_rows()))
    title = f"{column.upper()} {TITLES[kind]}" + (f" (order {params.order})" if kind == "hmm" else "")
    if kind == "hmm":
        tagger = hmm.HMMTagger(order=params.order).fit(train_rows, dev=dev or None)
    else:
        bilm = None
        if elmo is not None:
            with ArtifactStore(elmo.store).local_dir(elmo.kind, elmo.version) as folder:
                bilm = BiLM.load(folder)
        pretrained = None
        if vectors is not None:
            words, counts, matrix = read_vectors(vectors)
            pretrained = keyed_vectors(words, matrix, counts)
        tagger = neural_tagger.BiLSTMTagger(neural_config(params, kind, str(out.scratch)))
        tagger.fit(train_rows, dev=dev or None, vectors=pretrained, bilm=bilm)
        out.metrics["epochs"] = len(tagger.history_)
        out.metrics["dev_accuracy"] = tagger.dev_accuracy_
        if bilm is not None:
            out.metrics["elmo_weights"] = tagger.elmo_weights()["weights"]
            out.metrics["elmo_gamma"] = tagger.elmo_weights()["gamma"]
    out.metrics["model"] = kind
    tagger.save(out.folder)
    held_out = [split for split in ("test", "valid") if (table["split"] == split).any()]
    if not held_out:  # every sentence trained the tagger (sources named as train files): nothing to measure on
        out.metrics.update({"column": column, "evaluated_on": None, "accuracy": None,
                            "known_accuracy": None, "unknown_accuracy": None, "tokens": 0, "unknown_tokens": 0})
        out.write_text("report.md", f"# {title}\n\nNot evaluated: the "
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
    method = params.method if kind == "hmm" else "argmax"
    out.metrics.update({"column": column, "evaluated_on": evaluated, "method": method, **scores})
    lines = [f"# {title}", "",
             f"On the {evaluated} split ({int(scores['tokens'])} tokens, {int(scores['unknown_tokens'])} unknown): "
             f"accuracy **{scores['accuracy']:.4f}**, known words {scores['known_accuracy']:.4f}, "
             f"unknown words {scores['unknown_accuracy']:.4f}.", "", "| tag | support | precision | recall | F1 |",
             "|---|---|---|---|---|"]
    if "elmo_weights" in out.metrics:
        weights = ", ".join(f"{w:.3f}" for w in out.metrics["elmo_weights"])
        lines[3:3] = [f"Learned ELMo layer weights softmax(s) (layer 0 = token vectors, then each biLSTM layer): "
                      f"{weights}; scale γ = {out.metrics['elmo_gamma']:.3f}.", ""]
    for r in per_tag.sort("support", descending=True).iter_rows(named=True):
        lines.append(f"| {r['tag']} | {r['support']} | {r['precision']:.3f} | {r['recall']:.3f} | {r['f1']:.3f} |")
    out.write_text("report.md", "\n".join(lines) + "\n")
