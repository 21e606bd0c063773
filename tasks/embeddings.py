"""Embedding stages, one `embeddings` artifact per method: `vectors.parquet` (id, word, count,
vector), the word2vec text (`vectors.txt`) and binary (`vectors.bin`) exports gensim loads, and for
trained methods `history.parquet` and `loss_curve.png`."""

from __future__ import annotations

import logging

import numpy as np
import polars as pl
import pyarrow as pa
from lexiflow.models.errors import InputError, ParameterError
from lexiflow.storage import ArtifactRef, ArtifactStore, ArtifactWriter, Catalog
from lexiflow.storage.formats import read_manifest, read_matrix, read_table, read_vectors, write_vectors
from lexiflow.storage.manifests import VERSION_PATTERN
from lexiflow.tasks.params import GloVeParams, LSIParams, SVDParams, Word2VecParams
from lexiflow.tasks.stage import HOW_FIELDS, split_arguments, stage

# The model modules import torch or gensim: the functions that use them import them (a cached run imports none).

logger = logging.getLogger("lexiflow.embeddings")


def write_embeddings(out: ArtifactWriter, vocabulary: pl.DataFrame, word_vectors: np.ndarray, method: str,
                     history: list[dict] | None = None, context_vectors: np.ndarray | None = None) -> None:
    """Words (specials excluded) in frequency order, as Parquet and both word2vec formats; a method with
    two vector sets (word2vec's input u and output v) also exports v as `context_vectors.bin`."""
    from lexiflow.models import embedding_plots, vectors, vocab

    n_special = len(vocab.SPECIALS)
    words = vocabulary["token"].to_list()[n_special:]
    counts = vocabulary["count"].to_numpy()[n_special:]
    matrix = word_vectors[n_special:]
    write_vectors(out, vocabulary["id"].to_numpy()[n_special:], words, counts, matrix)
    kv = vectors.keyed_vectors(words, matrix, counts)
    vectors.save_text(kv, str(out.path("vectors.txt")))
    kv.save_word2vec_format(str(out.path("vectors.bin")), binary=True)
    if context_vectors is not None:
        vectors.keyed_vectors(words, context_vectors[n_special:], counts).save_word2vec_format(
            str(out.path("context_vectors.bin")), binary=True)
    out.metrics.update({"method": method, "words": len(words), "dim": int(matrix.shape[1])})
    if history:
        out.write_parquet("history.parquet", pl.DataFrame(history))
        embedding_plots.plot_loss(history, out.path("loss_curve.png"), title=f"{method} training loss")
        out.metrics.update({f"final_{k}": float(v) for k, v in history[-1].items() if k.endswith("loss")})
        seconds = sum(h["seconds"] for h in history)
        # total work over total time (a per-epoch rate times its seconds is that epoch's work)
        out.metrics.update({"epochs": len(history),
                            **{k: sum(h[k] * h["seconds"] for h in history) / max(seconds, 1e-12)
                               for k in ("words_per_s", "cells_per_s") if k in history[0]}})


def warm_start_source(store: str, ppmi: ArtifactRef, params: SVDParams) -> str | None:
    """The version of the newest SVD embeddings in the store with these parameters (warm start aside) made from
    another PPMI matrix, or None: what `svd.warm_start` starts from."""
    wanted = params.model_dump(mode="json", exclude=HOW_FIELDS | {"warm_start"})
    found = [m for m in Catalog(ArtifactStore(store)).list("embeddings")
             if m["metrics"].get("method") == "svd" and m["inputs"].get("ppmi", {}).get("version") != ppmi.version
             and {k: v for k, v in m["parameters"].get("params", {}).items() if k != "warm_start"} == wanted]
    return found[-1]["version"] if found else None


def svd_parameters(arguments: dict) -> dict:
    """The SVD's versioned parameters; with `warm_start`, the embeddings it starts from too (a warm-started
    SVD is not the cold one: its version says from which)."""
    params = arguments["params"]
    described = {"params": params.model_dump(mode="json", exclude=HOW_FIELDS)}
    if params.warm_start:
        described["warm_start_from"] = warm_start_source(arguments["store"], arguments["ppmi"], params)
    return described


def in_vocabulary_order(words: list[str], values: np.ndarray, vocabulary: pl.DataFrame, fill: float) -> np.ndarray:
    """An earlier artifact's rows (`values`, one per word of `words`) in this vocabulary's row order (float32),
    `fill` in the rows of words it lacks: where a warm start or a continued training starts."""
    index = {word: i for i, word in enumerate(words)}
    rows = np.array([index.get(token, -1) for token in vocabulary["token"].to_list()], dtype=np.int64)
    out = np.full((vocabulary.height, *values.shape[1:]), fill, dtype=np.float32)
    out[rows >= 0] = values[rows[rows >= 0]]
    return out


