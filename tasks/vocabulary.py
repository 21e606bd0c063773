"""Tokenization stages: learn a `tokenizer` (word-level vocabulary) and encode the corpus into a
`tokenized_corpus` (one row of ids per sentence)."""

from __future__ import annotations

import polars as pl

from models import text, vocab
from storage import ArtifactRef, ArtifactWriter
from storage.formats import TOKENS, VOCAB, read_table
from tasks.params import VocabularyParams
from tasks.stage import stage


@stage("tokenizer", code=[vocab, text])
def learn_vocabulary(out: ArtifactWriter, corpus: ArtifactRef, params: VocabularyParams) -> None:
    """Count words on the train split only, so held-out text can contain unknown words."""
    train = vocab.sentence_tokens(read_table(corpus, "documents.parquet").filter(pl.col("split") == "train"))
    vocabulary = vocab.Vocabulary.count(train["words"], params.min_count, params.max_size)
    out.write_parquet("vocab.parquet", vocabulary.frame, VOCAB)
    out.write_json("config.json", {"type": "word", "special_tokens": list(vocab.SPECIALS),
                                   "pattern": text.WORD_PATTERN, **params.model_dump()})
    out.metrics.update({"vocabulary_size": len(vocabulary), "train_tokens": int(train["words"].list.len().sum()),
                        "covered_tokens": int(vocabulary.counts.sum())})


def load_vocabulary(tokenizer: ArtifactRef) -> vocab.Vocabulary:
    return vocab.Vocabulary(read_table(tokenizer, "vocab.parquet"))


@stage("tokenized_corpus", code=[vocab, text])
def encode_corpus(out: ArtifactWriter, corpus: ArtifactRef, tokenizer: ArtifactRef) -> None:
    sentences = vocab.sentence_tokens(read_table(corpus, "documents.parquet"))
    ids = load_vocabulary(tokenizer).encode(sentences["words"])
    table = sentences.select("doc_index", "sentence", "split").with_columns(ids)
    out.write_parquet("tokens.parquet", table, TOKENS)
    n_tokens = int(ids.list.len().sum())
    unknown = int(ids.explode().eq(vocab.UNK_ID).sum())
    out.metrics.update({"sentences": table.height, "tokens": n_tokens, "unk_rate": unknown / max(n_tokens, 1),
                        **{f"tokens_{s}": int(n) for s, n in
                           table.group_by("split").agg(pl.col("ids").list.len().sum()).sort("split").iter_rows()}})
