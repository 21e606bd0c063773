"""The n-gram `lm` stage: a Kneser–Ney (or add-k / MLE) language model over the tokenized corpus.

The artifact is `NgramLM.save`'s folder (`config.json`, `ngrams_<k>.parquet`) with the held-out
perplexity in the manifest's metrics; `Catalog(root).load("lm")` gives the `NgramLM` back.
"""

from __future__ import annotations

from typing import Literal

import polars as pl
from pydantic import Field

from models.lm import ngram
from storage import ArtifactRef, ArtifactWriter
from storage.formats import read_table
from tasks.params import Params
from tasks.stage import stage


class NgramParams(Params):
    order: int = Field(3, ge=1, le=8, description="n: tokens per n-gram (a context of n-1 tokens).")
    smoothing: Literal["kneser_ney", "add_k", "mle"] = Field(
        "kneser_ney", description="Interpolated (modified) Kneser–Ney, add-k (Lidstone) or maximum likelihood.")
    discount: float | None = Field(None, gt=0, le=1, description="Kneser–Ney: one fixed discount; empty: modified "
                                                                "KN with discounts estimated from the counts.")
    k: float = Field(1.0, gt=0, description="add-k: the pseudo-count (1 = Laplace).")


def _sentences(tokens: pl.DataFrame, split: str) -> list:
    return [ids for ids in tokens.filter(pl.col("split") == split)["ids"].to_numpy()] if tokens.height else []


@stage("lm", code=[ngram])
def ngram_lm(out: ArtifactWriter, tokens: ArtifactRef, tokenizer: ArtifactRef, params: NgramParams) -> None:
    """Fit on the train split; report perplexity on the valid split (when it has sentences)."""
    table = read_table(tokens, "tokens.parquet")
    vocab_size = read_table(tokenizer, "vocab.parquet").height
    model = ngram.NgramLM(params.order, params.smoothing, params.discount, params.k, vocab_size=vocab_size)
    model.fit([s.astype("int64") for s in _sentences(table, "train")])
    model.save(out.folder)
    valid = [s.astype("int64") for s in _sentences(table, "valid")]
    out.metrics.update({"model": "ngram", **params.model_dump(),
                        "valid_perplexity": float(model.perplexity(valid)) if valid else None})