def warm_start_basis(store: str, version: str, vocabulary: pl.DataFrame) -> np.ndarray:
    """The earlier embeddings' vectors in this vocabulary's row order (zero rows for words they lack)."""
    words, _counts, earlier = read_vectors(ArtifactStore(store).ref("embeddings", version))
    return in_vocabulary_order(words, earlier, vocabulary, 0.0)


@stage("embeddings", parameters=svd_parameters)
def svd_embeddings(out: ArtifactWriter, ppmi: ArtifactRef, params: SVDParams) -> None:
    import torch
    from lexiflow.models import device, svd

    vocabulary = read_table(ppmi, "vocab.parquet")
    source = warm_start_source(getattr(out, "store_url", None) or ppmi.store, ppmi, params) \
        if params.warm_start else None
    start = warm_start_basis(getattr(out, "store_url", None) or ppmi.store, source, vocabulary) if source else None
    word_vectors, singular_values = svd.svd_vectors(read_matrix(ppmi), params.dim, params.power, params.add_context,
                                                    params.n_iter, params.seed, params.threads,
                                                    progress=out.progress, start=start)
    write_embeddings(out, vocabulary, word_vectors, "svd")
    if source:
        out.metrics["warm_start_from"] = source
    out.metrics["device"] = device.describe(torch.device("cpu"), "fp32")  # scikit-learn, where the flow runs
    out.metrics["top_singular_value"] = float(singular_values[0])


@stage("embeddings")
def lsi_embeddings(out: ArtifactWriter, cooccurrence: ArtifactRef, params: LSIParams) -> None:
    """LSI: truncated SVD of the (tf-idf or count) term-document matrix the cooccurrence stage writes.
    Its rank is at most the number of documents: a larger `dim` is lowered to it (logged, `dim` in the
    metrics is the one used), since a corpus of few long documents is a normal input, not an error."""
    from lexiflow.models import lsi, svd

    termdoc = lsi.weigh(read_matrix(cooccurrence, "termdoc.parquet"), params.weighting)
    dim = min(params.dim, min(termdoc.shape) - 1)
    if dim < params.dim:
        logger.warning("lsi.dim=%d: the term-document matrix has %d documents, so LSI uses %d dimensions",
                       params.dim, termdoc.shape[1], dim)
    word_vectors, singular_values = svd.svd_vectors(termdoc, dim, params.power, params.add_context,
                                                    params.n_iter, params.seed)
    write_embeddings(out, read_table(cooccurrence, "vocab.parquet"), word_vectors, "lsi")
    out.metrics.update({"top_singular_value": float(singular_values[0]), "documents": termdoc.shape[1],
                        "dim_requested": params.dim})


def continued_source(store: str, name: str, method: str, dim: int) -> str:
    """The embeddings version `continue_from` names (a version, or a release alias), checked to be `method`
    embeddings of `dim` dimensions."""
    catalog = Catalog(ArtifactStore(store))
    version = name if VERSION_PATTERN.fullmatch(name) else catalog.released("embeddings", name)
    if version is None or not catalog.store.exists("embeddings", version):
        raise ParameterError(f"{method}.continue_from={name!r}: no embeddings version or release alias of that name "
                             f"in {store}; `lexiflow artifacts list --kind embeddings` lists them")
    metrics = catalog.get("embeddings", version)["metrics"]
    if (metrics.get("method"), metrics.get("dim")) != (method, dim):
        raise ParameterError(f"{method}.continue_from={name!r}: embeddings:{version} are {metrics.get('method')} "
                             f"vectors of {metrics.get('dim')} dimensions, not {method} of {dim}: name {method} "
                             f"embeddings of dim {dim}, or leave continue_from empty")
    return version


def continued_parameters(arguments: dict) -> dict:
    """A trained method's versioned parameters; with `continue_from`, the version it names (an alias moves on)."""
    params = split_arguments(arguments)[1]
    section = arguments["params"]
    if section.continue_from:
        params["params"]["continue_from"] = continued_source(
            arguments["store"], section.continue_from, arguments.get("method", "glove"), section.dim)
    return params


