"""The `lm` stage: train a language model on a `tokenized_corpus` (word or subword ids), report
validation and test perplexity. N-gram models save Parquet count tables; neural ones
config.json + model.safetensors + metrics.parquet + loss_curve.png. Neural training checkpoints
into the artifact's scratch folder, so a killed or retried run resumes where it stopped. With
`neural.world_size` > 1 the stage launches that many data-parallel ranks with torchrun (one per
GPU of the worker; `models.lm.distributed`) and publishes what rank 0 wrote."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import polars as pl
from lexiflow.models import device, vocab
from lexiflow.models.config import from_section
from lexiflow.models.device import resolve_device
from lexiflow.models.errors import ParameterError
from lexiflow.storage import ArtifactRef, ArtifactWriter
from lexiflow.storage.formats import read_manifest, read_table, read_vectors
from lexiflow.tasks.ngram_pieces import count_ngrams
from lexiflow.tasks.params import NeuralLMParams, NgramParams
from lexiflow.tasks.stage import stage

# The model modules import torch: the functions that train import them (a cached run imports none).
if TYPE_CHECKING:
    from lexiflow.models.lm import neural


SPLITS = ("train", "valid", "test")


def split_sentences(table: pl.DataFrame, splits: tuple[str, ...] = SPLITS) -> dict[str, list[np.ndarray]]:
    """Sentences (1-D id arrays, no boundary tokens) per split of a tokenized corpus' table."""
    from lexiflow.models.lm import ngram

    return {split: ngram.sentence_arrays(table.filter(pl.col("split") == split)["ids"]) for split in splits}


def scored_tokens(table: pl.DataFrame, column: str = "ids") -> dict[str, int]:
    """Tokens a model scores per split: each sentence's items (`column`, lists) and its `</s>`."""
    counts = table.group_by("split").agg(pl.col(column).list.len().sum() + pl.len()).iter_rows()
    return {split: 0 for split in SPLITS} | {split: int(n) for split, n in counts}


def words_per_split(tokens: ArtifactRef, tokenizer_kind: str, scored: dict[str, int]) -> dict[str, int]:
    """Words scored per split, `</s>` of each sentence included: a per-word perplexity divides the same total
    log-probability by these, so word and subword models compare. Word tokens are words; a subword model's
    words are the corpus sentences' words (the word pre-tokenizer's)."""
    if tokenizer_kind == "word":
        return dict(scored)
    corpus = read_manifest(tokens)["inputs"]["corpus"]
    documents = read_table(ArtifactRef(store=tokens.store, kind="corpus", version=corpus["version"]),
                           "documents.parquet").select("text", "split")
    return scored_tokens(vocab.sentence_tokens(documents), "words")


def word_perplexity(token_ppl: float, tokens: int, words: int) -> float:
    """exp(total NLL / words) from the per-token perplexity over `tokens` scored tokens."""
    from lexiflow.models.lm import train

    return train.perplexity(math.log(token_ppl) * tokens / words) if math.isfinite(token_ppl) else math.inf


def pretrained_matrix(embeddings: ArtifactRef, tokens: list[str], dim: int, dim_name: str) -> np.ndarray:
    """Rows aligned to the LM's token ids; NaN rows for tokens the embeddings lack."""
    words, _counts, vectors = read_vectors(embeddings)
    if vectors.shape[1] != dim:  # the pipeline checks this up front; the train-lm flow takes any embeddings
        raise ParameterError(f"inputs.embeddings: {embeddings} has {vectors.shape[1]} dimensions, the LM needs "
                             f"neural.{dim_name}={dim}: pick embeddings of that size or change neural.{dim_name}")
    index = {w: i for i, w in enumerate(words)}
    matrix = np.full((len(tokens), dim), np.nan, dtype=np.float32)
    found = [(row, index[t]) for row, t in enumerate(tokens) if t in index]
    if found:
        rows, src = map(list, zip(*found, strict=True))
        matrix[rows] = vectors[src]
    return matrix


# Where each kind's code lives (models/lm/registry.py's KINDS, named: importing them imports torch).
KIND_MODULES = {kind: f"lexiflow.models.lm.{module}" for kind, module in (
    ("ngram", "ngram"), ("ffnn", "ffnn"), ("rnn", "rnn"), ("lstm", "rnn"), ("gru", "rnn"),
    ("transformer", "transformer"))}

