"""The pipeline's parameter form: one nested section per stage (see tasks/params.py)."""

from __future__ import annotations

import inspect
from typing import Any

from lexiflow.flows.training_kinds import TRAINING_FLOWS
from lexiflow.models.errors import ParameterError
from lexiflow.storage import ArtifactRef, Catalog, StoreError
from lexiflow.storage.store import DEFAULT_ROOT
from lexiflow.tasks.params import (
    ChecksParams,
    CooccurrenceParams,
    CorpusParams,
    ElmoParams,
    EmbeddingMethods,
    EvaluationParams,
    FineTuneParams,
    GloVeParams,
    LMKind,
    LSIParams,
    NeuralLMParams,
    NgramParams,
    ParallelParams,
    Params,
    PPMIParams,
    PretrainParams,
    ReleaseParams,
    Seq2SeqParams,
    SVDParams,
    TaggerParams,
    TokenizerParams,
    TranslationCorpusParams,
    VocabularyParams,
    Word2VecParams,
)
from pydantic import Field, ValidationError, create_model, model_validator


class TrainingSettings(Params):
    remote: bool = Field(False, description="Hand the training stages (embeddings and language models) to the `gpu` "
                                            "work pool with run_deployment and continue with the artifact they "
                                            "publish in the store; off: the same stages run in this process.")
    timeout_minutes: float = Field(240, gt=0, le=10_080, description="How long to wait for a remote training run.")

    def deployment(self, kind: str) -> str:
        """The deployment that trains artifacts of `kind` (embeddings, lm, seq2seq, tagger, elmo, encoder,
        finetuned) remotely: `<family>_deployment` of its training flow (flows/training_kinds.py)."""
        family = next(spec.family for spec in TRAINING_FLOWS if kind in spec.kinds)
        return getattr(self, f"{family}_deployment")


# One `<family>_deployment` setting per training flow, from the table of trainer kinds.
TrainingParams = create_model(
    "TrainingParams", __base__=TrainingSettings, __module__=__name__,
    **{f"{spec.family}_deployment": (str, Field(f"{spec.name}/{spec.name}", pattern=r"^[^/]+/[^/]+$",
                                                description=f"The FLOW/DEPLOYMENT that trains {spec.what}, "
                                                            "remotely."))
       for spec in TRAINING_FLOWS})


