"""Loaders: an artifact as the natural Python object, for downstream jobs.

    from lexiflow.storage import Catalog
    kv = Catalog("artifacts").load("embeddings")          # gensim KeyedVectors, the latest
    docs = Catalog("artifacts").load("corpus", "3f2a...")  # polars DataFrame

`LOADERS` maps a kind to `loader(store, manifest) -> object`; a new kind is one line there.
Layering: storage/ sits below models/, so this module imports nothing from models/ (nor gensim or
scipy) at import time; each loader imports what it needs inside its body, and `Catalog.load`
imports this module only when called. `import storage` stays light and models/-free.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import polars as pl
from lexiflow.storage.store import ArtifactStore

Loader = Callable[[ArtifactStore, dict[str, Any]], Any]


@dataclass(frozen=True)
class MatrixArtifact:
    """A `cooccurrence` or `ppmi` artifact: the word–word matrix (scipy CSR, rows and columns are
    vocabulary ids), the vocabulary (id, token, count), and for co-occurrence the term–document
    matrix (words × documents)."""

    matrix: Any  # scipy.sparse.csr_matrix
    vocabulary: pl.DataFrame
    term_document: Any | None = None

    def to_polars(self) -> pl.DataFrame:
        """The nonzero cells as (row, col, value, row_word, col_word)."""
        coo = self.matrix.tocoo()
        words = self.vocabulary.select(pl.col("id").cast(pl.UInt32), "token")
        cells = pl.DataFrame({"row": coo.row.astype("uint32"), "col": coo.col.astype("uint32"), "value": coo.data})
        return (cells.join(words.rename({"id": "row", "token": "row_word"}), on="row", how="left")
                .join(words.rename({"id": "col", "token": "col_word"}), on="col", how="left"))


@dataclass(frozen=True)
class EvaluationReport:
    """An `evaluation` artifact: one metrics row, nearest neighbours of the probe words, analogy
    accuracy per section, and the markdown report."""

    metrics: pl.DataFrame
    neighbours: pl.DataFrame
    analogy_sections: pl.DataFrame
    markdown: str


def _ref(store: ArtifactStore, manifest: dict[str, Any]):
    return store.ref(manifest["kind"], manifest["version"])


def _table(name: str) -> Loader:
    def load(store: ArtifactStore, manifest: dict[str, Any]) -> pl.DataFrame:
        return store.read_parquet(manifest["kind"], manifest["version"], name)

    load.__doc__ = f"`{name}` as a polars DataFrame."
    return load


def load_tokenizer(store: ArtifactStore, manifest: dict[str, Any]):
    """A word `models.vocab.Vocabulary`, or a `models.tokenizers` BPE / WordPiece; all of them
    have `encode_corpus(texts)`."""
    kind = store.read_json(manifest["kind"], manifest["version"], "config.json")["kind"]
    if kind == "word":
        from lexiflow.models.vocab import Vocabulary

        return Vocabulary(store.read_parquet(manifest["kind"], manifest["version"], "vocab.parquet"))
    from lexiflow.models.tokenizers import BPE, WordPiece

    with local_folder(store, manifest) as folder:
        return {"bpe": BPE, "wordpiece": WordPiece}[kind].load(folder)


def load_report(store: ArtifactStore, manifest: dict[str, Any]) -> str:
    """The run's evaluation report (markdown; its PNGs sit beside it in the artifact)."""
    return store.read_text(manifest["kind"], manifest["version"], "report.md")


def load_matrix(store: ArtifactStore, manifest: dict[str, Any]) -> MatrixArtifact:
    from lexiflow.storage.formats import read_matrix

    ref, names = _ref(store, manifest), {f["name"] for f in manifest["files"]}
    return MatrixArtifact(read_matrix(ref), store.read_parquet(ref.kind, ref.version, "vocab.parquet"),
                          read_matrix(ref, "termdoc.parquet") if "termdoc.parquet" in names else None)


def load_embeddings(store: ArtifactStore, manifest: dict[str, Any]):
    """gensim `KeyedVectors`, words in frequency order, with their training counts."""
    from lexiflow.models.vectors import keyed_vectors
    from lexiflow.storage.formats import read_vectors

    words, counts, vectors = read_vectors(_ref(store, manifest))
    return keyed_vectors(words, vectors, counts)


def load_evaluation(store: ArtifactStore, manifest: dict[str, Any]) -> EvaluationReport:
    kind, version = manifest["kind"], manifest["version"]
    return EvaluationReport(*(store.read_parquet(kind, version, f"{name}.parquet")
                              for name in ("metrics", "neighbours", "analogy_sections")),
                            store.read_text(kind, version, "report.md"))


def local_folder(store: ArtifactStore, manifest: dict[str, Any]):
    """The artifact's folder on the local disk (a temporary download for remote stores), for
    models whose `load(dir)` reads a directory."""
    return store.local_dir(manifest["kind"], manifest["version"])


def load_lm(store: ArtifactStore, manifest: dict[str, Any]):
    """A language model: the n-gram `NgramLM`, or the neural LM (a torch module in `.module_`)."""
    model = manifest["metrics"].get("model")
    with local_folder(store, manifest) as folder:
        if model == "ngram":
            from lexiflow.models.lm.ngram import NgramLM

            return NgramLM.load(folder)
        from lexiflow.models.lm import neural

        return neural.load(folder)


def load_tagger(store: ArtifactStore, manifest: dict[str, Any]):
    """The HMM part-of-speech tagger (`.tag(words)`)."""
    from lexiflow.models.hmm import HMMTagger

    with local_folder(store, manifest) as folder:
        return HMMTagger.load(folder)


def load_encoder(store: ArtifactStore, manifest: dict[str, Any]):
    """The MLM-pretrained encoder (`MaskedLM`: `.model` the torch module, `.config`, `.metrics`)."""
    from lexiflow.models.encoder import MaskedLM

    with local_folder(store, manifest) as folder:
        return MaskedLM.load(folder)


LOADERS: dict[str, Loader] = {
    "tagger": load_tagger,
    "corpus": _table("documents.parquet"),
    "tagged_corpus": _table("sentences.parquet"),
    "tokenizer": load_tokenizer,
    "tokenized_corpus": _table("tokens.parquet"),
    "cooccurrence": load_matrix,
    "ppmi": load_matrix,
    "embeddings": load_embeddings,
    "evaluation": load_evaluation,
    "lm": load_lm,
    "encoder": load_encoder,
    "report": load_report,
}

__all__ = ["LOADERS", "EvaluationReport", "MatrixArtifact", "local_folder"]