# What the pipeline sets itself in a kind's config, beyond its section (models/config.py).
FIXED = {"rnn": {"cell": "rnn"}, "lstm": {"cell": "lstm"}, "gru": {"cell": "gru"}}


def neural_model(kind: str, vocab_size: int, p: NeuralLMParams, out: ArtifactWriter,
                 embeddings: np.ndarray | None) -> neural.NeuralLM:
    from lexiflow.models.lm import registry, train

    estimator, fixed = registry.KINDS[kind], FIXED.get(kind, {})
    schedule = from_section(train.TrainConfig, p, checkpoint_dir=str(out.scratch))
    return estimator(from_section(estimator.config_class, p, vocab_size=vocab_size, **fixed), schedule, embeddings)


@stage("lm", variants=("model", KIND_MODULES))  # each kind versioned with its own code
def train_lm(out: ArtifactWriter, tokens: ArtifactRef, tokenizer: ArtifactRef, model: str,
             params: NgramParams | NeuralLMParams, embeddings: ArtifactRef | None = None) -> None:
    import torch
    from lexiflow.models.lm import distributed, ngram

    encoded_with = read_manifest(tokens)["inputs"].get("tokenizer")
    if encoded_with and encoded_with["version"] != tokenizer.version:  # train-lm takes the two by version
        raise ParameterError(f"inputs: {tokens} was encoded with tokenizer:{encoded_with['version']}, not "
                             f"{tokenizer}: pass inputs.tokenizer={encoded_with['version']} (or tokens that "
                             f"{tokenizer} encoded)")
    vocabulary = read_table(tokenizer, "vocab.parquet")
    table = read_table(tokens, "tokens.parquet")
    scored = scored_tokens(table)
    if model == "ngram":
        lm = from_section(ngram.NgramLM, params, vocab_size=vocabulary.height)
        counted = count_ngrams(out, tokens, tokenizer, lm)  # run by run, from the store's pieces where it has them
        # train's sentences only when nothing was counted: a rebuild from pieces never splits them
        lm = lm.fit(split_sentences(table, ("train",))["train"]) if counted is None else lm.fit_counts(*counted)
        data = split_sentences(table, ("valid", "test"))
        out.metrics["device"] = device.describe(torch.device("cpu"), "fp64")  # counts and probabilities in numpy
    else:
        data = split_sentences(table)
        dim_name = "d_model" if model == "transformer" else "emb_dim"
        init = (pretrained_matrix(embeddings, vocabulary["token"].to_list(), getattr(params, dim_name), dim_name)
                if embeddings else None)
        lm = neural_model(model, vocabulary.height, params, out, init)
        if params.world_size > 1:
            lm = distributed.fit_distributed(lm, data["train"], data["valid"] or None, world_size=params.world_size,
                                             workdir=out.work / "ddp",
                                             device=str(resolve_device(params.device, "neural.device")))
        else:
            lm.fit(data["train"], data["valid"] or None, progress=out.progress)
        used = lm.device_ if params.world_size == 1 else resolve_device(params.device, "neural.device")
        out.metrics["device"] = device.describe(used, device.lm_precision(used, lm.train.precision), params.world_size)
        out.metrics["world_size"] = params.world_size
        out.metrics["parameters"] = lm.n_parameters
        out.metrics["pretrained"] = str(embeddings) if embeddings else None
        if model == "transformer" and data["valid"]:  # per-layer read-out on validation text
            out.metrics["logit_lens"] = lm.logit_lens_table(data["valid"])
    lm.save(out.folder)
    out.write_json("lexiflow.json", {"model": model, "tokenizer": str(tokenizer), "tokens": str(tokens)})
    out.metrics.update({"model": model, "tokenizer": tokenizer.version, "vocabulary_size": vocabulary.height,
                        "train_tokens": scored["train"]})
    words = words_per_split(tokens, read_manifest(tokenizer)["metrics"].get("kind", "word"), scored)
    for split in ("valid", "test"):
        if not data[split]:
            out.metrics.update({f"{split}_perplexity": None, f"{split}_word_perplexity": None})
            continue
        ppl = float(lm.perplexity(data[split], progress=out.progress))  # neural: logs sentences/s and ETA
        out.metrics.update({f"{split}_perplexity": ppl, f"{split}_word_perplexity": word_perplexity(
            ppl, scored[split], words.get(split, scored[split]))})
