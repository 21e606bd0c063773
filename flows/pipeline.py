"""The `pipeline` flow and one flow per stage. Read top to bottom, like a recipe:

corpus → tokenizer → tokenized corpus → co-occurrence → PPMI → SVD embeddings → evaluation

Every task returns a small `ArtifactRef`; data travels through the artifact store only.
"""

from __future__ import annotations

from prefect import flow, get_run_logger

from flows.params import PipelineParams, TrainingParams
from flows.training import train_embeddings_stage
from storage import ArtifactRef, ArtifactStore
from tasks.corpus import ingest_corpus
from tasks.embeddings import svd_embeddings
from tasks.evaluation import evaluate_embeddings, publish_report
from tasks.matrices import compute_ppmi, count_cooccurrence
from tasks.params import (
    CooccurrenceParams,
    CorpusParams,
    EvaluationParams,
    PPMIParams,
    SVDParams,
    VocabularyParams,
)
from tasks.vocabulary import encode_corpus, learn_vocabulary


@flow(name="pipeline", log_prints=True)
def pipeline(
    store: str = "artifacts",
    corpus: CorpusParams = CorpusParams(),
    vocabulary: VocabularyParams = VocabularyParams(),
    cooccurrence: CooccurrenceParams = CooccurrenceParams(),
    ppmi: PPMIParams = PPMIParams(),
    svd: SVDParams = SVDParams(),
    evaluation: EvaluationParams = EvaluationParams(),
    training: TrainingParams = TrainingParams(),
) -> dict[str, ArtifactRef]:
    """Build every artifact from the corpus sources; unchanged stages are reused, not recomputed.
    Training stages run here, or on the `gpu` work pool when `training.remote` is set.

    Args:
        store: Artifact store shared by every worker: a folder or an fsspec URL (s3://...).
        corpus: Corpus sources and cleaning.
        vocabulary: Word-level vocabulary (the tokenizer).
        cooccurrence: Co-occurrence window and weighting.
        ppmi: Positive PMI smoothing and shift.
        svd: SVD embeddings.
        evaluation: Intrinsic evaluation of the embeddings.
        training: Where training stages run (this process, or the gpu work pool).
    """
    docs = ingest_corpus(store, params=corpus)
    tokenizer = learn_vocabulary(store, corpus=docs, params=vocabulary)
    tokens = encode_corpus(store, corpus=docs, tokenizer=tokenizer)
    counts = count_cooccurrence(store, tokens=tokens, tokenizer=tokenizer, params=cooccurrence)
    pmi = compute_ppmi(store, cooccurrence=counts, params=ppmi)
    vectors = train_embeddings_stage(store, {"ppmi": pmi}, svd, training)
    report = evaluate_embeddings(store, embeddings=vectors, params=evaluation)
    publish_report([report])
    refs = {"corpus": docs, "tokenizer": tokenizer, "tokenized_corpus": tokens, "cooccurrence": counts,
            "ppmi": pmi, "embeddings": vectors, "evaluation": report}
    get_run_logger().info("pipeline: %s", ", ".join(f"{name}={ref.version}" for name, ref in refs.items()))
    return refs


def run_pipeline(params: PipelineParams) -> dict[str, ArtifactRef]:
    return pipeline(**{name: getattr(params, name) for name in PipelineParams.model_fields})


def _ref(store: str, kind: str, version: str) -> ArtifactRef:
    store_obj = ArtifactStore(store)
    if not store_obj.exists(kind, version):
        raise ValueError(f"no {kind} artifact with version {version} in {store}")
    return store_obj.ref(kind, version)


# ---- one flow per stage, for running a single step on existing artifacts --------------------
@flow(name="ingest")
def ingest_flow(store: str = "artifacts", corpus: CorpusParams = CorpusParams()) -> ArtifactRef:
    return ingest_corpus(store, params=corpus)


@flow(name="vocabulary")
def vocabulary_flow(store: str, corpus_version: str, vocabulary: VocabularyParams = VocabularyParams()) -> dict:
    docs = _ref(store, "corpus", corpus_version)
    tokenizer = learn_vocabulary(store, corpus=docs, params=vocabulary)
    return {"tokenizer": tokenizer, "tokenized_corpus": encode_corpus(store, corpus=docs, tokenizer=tokenizer)}


@flow(name="cooccurrence")
def cooccurrence_flow(store: str, tokenized_corpus_version: str, tokenizer_version: str,
                      cooccurrence: CooccurrenceParams = CooccurrenceParams()) -> ArtifactRef:
    return count_cooccurrence(store, tokens=_ref(store, "tokenized_corpus", tokenized_corpus_version),
                              tokenizer=_ref(store, "tokenizer", tokenizer_version), params=cooccurrence)


@flow(name="ppmi")
def ppmi_flow(store: str, cooccurrence_version: str, ppmi: PPMIParams = PPMIParams()) -> ArtifactRef:
    return compute_ppmi(store, cooccurrence=_ref(store, "cooccurrence", cooccurrence_version), params=ppmi)


@flow(name="svd")
def svd_flow(store: str, ppmi_version: str, svd: SVDParams = SVDParams()) -> ArtifactRef:
    return svd_embeddings(store, ppmi=_ref(store, "ppmi", ppmi_version), params=svd)


@flow(name="evaluate")
def evaluate_flow(store: str, embeddings_version: str, evaluation: EvaluationParams = EvaluationParams()
                  ) -> ArtifactRef:
    report = evaluate_embeddings(store, embeddings=_ref(store, "embeddings", embeddings_version), params=evaluation)
    publish_report([report])
    return report