def continued_vectors(store: str, version: str, vocabulary: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """word2vec embeddings' input (u) and output (v) vectors in this vocabulary's row order, NaN rows for words
    they lack (u too where they kept only v)."""
    from gensim.models import KeyedVectors

    ref = ArtifactStore(store).ref("embeddings", version)
    words, _counts, vectors = read_vectors(ref)
    with ArtifactStore(store).local_copy("embeddings", version, "context_vectors.bin") as path:
        context = KeyedVectors.load_word2vec_format(str(path), binary=True)
    v = context.vectors[[context.key_to_index[w] for w in words]]
    which = read_manifest(ref)["metrics"].get("vectors", "u")
    u = vectors if which == "u" else vectors - v if which == "u+v" else np.full_like(v, np.nan)
    return in_vocabulary_order(words, u, vocabulary, np.nan), in_vocabulary_order(words, v, vocabulary, np.nan)


@stage("embeddings", parameters=continued_parameters)
def word2vec_embeddings(out: ArtifactWriter, corpus: ArtifactRef, tokenizer: ArtifactRef, method: str,
                        params: Word2VecParams) -> None:
    """Skip-gram (`sgns`) or CBOW (`cbow`) through gensim, streaming the corpus artifact's train text
    (one record batch in memory at a time; held-out text never reaches vectors that may initialise a
    language model) on our word vocabulary."""
    import torch
    from lexiflow.models import device, vocab, word2vec

    kind = read_manifest(tokenizer)["metrics"].get("kind")
    if kind != "word":  # a subword vocabulary would leave nearly every corpus word unknown
        raise InputError(f"inputs.tokenizer={tokenizer.version}: a {kind} tokenizer; {method} learns word vectors, "
                         "give it the word vocabulary's version "
                         "(`lexiflow artifacts list --kind tokenizer`, kind word)")
    vocabulary = vocab.Vocabulary(read_table(tokenizer, "vocab.parquet"))
    model = word2vec.Word2Vec(sg=method == "sgns", **params.model_dump(exclude={"continue_from"}))
    store = getattr(out, "store_url", None) or corpus.store
    source = continued_source(store, params.continue_from, method, params.dim) if params.continue_from else None
    start = continued_vectors(store, source, vocabulary.frame) if source else None
    with ArtifactStore(corpus.store).local_copy(corpus.kind, corpus.version, "documents.parquet") as path:
        model.fit(word2vec.ParquetSentences(path, column="text", split="train"), vocabulary,
                  progress=out.progress, start=start)
    write_embeddings(out, vocabulary.frame, model.vectors_, method, model.history_, model.output_vectors_)
    out.metrics["vectors"] = params.vectors
    if source:
        out.metrics["continued_from"] = source
    out.metrics["device"] = device.describe(torch.device("cpu"), "fp32")  # gensim trains on the CPU


GLOVE_STATE = ("w", "w_context", "b", "b_context")  # glove_state.parquet's columns beside `token`


def glove_state(store: str, version: str, vocabulary: pl.DataFrame) -> list[np.ndarray]:
    """GloVe embeddings' w, w̃, b, b̃ (`glove_state.parquet`) in this vocabulary's row order, NaN rows for words
    they lack."""
    if "glove_state.parquet" not in {f["name"] for f in ArtifactStore(store).manifest("embeddings", version)["files"]}:
        raise ParameterError(f"glove.continue_from: embeddings:{version} were made before GloVe kept its state "
                             "(glove_state.parquet); continue from a newer version, or leave continue_from empty")
    state = read_table(ArtifactStore(store).ref("embeddings", version), "glove_state.parquet")
    words = state["token"].to_list()
    return [in_vocabulary_order(words, state[name].to_numpy(), vocabulary, np.nan) for name in GLOVE_STATE]


@stage("embeddings", parameters=continued_parameters)
def glove_embeddings(out: ArtifactWriter, cooccurrence: ArtifactRef, params: GloVeParams) -> None:
    """GloVe on the co-occurrence artifact (on CUDA when the worker has one). Its speed is given in
    cells/s and, comparable with word2vec's, in corpus words/s: the train split's words (every one, in
    the vocabulary or not, as word2vec counts them) per second of an epoch. Its parameters w, w̃, b, b̃ are
    kept (`glove_state.parquet`) for a later build to continue from (`glove.continue_from`)."""
    import torch
    from lexiflow.models import device, glove

    vocabulary = read_table(cooccurrence, "vocab.parquet")
    store = getattr(out, "store_url", None) or cooccurrence.store
    source = continued_source(store, params.continue_from, "glove", params.dim) if params.continue_from else None
    model = glove.GloVe(**params.model_dump(exclude={"continue_from"})).fit(
        read_matrix(cooccurrence), progress=out.progress, start=glove_state(store, source, vocabulary) if source
        else None)
    n_tokens = read_manifest(cooccurrence)["metrics"]["corpus_tokens"]
    history = [{**h, "words_per_s": n_tokens / max(h["seconds"], 1e-12)} for h in model.history_]
    write_embeddings(out, vocabulary, model.vectors_, "glove", history)
    state = {name: pa.FixedSizeListArray.from_arrays(pa.array(array.ravel()), params.dim) if array.ndim == 2
             else pa.array(array) for name, array in zip(GLOVE_STATE, model.state_, strict=True)}
    out.write_parquet("glove_state.parquet", pa.table({"token": pa.array(vocabulary["token"].to_list(), pa.string()),
                                                       **state}))
    out.metrics["device"] = device.describe(torch.device(model.device_), "fp32")
    if source:
        out.metrics["continued_from"] = source
