"""The `pipeline` flow and one flow per stage. Read top to bottom, like a recipe:

corpus → word vocabulary → tokenized corpus → co-occurrence → PPMI → embeddings → evaluation
                         ↘ (word or subword tokens) → language models ↗        → report

Every task returns a small `ArtifactRef`; data travels through the artifact store only.
"""

from __future__ import annotations

from lexiflow.flows.params import PipelineParams, TrainingParams, artifact_ref, validate
from lexiflow.flows.training import EMBEDDING_TRAINERS, LM_TRAINERS, TAGGER_TRAINERS, train
from lexiflow.models import ingest
from lexiflow.storage import ArtifactRef, ArtifactStore
from lexiflow.tasks.corpus import ingest_corpus, ingest_tagged
from lexiflow.tasks.embeddings import svd_embeddings
from lexiflow.tasks.evaluation import evaluate_embeddings
from lexiflow.tasks.matrices import compute_ppmi, count_cooccurrence
from lexiflow.tasks.params import (
    CooccurrenceParams,
    CorpusParams,
    ElmoParams,
    EmbeddingMethods,
    EvaluationParams,
    GloVeParams,
    LMKind,
    NeuralLMParams,
    NgramParams,
    ParallelParams,
    PPMIParams,
    SVDParams,
    TaggerParams,
    TokenizerParams,
    VocabularyParams,
    Word2VecParams,
)
from lexiflow.tasks.report import publish_report, write_report
from lexiflow.tasks.stage import published_manifest
from lexiflow.tasks.tagger import train_tagger
from lexiflow.tasks.vocabulary import encode_corpus, learn_subword, learn_vocabulary
from prefect import flow, get_run_logger


@flow(name="pipeline", log_prints=True)
def pipeline(
    store: str = "artifacts",
    corpus: CorpusParams = CorpusParams(),
    vocabulary: VocabularyParams = VocabularyParams(),
    cooccurrence: CooccurrenceParams = CooccurrenceParams(),
    ppmi: PPMIParams = PPMIParams(),
    embeddings: EmbeddingMethods = ["svd", "sgns"],  # noqa: B006 - a literal default for the UI form
    svd: SVDParams = SVDParams(),
    word2vec: Word2VecParams = Word2VecParams(),
    glove: GloVeParams = GloVeParams(),
    evaluation: EvaluationParams = EvaluationParams(),
    tokenizer: TokenizerParams = TokenizerParams(),
    lm: list[LMKind] = ["ngram"],  # noqa: B006 - Prefect needs a literal default for the UI form
    ngram: NgramParams = NgramParams(),
    neural: NeuralLMParams = NeuralLMParams(),
    tagger: TaggerParams = TaggerParams(),
    elmo: ElmoParams = ElmoParams(),
    training: TrainingParams = TrainingParams(),
    parallel: ParallelParams = ParallelParams(),
) -> dict[str, ArtifactRef]:
    """Build every artifact from the corpus sources; unchanged stages are reused, not recomputed.
    CoNLL-U sources also give a tagged corpus and a tagger per kind and tag set. Training stages run
    here, or on the `gpu` work pool when `training.remote` is set.

    Args:
        store: Artifact store shared by every worker: a folder or an fsspec URL (s3://...).
        corpus: Corpus sources and cleaning.
        vocabulary: Word-level vocabulary (counts, co-occurrence and embeddings use it).
        cooccurrence: Co-occurrence window, weighting and frequent-word subsampling.
        ppmi: Positive PMI smoothing and shift.
        embeddings: Embedding methods to train and evaluate side by side.
        svd: SVD (LSA) embeddings of the PPMI matrix.
        word2vec: Skip-gram / CBOW with negative sampling (gensim).
        glove: GloVe on the co-occurrence matrix (torch; CUDA when present).
        evaluation: Intrinsic evaluation of the embeddings.
        tokenizer: Tokens for the language models: words, BPE or WordPiece.
        lm: Language models to train.
        ngram: n-gram model settings.
        neural: Neural LM architecture and training settings.
        tagger: Part-of-speech taggers, HMM and/or neural (CoNLL-U sources only).
        elmo: The ELMo biLM trained on the corpus for the bilstm+elmo tagger.
        training: Where training stages run (this process, or the gpu work pool).
        parallel: How ingestion, vocabulary, encoding and co-occurrence shards run (threads, processes, a Dask
            cluster); results and versions do not depend on it.
    """
    validate(dict(locals()))  # deployed runs arrive without PipelineParams: its checks across sections, up front
    ArtifactStore(store).check_root()
    docs = ingest_corpus(store, params=corpus, parallel=parallel)
    words = learn_vocabulary(store, corpus=docs, params=vocabulary, parallel=parallel)
    word_ids = encode_corpus(store, corpus=docs, tokenizer=words, parallel=parallel)

    counts = count_cooccurrence(store, tokens=word_ids, tokenizer=words, params=cooccurrence, parallel=parallel)
    # Training stages run here, or on the gpu work pool when training.remote is set (flows/training.py).
    vectors: dict[str, ArtifactRef] = {}
    for method in embeddings:
        if method == "svd":
            pmi = compute_ppmi(store, cooccurrence=counts, params=ppmi)
            inputs, params = {"ppmi": pmi}, svd
        elif method == "glove":
            inputs, params = {"cooccurrence": counts}, glove
        else:
            inputs, params = {"corpus": docs, "tokenizer": words}, word2vec
        vectors[method] = train(EMBEDDING_TRAINERS[method], method, store, inputs, params, training)
    evaluations = {name: evaluate_embeddings(store, embeddings=ref, params=evaluation)
                   for name, ref in vectors.items()}

    lms = {}
    if lm:
        lm_tokenizer, lm_ids = words, word_ids
        if tokenizer.kind != "word":
            lm_tokenizer = learn_subword(store, corpus=docs, params=tokenizer)
            lm_ids = encode_corpus(store, corpus=docs, tokenizer=lm_tokenizer, parallel=parallel)
        for kind in lm:
            inputs = {"tokens": lm_ids, "tokenizer": lm_tokenizer,
                      "embeddings": None if kind == "ngram" else vectors.get(neural.pretrained)}
            lms[kind] = train(LM_TRAINERS[kind], kind, store, inputs, ngram if kind == "ngram" else neural, training)

    taggers, bilm = {}, None
    skipped = {s["source"] for s in published_manifest(docs)["metrics"].get("skipped", [])}
    if any(str(path) not in skipped for path in ingest.tagged_files(ingest.resolve_sources(corpus.sources))):
        tagged = ingest_tagged(store, params=corpus)
        if "bilstm+elmo" in tagger.kinds:
            bilm = train(TAGGER_TRAINERS["elmo"], "elmo", store, {"corpus": docs}, elmo, training)
        for kind in tagger.kinds:
            for column in tagger.columns:
                if kind == "hmm":  # CPU, seconds: always here
                    ref = train_tagger(store, tagged=tagged, column=column, params=tagger)
                else:
                    ref = train(TAGGER_TRAINERS[f"{kind}:{column}"], f"{kind}:{column}", store,
                                {"tagged": tagged, "elmo": bilm if kind == "bilstm+elmo" else None}, tagger, training)
                taggers[column if kind == "hmm" else f"{kind}.{column}"] = ref

    report = write_report(store, evaluations=list(evaluations.values()), lms=list(lms.values()) or None,
                          taggers=list(taggers.values()) or None)
    publish_report(report)
    refs = {"corpus": docs, "tokenizer": words, "tokenized_corpus": word_ids, "cooccurrence": counts,
            **({"ppmi": pmi} if "svd" in vectors else {}),
            **{f"embeddings.{k}": v for k, v in vectors.items()},
            **{f"evaluation.{k}": v for k, v in evaluations.items()},
            **{f"lm.{k}": v for k, v in lms.items()}, **{f"tagger.{k}": v for k, v in taggers.items()},
            **({"elmo": bilm} if bilm is not None else {}),
            "report": report}
    get_run_logger().info("pipeline: %s", ", ".join(f"{name}={ref.version}" for name, ref in refs.items()))
    return refs