class PipelineParams(Params):
    """Every parameter of the `pipeline` flow, one section per stage: the flow's signature, its UI
    form, `--set` names and config files all derive from this class (`flow_signature`)."""

    # The form's order (Prefect's follows the signature): what a run changes most often first (the corpus, the
    # methods, releasing), then each stage's settings in the recipe's order; how it runs and the checks last.
    store: str = Field(DEFAULT_ROOT, min_length=1, description="Artifact store shared by every worker: a folder or "
                                                              "an fsspec URL (s3://...).")
    corpus: CorpusParams = Field(CorpusParams(), description="Corpus sources and cleaning.")
    embeddings: EmbeddingMethods = Field(
        default=["svd", "sgns"],
        description="Embedding methods, each its own artifact, evaluated side by side: svd, lsi, sgns, cbow, glove.")
    lm: list[LMKind] = Field(default=["ngram"], description="Language models to train, each its own artifact: "
                                                           "ngram, ffnn, rnn, lstm, gru, transformer.")
    release: ReleaseParams = Field(ReleaseParams(), description="Whether this run releases its artifacts (moves "
                                                                "their alias) when every blocking check passes.")
    vocabulary: VocabularyParams = Field(VocabularyParams(), description="Word-level vocabulary (counts, "
                                                                         "co-occurrence and embeddings use it).")
    cooccurrence: CooccurrenceParams = Field(CooccurrenceParams(), description="Co-occurrence window, weighting and "
                                                                               "frequent-word subsampling.")
    ppmi: PPMIParams = Field(PPMIParams(), description="Positive PMI smoothing and shift.")
    svd: SVDParams = Field(SVDParams(), description="SVD (LSA) embeddings of the PPMI matrix.")
    lsi: LSIParams = Field(LSIParams(), description="LSI: SVD of the tf-idf (or count) term-document matrix.")
    word2vec: Word2VecParams = Field(Word2VecParams(), description="Skip-gram / CBOW with negative sampling "
                                                                   "(gensim).")
    glove: GloVeParams = Field(GloVeParams(), description="GloVe on the co-occurrence matrix (torch; CUDA when "
                                                          "present).")
    evaluation: EvaluationParams = Field(EvaluationParams(), description="Intrinsic evaluation of the embeddings.")
    tokenizer: TokenizerParams = Field(TokenizerParams(), description="Tokens for the language models: words, BPE "
                                                                      "or WordPiece.")
    ngram: NgramParams = Field(NgramParams(), description="n-gram model settings.")
    neural: NeuralLMParams = Field(NeuralLMParams(), description="Neural LM architecture and training settings.")
    tagger: TaggerParams = Field(TaggerParams(), description="Part-of-speech taggers, HMM and/or neural (CoNLL-U "
                                                             "sources only).")
    elmo: ElmoParams = Field(ElmoParams(), description="The ELMo biLM trained on the corpus for the bilstm+elmo "
                                                       "tagger.")
    translation: TranslationCorpusParams = Field(TranslationCorpusParams(), description="Parallel (source, target) "
                                                 "sources; when given, the translation stages run.")
    seq2seq: Seq2SeqParams = Field(Seq2SeqParams(), description="Translation models (RNN encoder-decoder with "
                                                                "attention, Transformer) and their training.")
    pretrain: PretrainParams = Field(PretrainParams(), description="The BERT-style encoder and its masked-LM "
                                                                   "pretraining on the corpus (runs when "
                                                                   "finetune.tasks is not empty).")
    finetune: FineTuneParams = Field(FineTuneParams(), description="Fine-tuning the encoder on the tagged corpus: "
                                                                   "tasks (upos, genre) and modes (scratch, frozen, "
                                                                   "full, adapters, lora).")
    training: TrainingParams = Field(TrainingParams(), description="Where training stages run (this process, or "
                                                                   "the gpu work pool).")
    parallel: ParallelParams = Field(ParallelParams(), description="How ingestion, vocabulary, encoding and "
                                                                   "co-occurrence shards run (threads, processes, a "
                                                                   "Dask cluster); results and versions do not "
                                                                   "depend on it.")
    checks: ChecksParams = Field(ChecksParams(), description="Quality checks of each artifact against the released "
                                                             "version (thresholds; first builds: floors).")

    @model_validator(mode="after")
    def _combinations_work(self) -> PipelineParams:
        """Reject combinations of sections that would otherwise fail only after most of the work."""
        n, problems = self.neural, []
        if "transformer" in self.lm and n.d_model % n.n_heads:
            problems.append(f"neural.n_heads={n.n_heads} does not divide neural.d_model={n.d_model}: the "
                            f"transformer splits d_model across its heads; pick values with d_model % n_heads == 0")
        rnns = [kind for kind in self.lm if kind in ("rnn", "lstm", "gru")]
        if rnns and n.tie_weights and n.hidden_dim != n.emb_dim:
            problems.append(f"neural.tie_weights=true needs neural.hidden_dim == neural.emb_dim for {', '.join(rnns)} "
                            f"(got {n.hidden_dim} and {n.emb_dim}): make them equal or set neural.tie_weights=false")
        g = self.ngram
        if "ngram" in self.lm and g.smoothing == "kneser_ney" and g.order < 2:
            problems.append(f"ngram.order={g.order} with ngram.smoothing=kneser_ney: Kneser-Ney needs "
                            f"ngram.order >= 2; raise the order or set ngram.smoothing=add_k or mle")
        neural_lms = [kind for kind in self.lm if kind != "ngram"]
        if neural_lms and n.batch_size % n.world_size:
            problems.append(f"neural.batch_size={n.batch_size} is not divisible by neural.world_size={n.world_size}: "
                            f"the global batch is split evenly across the ranks; use a multiple of world_size")
        if n.pretrained != "none" and neural_lms:  # without a neural LM, pretrained has nothing to initialise
            section = {"svd": "svd", "lsi": "lsi", "glove": "glove"}.get(n.pretrained, "word2vec")
            have = getattr(self, section).dim
            if n.pretrained not in self.embeddings:
                problems.append(f"neural.pretrained={n.pretrained}: not among embeddings ({', '.join(self.embeddings)})"
                                f"; add it to embeddings or set neural.pretrained=none")
            for kind in neural_lms if n.pretrained in self.embeddings else []:
                name, need = ("d_model", n.d_model) if kind == "transformer" else ("emb_dim", n.emb_dim)
                if have != need:
                    problems.append(f"neural.pretrained={n.pretrained}: its vectors have {section}.dim={have} "
                                    f"dimensions, the {kind} LM needs neural.{name}={need}: make them equal")
        neural_taggers = [kind for kind in self.tagger.kinds if kind != "hmm"]
        if self.tagger.pretrained != "none" and neural_taggers and self.tagger.pretrained not in self.embeddings:
            problems.append(f"tagger.pretrained={self.tagger.pretrained}: not among embeddings "
                            f"({', '.join(self.embeddings)}); add it to embeddings or set tagger.pretrained=none")
        t = self.pretrain
        if self.finetune.tasks and t.d_model % t.n_heads:
            problems.append(f"pretrain.n_heads={t.n_heads} does not divide pretrain.d_model={t.d_model}: pick values "
                            "with d_model % n_heads == 0")
        s = self.seq2seq
        if self.translation.sources and "transformer" in s.models and s.d_model % s.n_heads:
            problems.append(f"seq2seq.n_heads={s.n_heads} does not divide seq2seq.d_model={s.d_model}: pick values "
                            "with d_model % n_heads == 0")
        if problems:
            raise ParameterError("; ".join(problems))
        return self


