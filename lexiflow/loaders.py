"""Loaders: an artifact as the natural Python object, for downstream jobs.

    from lexiflow.loaders import load
    kv = load("artifacts", "embeddings")            # gensim KeyedVectors, the latest
    kv = load("artifacts", "embeddings@production") # the version the alias names (what downstream jobs read)
    docs = load(catalog, "corpus", "3f2a...")       # polars DataFrame (a Catalog or a store URL)

Layering: this module sits above `storage/` (bytes, schemas, versions, the catalog) and `models/`
(each model's own `load(directory)`): `LOADERS` maps an artifact kind to `loader(store, manifest)`,
and a new kind is one line there. Loaders import the models they need in their bodies, so loading
a corpus never imports torch or gensim.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
from lexiflow.storage import ArtifactStore, Catalog, StoreError
from lexiflow.storage.export import Extra
from lexiflow.storage.formats import read_matrix, read_vectors

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


def table(name: str) -> Loader:
    def load_table(store: ArtifactStore, manifest: dict[str, Any]) -> pl.DataFrame:
        return store.read_parquet(manifest["kind"], manifest["version"], name)

    load_table.__doc__ = f"`{name}` as a polars DataFrame."
    return load_table


def local_folder(store: ArtifactStore, manifest: dict[str, Any]):
    """The artifact's folder on the local disk (a temporary download for remote stores), for
    models whose `load(dir)` reads a directory."""
    return store.local_dir(manifest["kind"], manifest["version"])


def load_tokenizer(store: ArtifactStore, manifest: dict[str, Any]):
    """A word `models.vocab.Vocabulary`, or a `models.tokenizers` BPE / WordPiece: one interface
    (`encode`, `encode_batch`, `decode`, `tokenize`, `token_to_id`, the special ids)."""
    from lexiflow.models import tokenizers

    with local_folder(store, manifest) as folder:
        return tokenizers.load(folder)


def load_report(store: ArtifactStore, manifest: dict[str, Any]) -> str:
    """The run's evaluation report (markdown; its PNGs sit beside it in the artifact)."""
    return store.read_text(manifest["kind"], manifest["version"], "report.md")


def load_checks(store: ArtifactStore, manifest: dict[str, Any]) -> pl.DataFrame:
    """A run's release checks, one row per check (artifact, check, value, released, limit, rule, passed, blocking)."""
    return pl.DataFrame(manifest["metrics"]["results"], infer_schema_length=None)


def load_matrix(store: ArtifactStore, manifest: dict[str, Any]) -> MatrixArtifact:
    ref, names = store.ref(manifest["kind"], manifest["version"]), {f["name"] for f in manifest["files"]}
    return MatrixArtifact(read_matrix(ref), store.read_parquet(ref.kind, ref.version, "vocab.parquet"),
                          read_matrix(ref, "termdoc.parquet") if "termdoc.parquet" in names else None)


def load_embeddings(store: ArtifactStore, manifest: dict[str, Any]):
    """gensim `KeyedVectors`, words in frequency order, with their training counts."""
    from lexiflow.models.vectors import keyed_vectors

    words, counts, vectors = read_vectors(store.ref(manifest["kind"], manifest["version"]))
    return keyed_vectors(words, vectors, counts)


def load_evaluation(store: ArtifactStore, manifest: dict[str, Any]) -> EvaluationReport:
    kind, version = manifest["kind"], manifest["version"]
    return EvaluationReport(*(store.read_parquet(kind, version, f"{name}.parquet")
                              for name in ("metrics", "neighbours", "analogy_sections")),
                            store.read_text(kind, version, "report.md"))


def load_lm(store: ArtifactStore, manifest: dict[str, Any]):
    """A language model: the n-gram `NgramLM`, or a neural LM (a torch module in `.module_`)."""
    from lexiflow.models.lm import registry

    with local_folder(store, manifest) as folder:
        return registry.load(folder)


def load_tagger(store: ArtifactStore, manifest: dict[str, Any]):
    """The part-of-speech tagger (`.tag(words)`, `.tag_many(sentences)`): the HMM, or the BiLSTM (with its
    biLM when it uses ELMo features), by the kind the stage recorded (older artifacts: the HMM)."""
    with local_folder(store, manifest) as folder:
        if manifest["metrics"].get("model", "hmm") == "hmm":
            from lexiflow.models.hmm import HMMTagger

            return HMMTagger.load(folder)
        from lexiflow.models.neural_tagger import BiLSTMTagger

        return BiLSTMTagger.load(folder)