def run_pipeline(params: PipelineParams) -> dict[str, ArtifactRef]:
    return pipeline(**{name: getattr(params, name) for name in PipelineParams.model_fields})


def _ref(store: str, kind: str, version: str) -> ArtifactRef:
    return artifact_ref(store, f"{kind}_version", kind, version)  # the flows below name inputs <kind>_version


# ---- one flow per stage, for running a single step on existing artifacts --------------------
@flow(name="ingest")
def ingest_flow(store: str = "artifacts", corpus: CorpusParams = CorpusParams(),
                parallel: ParallelParams = ParallelParams()) -> ArtifactRef:
    return ingest_corpus(store, params=corpus, parallel=parallel)


@flow(name="vocabulary")
def vocabulary_flow(store: str, corpus_version: str, vocabulary: VocabularyParams = VocabularyParams(),
                    parallel: ParallelParams = ParallelParams()) -> dict:
    docs = _ref(store, "corpus", corpus_version)
    tokenizer = learn_vocabulary(store, corpus=docs, params=vocabulary, parallel=parallel)
    return {"tokenizer": tokenizer,
            "tokenized_corpus": encode_corpus(store, corpus=docs, tokenizer=tokenizer, parallel=parallel)}


@flow(name="cooccurrence")
def cooccurrence_flow(store: str, tokenized_corpus_version: str, tokenizer_version: str,
                      cooccurrence: CooccurrenceParams = CooccurrenceParams(),
                      parallel: ParallelParams = ParallelParams()) -> ArtifactRef:
    return count_cooccurrence(store, tokens=_ref(store, "tokenized_corpus", tokenized_corpus_version),
                              tokenizer=_ref(store, "tokenizer", tokenizer_version), params=cooccurrence,
                              parallel=parallel)


@flow(name="ppmi")
def ppmi_flow(store: str, cooccurrence_version: str, ppmi: PPMIParams = PPMIParams()) -> ArtifactRef:
    return compute_ppmi(store, cooccurrence=_ref(store, "cooccurrence", cooccurrence_version), params=ppmi)


@flow(name="svd")
def svd_flow(store: str, ppmi_version: str, svd: SVDParams = SVDParams()) -> ArtifactRef:
    return svd_embeddings(store, ppmi=_ref(store, "ppmi", ppmi_version), params=svd)


@flow(name="evaluate")
def evaluate_flow(store: str, embeddings_version: str, evaluation: EvaluationParams = EvaluationParams()
                  ) -> ArtifactRef:
    return evaluate_embeddings(store, embeddings=_ref(store, "embeddings", embeddings_version), params=evaluation)
