"""The `elmo` stage: an ELMo-style biLM (`models.elmo.BiLM`) trained on the corpus's train split,
early-stopped on its valid split; the `bilstm+elmo` tagger reads its layers as features. Training
checkpoints into the artifact's scratch folder, so a killed or retried run resumes."""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl
from lexiflow.models import text
from lexiflow.models.config import from_section
from lexiflow.models.errors import InputError
from lexiflow.storage import ArtifactRef, ArtifactWriter
from lexiflow.storage.formats import read_manifest, read_table
from lexiflow.tasks.params import ElmoParams
from lexiflow.tasks.stage import stage

# The model modules import torch: the functions that train import them (a cached run imports none).
if TYPE_CHECKING:
    from lexiflow.models import elmo as bilm_module


def bilm_config(params: ElmoParams, lowercase: bool, scratch: str) -> bilm_module.BiLMConfig:
    from lexiflow.models import elmo as bilm_module
    from lexiflow.models.lm import train

    schedule = from_section(train.TrainConfig, params, clip_grad_norm=5.0, patience=1, warmup_steps=100,
                            checkpoint_dir=scratch, checkpoint_every=200)
    return bilm_module.BiLMConfig(token_input=params.token_input, dim=params.dim, hidden_dim=params.hidden_dim,
                                  num_layers=params.num_layers, max_vocab=params.max_vocab, lowercase=lowercase,
                                  train=schedule)


@stage("elmo")
def train_elmo(out: ArtifactWriter, corpus: ArtifactRef, params: ElmoParams) -> None:
    from lexiflow.models import elmo as bilm_module

    docs = read_table(corpus, "documents.parquet")
    split = {name: text.sentence_words(docs.filter(pl.col("split") == name)["text"].to_list())
             for name in ("train", "valid")}
    if not split["train"]:
        raise InputError(f"corpus {corpus.version} has no train sentences: the biLM needs text to learn from")
    # A lowercased corpus trains a lowercasing biLM: the tagger's cased words are lowercased before it reads them.
    lowercase = bool(read_manifest(corpus)["parameters"].get("params", {}).get("lowercase", False))
    bilm = bilm_module.BiLM(bilm_config(params, lowercase, str(out.scratch)))
    bilm.fit(split["train"], dev=split["valid"] or None)
    bilm.save(out.folder)
    last = bilm.history_[-1]
    dev_loss = bilm.perplexity_loss(split["valid"]) if split["valid"] else None
    out.metrics.update({"sentences": len(split["train"]), "tokens": sum(map(len, split["train"])),
                        "vocabulary": len(bilm.words), "layers": bilm.module_.n_layers, "dim": bilm.module_.out_dim,
                        "epochs": len(bilm.history_), "train_loss": last["train_loss"], "valid_loss": dev_loss,
                        "tokens_per_s": last["tokens_per_s"], "lowercase": lowercase})