def flow_signature(params: type[Params]) -> inspect.Signature:
    """A flow's signature from its parameter model: one keyword per field, with the field's type and
    default (Prefect builds the UI form and validates runs from the signature)."""
    return inspect.Signature([
        inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=field.rebuild_annotation(),
                          default=field.get_default(call_default_factory=True))
        for name, field in params.model_fields.items()])


def args_doc(params: type[Params]) -> str:
    """The Google-style `Args:` block of a flow's docstring from its parameter model's descriptions
    (Prefect shows them in the UI form)."""
    return "Args:\n" + "".join(f"    {name}: {field.description}\n" for name, field in params.model_fields.items())


def artifact_ref(store: str, parameter: str, kind: str, version: str | None) -> ArtifactRef:
    """The artifact a flow parameter names by version ("latest" or None: the newest of its kind); a
    ParameterError naming the parameter when the store has none such."""
    try:
        return Catalog(store).ref(kind, None if version in (None, "latest") else version)
    except StoreError as exc:
        raise ParameterError(f"{parameter}: {exc}") from None


def validate(tree: dict[str, Any]) -> PipelineParams:
    """PipelineParams from nested values; errors name the dotted parameter and what is wrong."""
    try:
        return PipelineParams.model_validate(tree)
    except ValidationError as exc:
        problems = "; ".join(_problem(e) for e in exc.errors())
        raise ParameterError(f"invalid pipeline parameters: {problems}") from None


def _problem(error: dict[str, Any]) -> str:
    cause = error.get("ctx", {}).get("error")
    if isinstance(cause, ParameterError):  # a check across sections: its message names the parameters
        return str(cause)
    return f"{'.'.join(map(str, error['loc']))}: {error['msg']}"
