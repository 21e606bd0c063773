"""Tokenization stages: learn a `tokenizer` (word-level vocabulary, BPE or WordPiece) on the train
split and encode the corpus into a `tokenized_corpus` (one row of ids per sentence)."""

from __future__ import annotations

import polars as pl

from models import text, tokenizers, vocab
from models.tokenizers import BPE, WordPiece
from models.tokenizers import base as tokenizer_base
from models.tokenizers import bpe as bpe_module
from models.tokenizers import wordpiece as wordpiece_module
from storage import ArtifactRef, ArtifactWriter, Catalog
from storage.formats import TOKENS, VOCAB, read_table
from tasks.params import TokenizerParams, VocabularyParams
from tasks.stage import stage

SUBWORD = {"bpe": BPE, "wordpiece": WordPiece}


def train_sentences(corpus: ArtifactRef) -> pl.DataFrame:
    return vocab.sentences(read_table(corpus, "documents.parquet").filter(pl.col("split") == "train"))


@stage("tokenizer", code=[vocab, text])
def learn_vocabulary(out: ArtifactWriter, corpus: ArtifactRef, params: VocabularyParams) -> None:
    """Word-level: count words on the train split only, so held-out text can have unknown words."""
    words = vocab.sentence_tokens(read_table(corpus, "documents.parquet").filter(pl.col("split") == "train"))["words"]
    vocabulary = vocab.Vocabulary.count(words, params.min_count, params.max_size)
    out.write_parquet("vocab.parquet", vocabulary.frame, VOCAB)
    out.write_json("config.json", {"kind": "word", "special_tokens": list(vocab.SPECIALS),
                                   "pattern": text.WORD_PATTERN, "params": params.model_dump()})
    out.metrics.update({"kind": "word", "vocabulary_size": len(vocabulary),
                        "train_tokens": int(words.list.len().sum()), "covered_tokens": int(vocabulary.counts.sum())})


@stage("tokenizer", code=[text, tokenizers, tokenizer_base, bpe_module, wordpiece_module])
def learn_subword(out: ArtifactWriter, corpus: ArtifactRef, params: TokenizerParams) -> None:
    """BPE or WordPiece trained on the train split's sentences; saved with a HF tokenizer.json."""
    options = {"vocab_size": params.vocab_size, "min_frequency": params.min_frequency}
    if params.kind == "bpe":
        options.update(end_of_word=params.end_of_word, marker=params.marker)
    tokenizer = SUBWORD[params.kind](**options).fit(train_sentences(corpus)["text"])
    tokenizer.save(out.folder)
    out.metrics.update({"kind": params.kind, "vocabulary_size": len(tokenizer.vocab), "merges": len(tokenizer.merges_)})


@stage("tokenized_corpus", code=[vocab, text, tokenizers, tokenizer_base, bpe_module, wordpiece_module])
def encode_corpus(out: ArtifactWriter, corpus: ArtifactRef, tokenizer: ArtifactRef) -> None:
    rows = vocab.sentences(read_table(corpus, "documents.parquet"))
    ids = Catalog(tokenizer.store).load(tokenizer.kind, tokenizer.version).encode_corpus(rows["text"]).alias("ids")
    table = rows.select("doc_index", "sentence", "split").with_columns(ids)
    out.write_parquet("tokens.parquet", table, TOKENS)
    n_tokens = int(ids.list.len().sum())
    unknown = int(ids.explode().eq(vocab.UNK_ID).sum())
    per_split = table.group_by("split").agg(pl.col("ids").list.len().sum()).sort("split").iter_rows()
    out.metrics.update({"sentences": table.height, "tokens": n_tokens, "unk_rate": unknown / max(n_tokens, 1),
                        **{f"tokens_{split}": int(n) for split, n in per_split}})
