"""Persistence: a fitted tagger's counts and coefficients as Parquet tables plus a JSON config (no
pickle). Only what was learned is stored; the decoding tables are rebuilt from it with the same code
as `fit`, so a round trip is exact."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from lexiflow.models.errors import InputError
from lexiflow.models.hmm.counts import BOS, EOS

FORMAT_VERSION = 1


def save(tagger: Any, directory: str | Path, prefix: str = "") -> None:
    """Write config.json and Parquet tables: initial, transitions (bigram), trigrams, emissions,
    suffixes, unknown_lr (coefficients of the logistic regression, `<bias>` rows the intercepts)."""
    t = tagger
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    k = len(t.tags_)
    names = t.tags_ + [BOS]
    outs = t.tags_ + [EOS]
    pl.DataFrame({"tag": t.tags_, "count": t.bigram_counts_[k, :k], "prob": t.initial_probs()}).write_parquet(
        d / f"{prefix}initial.parquet")
    pr, cu = np.nonzero(t.bigram_counts_)
    ctx = np.concatenate([t.tag_counts_, [t.bigram_counts_[k].sum()]])
    pl.DataFrame({
        "prev": [names[i] for i in pr], "tag": [outs[j] for j in cu],
        "count": t.bigram_counts_[pr, cu], "prob": t.bigram_counts_[pr, cu] / ctx[pr],
    }).write_parquet(d / f"{prefix}transitions.parquet")
    a, b, c = np.nonzero(t.trigram_counts_)
    pl.DataFrame({
        "prev2": [names[i] for i in a], "prev": [names[i] for i in b], "tag": [outs[j] for j in c],
        "count": t.trigram_counts_[a, b, c],
        "prob": t.trigram_counts_[a, b, c] / t.trigram_counts_.sum(axis=2)[a, b],
    }).write_parquet(d / f"{prefix}trigrams.parquet")
    wr, tc = np.nonzero(t.emission_counts_)
    words = list(t.vocab_)
    pl.DataFrame({
        "word_id": wr, "word": [words[i] for i in wr], "tag": [t.tags_[j] for j in tc],
        "count": t.emission_counts_[wr, tc], "prob": t.emission_counts_[wr, tc] / t.tag_counts_[tc],
    }).write_parquet(d / f"{prefix}emissions.parquet")
    s_rows = [(cased, suf, t.tags_[j], float(v)) for (cased, suf), vec in t.suffix_counts_.items()
              for j, v in enumerate(vec) if v]
    pl.DataFrame(s_rows, schema={"capitalised": pl.Boolean, "suffix": pl.String, "tag": pl.String,
                                 "count": pl.Float64}, orient="row").write_parquet(d / f"{prefix}suffixes.parquet")
    fr, fc = np.nonzero(t.lr_weights_)
    pl.DataFrame({
        "feature": [t.lr_features_[i] for i in fr] + ["<bias>"] * k,
        "tag": [t.tags_[j] for j in fc] + t.tags_,
        "weight": np.concatenate([t.lr_weights_[fr, fc], t.lr_bias_]),
    }).write_parquet(d / f"{prefix}unknown_lr.parquet")
    config = {
        "format_version": FORMAT_VERSION, "model": "HMMTagger", "params": t.get_params(),
        "tags": t.tags_, "state_output": t.state_output_, "lr_features": t.lr_features_,
        "calibration": asdict(t.calibration_),
        "lambdas": t.lambdas_.tolist(), "theta": t.theta_,
        "dev_accuracy": getattr(t, "dev_accuracy_", None),
    }
    (d / f"{prefix}config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))


def read(directory: str | Path, prefix: str = "") -> dict[str, Any]:
    """What `save` wrote: the config, and the learned state (attribute name -> value) of the tagger."""
    d = Path(directory)
    try:
        config = json.loads((d / f"{prefix}config.json").read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"{d / (prefix + 'config.json')}: cannot read the tagger config ({e}); "
                         "save a tagger there first") from e
    if config.get("format_version") != FORMAT_VERSION:
        raise InputError(f"{d}: tagger format {config.get('format_version')} is not {FORMAT_VERSION}; retrain")
    tags = config["tags"]
    k = len(tags)
    tid = {t: i for i, t in enumerate(tags)}
    prev_id = {**tid, BOS: k}
    out_id = {**tid, EOS: k}

    def table(name: str) -> pl.DataFrame:
        try:
            return pl.read_parquet(d / f"{prefix}{name}")
        except (OSError, pl.exceptions.PolarsError) as e:  # a damaged artifact: one line, not a traceback
            why = "missing" if isinstance(e, FileNotFoundError) else " ".join(str(e).split())
            raise InputError(f"{d / (prefix + name)}: cannot read the tagger table ({why}); the tagger artifact is "
                             "damaged, run `lexiflow artifacts verify`") from None

    tr = table("transitions.parquet")
    c2 = np.zeros((k + 1, k + 1))
    c2[[prev_id[t] for t in tr["prev"]], [out_id[t] for t in tr["tag"]]] = tr["count"].to_numpy()
    tri = table("trigrams.parquet")
    c3 = np.zeros((k + 1, k + 1, k + 1))
    c3[[prev_id[t] for t in tri["prev2"]], [prev_id[t] for t in tri["prev"]],
       [out_id[t] for t in tri["tag"]]] = tri["count"].to_numpy()
    em = table("emissions.parquet")
    vocab: dict[str, int] = {}
    for wid, w in zip(em["word_id"].to_list(), em["word"].to_list(), strict=True):
        vocab.setdefault(w, wid)
    emit = np.zeros((len(vocab), k))
    emit[em["word_id"].to_numpy(), [tid[t] for t in em["tag"]]] = em["count"].to_numpy()
    suffixes: dict[tuple[bool, str], np.ndarray] = {}
    for cased, suf, t, c in table("suffixes.parquet").iter_rows():
        suffixes.setdefault((cased, suf), np.zeros(k))[tid[t]] = c
    features = config["lr_features"]
    fidx = {f: i for i, f in enumerate(features)}
    weights, bias = np.zeros((len(features), k)), np.zeros(k)
    for f, t, wgt in table("unknown_lr.parquet").iter_rows():
        if f == "<bias>":
            bias[tid[t]] = wgt
        else:
            weights[fidx[f], tid[t]] = wgt
    state = {"tags_": tags, "state_output_": config["state_output"], "bigram_counts_": c2, "trigram_counts_": c3,
             "vocab_": dict(sorted(vocab.items(), key=lambda kv: kv[1])), "emission_counts_": emit,
             "suffix_counts_": suffixes, "lr_features_": features, "lr_weights_": weights, "lr_bias_": bias}
    if config.get("dev_accuracy") is not None:
        state["dev_accuracy_"] = config["dev_accuracy"]
    return {"config": config, "state": state}
