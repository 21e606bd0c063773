"""Parameters of each stage as pydantic models: defaults, bounds and descriptions become the
Prefect UI form; unknown names are rejected (`extra="forbid"`) before any work starts."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from models.evaluation import DEFAULT_PROBES


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CorpusParams(Params):
    sources: list[str] = Field(
        default=["builtin:enwiki"], min_length=1,
        description="Files, directories, glob patterns, or builtin:enwiki / builtin:lee. Formats: plain text "
                    "(.txt, any), .jsonl, .parquet, .conllu, MediaWiki .xml dumps; optionally .gz/.bz2.")
    lowercase: bool = Field(True, description="Lowercase the text after sentence splitting.")
    split_sentences: bool = Field(True, description="Split documents into sentences (one per line).")
    text_unit: Literal["line", "paragraph", "file"] = Field(
        "line", description="What one document is in plain-text files.")
    dedupe: bool = Field(True, description="Drop exact duplicate documents (after cleaning).")
    valid_fraction: float = Field(0.05, ge=0, lt=0.5, description="Share of documents in the valid split.")
    test_fraction: float = Field(0.05, ge=0, lt=0.5, description="Share of documents in the test split.")
    text_field: str = Field("text", min_length=1, description="JSONL field / Parquet column holding the text.")
    max_file_bytes: int = Field(4 << 30, ge=1, description="Largest decompressed file accepted, in bytes.")
    bad_files: Literal["fail", "skip"] = Field(
        "fail", description="A file that cannot be read (binary, bad encoding, malformed, truncated): stop with "
                            "its error, or skip it and list it in the corpus stats.")


class VocabularyParams(Params):
    min_count: int = Field(5, ge=1, description="Words seen fewer times in the train split become <unk>.")
    max_size: int | None = Field(None, ge=1, description="Keep at most this many words (most frequent first).")


class CooccurrenceParams(Params):
    window: int = Field(5, ge=1, le=63, description="Words on each side counted as context.")
    weighting: Literal["uniform", "harmonic"] = Field(
        "harmonic", description="Weight of a pair at distance d: 1, or 1/d (harmonic, as GloVe).")


class PPMIParams(Params):
    alpha: float = Field(0.75, gt=0, le=1, description="Context-distribution smoothing exponent (1 = none).")
    shift: float = Field(1.0, ge=1, description="Shift k: subtract log k (1 = plain PPMI).")


class SVDParams(Params):
    dim: int = Field(300, ge=2, le=2000, description="Embedding dimension.")
    power: float = Field(0.5, ge=0, le=1, description="Vectors are U·S^power.")
    add_context: bool = Field(False, description="Add the context vectors V·S^power.")
    n_iter: int = Field(5, ge=1, le=50, description="Power iterations of the randomized SVD.")
    seed: int = Field(0, ge=0, description="Random seed.")


class EvaluationParams(Params):
    analogy_vocabulary: int = Field(30_000, ge=100, description="Analogy answers come from this many most "
                                                                "frequent words (as in word2vec's evaluation).")
    probes: list[str] = Field(default=list(DEFAULT_PROBES), description="Words whose nearest neighbours are shown.")