def load_elmo(store: ArtifactStore, manifest: dict[str, Any]):
    """The ELMo biLM (`.layers(sentences)`), the features of a `bilstm+elmo` tagger."""
    from lexiflow.models.elmo import BiLM

    with local_folder(store, manifest) as folder:
        return BiLM.load(folder)


def load_seq2seq(store: ArtifactStore, manifest: dict[str, Any]):
    """A trained `Translator` (`.translate(sentences, beam_width=..., return_attention=False)`)."""
    from lexiflow.models.seq2seq.translator import Translator

    with local_folder(store, manifest) as folder:
        return Translator.load(folder)


def load_encoder(store: ArtifactStore, manifest: dict[str, Any]):
    """The MLM-pretrained encoder (`MaskedLM`: `.model` the torch module, `.config`, `.metrics`)."""
    from lexiflow.models.encoder import MaskedLM

    with local_folder(store, manifest) as folder:
        return MaskedLM.load(folder)


def word_tokenizer_json(catalog: Catalog, manifest: dict[str, Any], dest: Path) -> list[Path]:
    """`tokenizer.json` for a word-level tokenizer (subword tokenizers save their own)."""
    config = catalog.store.read_json(manifest["kind"], manifest["version"], "config.json")
    if config.get("kind") != "word":
        return []
    path = dest / "tokenizer.json"
    path.write_text(load_tokenizer(catalog.store, manifest).to_hf_json(config["pattern"], catalog.lowercased(manifest)),
                    encoding="utf-8")
    return [path]


EXPORT_EXTRAS: dict[str, Extra] = {"tokenizer": word_tokenizer_json}  # `lexiflow artifacts export`: derived files

def load_finetuned(store: ArtifactStore, manifest: dict[str, Any]):
    """A fine-tuned classifier (`models.finetune.Classifier`, LoRA merged), with `.labels` and `.tokenizer` (its
    encoder's WordPiece) set."""
    from lexiflow.models.encoder import EncoderModel
    from lexiflow.models.finetune import Classifier
    from lexiflow.models.lm.train import load_module_tensors
    from safetensors.torch import load_file

    config = store.read_json(manifest["kind"], manifest["version"], "config.json")
    encoder = load(Catalog(store), "encoder", config["encoder"])
    model = Classifier(EncoderModel(encoder.config), "token" if config["task"] == "upos" else "sequence",
                       len(config["labels"]))
    with store.local_copy(manifest["kind"], manifest["version"], "classifier.safetensors") as path:
        load_module_tensors(model, load_file(str(path)), "classifier.safetensors")
    model.labels, model.tokenizer = config["labels"], encoder.tokenizer
    return model.eval()


LOADERS: dict[str, Loader] = {
    "tagger": load_tagger,
    "elmo": load_elmo,
    "corpus": table("documents.parquet"),
    "tagged_corpus": table("sentences.parquet"),
    "tokenizer": load_tokenizer,
    "tokenized_corpus": table("tokens.parquet"),
    "cooccurrence": load_matrix,
    "ppmi": load_matrix,
    "embeddings": load_embeddings,
    "evaluation": load_evaluation,
    "lm": load_lm,
    "encoder": load_encoder,
    "finetuned": load_finetuned,
    "parallel_corpus": table("pairs.parquet"),
    "seq2seq": load_seq2seq,
    "report": load_report,
    "checks": load_checks,
}


def load(catalog: Catalog | ArtifactStore | str | os.PathLike[str], kind: str, version: str | None = None) -> Any:
    """The artifact `kind:version` (the latest of the kind when version is None; `KIND@NAME`, as kind or version,
    the version an alias names: `Catalog.get`) as a natural object:
    polars DataFrames (corpus, tokenized_corpus), a tokenizer, scipy + polars (cooccurrence, ppmi),
    gensim `KeyedVectors` (embeddings), a language model, a tagger, ... (`LOADERS`)."""
    catalog = catalog if isinstance(catalog, Catalog) else Catalog(catalog)
    manifest = catalog.get(kind, version)
    if manifest["kind"] not in LOADERS:
        raise StoreError(f"no loader for {kind!r} artifacts (known: {', '.join(sorted(LOADERS))}); "
                         f"read its files under {manifest['path']}")
    return LOADERS[manifest["kind"]](catalog.store, manifest)


__all__ = ["EXPORT_EXTRAS", "LOADERS", "EvaluationReport", "MatrixArtifact", "load", "local_folder"]
