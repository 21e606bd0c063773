"""The `lm` stage: train a language model on a `tokenized_corpus` (word or subword ids), report
validation and test perplexity. N-gram models save Parquet count tables; neural ones
config.json + model.safetensors + metrics.parquet + loss_curve.png. Neural training checkpoints
into the artifact's scratch folder, so a killed or retried run resumes where it stopped. With
`neural.world_size` > 1 the stage launches that many data-parallel ranks with torchrun (one per
GPU of the worker; `models.lm.distributed`) and publishes what rank 0 wrote."""

from __future__ import annotations

import numpy as np
import polars as pl
from lexiflow.models import attention, device, transformer_blocks
from lexiflow.models.device import resolve_device
from lexiflow.models.errors import ParameterError
from lexiflow.models.lm import distributed, ffnn, neural, ngram, rnn, train, transformer
from lexiflow.storage import ArtifactRef, ArtifactWriter, formats
from lexiflow.storage.formats import read_manifest, read_table, read_vectors
from lexiflow.tasks.params import NeuralLMParams, NgramParams
from lexiflow.tasks.stage import stage


def split_sentences(tokens: ArtifactRef) -> dict[str, list[np.ndarray]]:
    """Sentences (1-D id arrays, no boundary tokens) per split."""
    table = read_table(tokens, "tokens.parquet")
    out = {}
    for split in ("train", "valid", "test"):
        ids = table.filter(pl.col("split") == split)["ids"]
        flat = ids.explode().drop_nulls().to_numpy().astype(np.int64)
        out[split] = np.split(flat, np.cumsum(ids.list.len().to_numpy())[:-1]) if len(ids) else []
    return out


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


def neural_model(kind: str, vocab_size: int, p: NeuralLMParams, out: ArtifactWriter,
                 embeddings: np.ndarray | None) -> neural.NeuralLM:
    schedule = train.TrainConfig(
        epochs=p.epochs, max_steps=p.max_steps, batch_size=p.batch_size, bptt=p.bptt, optimizer=p.optimizer,
        lr=p.lr, warmup_steps=p.warmup_steps, patience=p.patience, device=p.device, seed=p.seed,
        checkpoint_dir=str(out.scratch), checkpoint_every=p.checkpoint_every)
    common = {"dropout": p.dropout, "freeze_embeddings": p.freeze_embeddings}
    if kind == "ffnn":
        config = ffnn.FFNNConfig(vocab_size, context_size=p.context_size, emb_dim=p.emb_dim,
                                 hidden_dim=p.hidden_dim, **common)
        return ffnn.FFNNLM(config, schedule, embeddings)
    if kind in ("rnn", "lstm", "gru"):
        config = rnn.RNNConfig(vocab_size, cell=kind, emb_dim=p.emb_dim, hidden_dim=p.hidden_dim,
                               num_layers=p.num_layers, tie_weights=p.tie_weights, **common)
        return rnn.RNNLM(config, schedule, embeddings)
    config = transformer.TransformerConfig(vocab_size, max_len=p.max_len, d_model=p.d_model, n_layers=p.n_layers,
                                           n_heads=p.n_heads, positional=p.positional, tie_weights=p.tie_weights,
                                           **common)
    return transformer.TransformerLM(config, schedule, embeddings)


@stage("lm", code=[ngram, neural, train, ffnn, rnn, transformer, distributed, device, formats, transformer_blocks,
                   attention])
def train_lm(out: ArtifactWriter, tokens: ArtifactRef, tokenizer: ArtifactRef, model: str,
             params: NgramParams | NeuralLMParams, embeddings: ArtifactRef | None = None) -> None:
    encoded_with = read_manifest(tokens)["inputs"].get("tokenizer")
    if encoded_with and encoded_with["version"] != tokenizer.version:  # train-lm takes the two by version
        raise ParameterError(f"inputs: {tokens} was encoded with tokenizer:{encoded_with['version']}, not "
                             f"{tokenizer}: pass inputs.tokenizer={encoded_with['version']} (or tokens that "
                             f"{tokenizer} encoded)")
    vocabulary = read_table(tokenizer, "vocab.parquet")
    data = split_sentences(tokens)
    if model == "ngram":
        lm = ngram.NgramLM(order=params.order, smoothing=params.smoothing, discount=params.discount, k=params.k,
                           min_count=params.min_count,
                           vocab_size=vocabulary.height).fit(data["train"])
    else:
        dim_name = "d_model" if model == "transformer" else "emb_dim"
        init = (pretrained_matrix(embeddings, vocabulary["token"].to_list(), getattr(params, dim_name), dim_name)
                if embeddings else None)
        lm = neural_model(model, vocabulary.height, params, out, init)
        if params.world_size > 1:
            lm = distributed.fit_distributed(lm, data["train"], data["valid"] or None, world_size=params.world_size,
                                             workdir=out.work / "ddp",
                                             device=str(resolve_device(params.device, "neural.device")))
        else:
            lm.fit(data["train"], data["valid"] or None)
        out.metrics["world_size"] = params.world_size
        out.metrics["parameters"] = lm.n_parameters
        out.metrics["pretrained"] = str(embeddings) if embeddings else None
    lm.save(out.folder)
    out.write_json("lexiflow.json", {"model": model, "tokenizer": str(tokenizer), "tokens": str(tokens)})
    out.metrics.update({
        "model": model, "tokenizer": tokenizer.version, "vocabulary_size": vocabulary.height,
        "train_tokens": int(sum(len(s) + 1 for s in data["train"])),
        "valid_perplexity": float(lm.perplexity(data["valid"])) if data["valid"] else None,
        "test_perplexity": float(lm.perplexity(data["test"])) if data["test"] else None,
    })
