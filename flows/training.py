"""Training flows, deployed on the `gpu` work pool, and the hand-off that runs them there or here.

`train-embeddings`, `train-lm`, `train-seq2seq` and `train-tagger` (neural taggers and the ELMo biLM) each
run one training stage on artifacts already in the store.
The pipeline calls `train(...)`: with `training.remote` it starts the training deployment with
`run_deployment` (a worker of the `gpu` pool picks it up), waits, and continues with the artifact
that run published; otherwise it runs the same stage in its own process. Either way the artifact
travels through the shared store, never through Prefect results: the version of the artifact is
known before the run starts (a hash of its inputs, parameters and code, see tasks/stage.py), so the
pipeline looks it up in the store afterwards. The store must therefore be reachable from the GPU
workers under the same name (a shared path or an object-store URL).

`pretrain` and `finetune` do the same for the BERT-style encoder and its fine-tuned classifiers.
A new trainer is one line in `EMBEDDING_TRAINERS`, `LM_TRAINERS`, `SEQ2SEQ_TRAINERS`, `TAGGER_TRAINERS`,
`PRETRAIN_TRAINERS` or `FINETUNE_TRAINERS` (plus, for a new parameter section, one parameter of the flow).
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass, field
from typing import Any, get_args

from lexiflow.flows.params import TrainingParams, artifact_ref
from lexiflow.models.device import gpu_warning
from lexiflow.models.errors import ParameterError
from lexiflow.storage import ArtifactRef, ArtifactStore, StoreError
from lexiflow.storage.formats import read_manifest
from lexiflow.tasks.elmo import train_elmo
from lexiflow.tasks.embeddings import glove_embeddings, lsi_embeddings, svd_embeddings, word2vec_embeddings
from lexiflow.tasks.lm import train_lm as lm_stage
from lexiflow.tasks.params import (
    ElmoParams,
    EmbeddingMethod,
    FineTuneMode,
    FineTuneParams,
    FineTuneTask,
    GloVeParams,
    LMKind,
    LSIParams,
    NeuralLMParams,
    NgramParams,
    PretrainParams,
    Seq2SeqKind,
    Seq2SeqParams,
    SVDParams,
    TaggerParams,
    Word2VecParams,
)
from lexiflow.tasks.pretraining import finetune as finetune_stage
from lexiflow.tasks.pretraining import pretrain as pretrain_stage
from lexiflow.tasks.stage import looking_up, published_manifest
from lexiflow.tasks.tagger import train_tagger
from lexiflow.tasks.translation import train_seq2seq as seq2seq_stage
from prefect import flow, get_run_logger
from prefect.deployments import run_deployment
from pydantic import BaseModel

log = logging.getLogger("lexiflow.training")


@dataclass(frozen=True)
class Trainer:
    """A training stage: the `@stage` task, its input artifacts (argument name → kind; `optional`
    ones only when given), the flow parameter holding its pydantic parameters, and fixed arguments."""

    stage: Any
    inputs: dict[str, str]
    section: str
    fixed: dict[str, str] = field(default_factory=dict)
    optional: dict[str, str] = field(default_factory=dict)
    gpu: bool = True  # benefits from a GPU: `training.remote` hands it to the gpu pool; else it runs here

    @property
    def kind(self) -> str:
        return self.stage.name


# SVD (scikit-learn), word2vec (gensim) and n-gram counting run on CPUs only: with `training.remote` they
# stay where the flow runs instead of queueing behind the gpu worker's limit of one run.
EMBEDDING_TRAINERS: dict[str, Trainer] = {
    "svd": Trainer(svd_embeddings, {"ppmi": "ppmi"}, "svd", gpu=False),
    "lsi": Trainer(lsi_embeddings, {"cooccurrence": "cooccurrence"}, "lsi", gpu=False),
    "sgns": Trainer(word2vec_embeddings, {"corpus": "corpus", "tokenizer": "tokenizer"}, "word2vec",
                    {"method": "sgns"}, gpu=False),
    "cbow": Trainer(word2vec_embeddings, {"corpus": "corpus", "tokenizer": "tokenizer"}, "word2vec",
                    {"method": "cbow"}, gpu=False),
    "glove": Trainer(glove_embeddings, {"cooccurrence": "cooccurrence"}, "glove"),
}
LM_TRAINERS: dict[str, Trainer] = {
    kind: Trainer(lm_stage, {"tokens": "tokenized_corpus", "tokenizer": "tokenizer"},
                  "ngram" if kind == "ngram" else "neural", {"model": kind}, {"embeddings": "embeddings"},
                  gpu=kind != "ngram")
    for kind in ("ngram", "ffnn", "rnn", "lstm", "gru", "transformer")
}
SEQ2SEQ_TRAINERS: dict[str, Trainer] = {
    kind: Trainer(seq2seq_stage, {"pairs": "parallel_corpus"}, "seq2seq", {"model": kind})
    for kind in ("rnn", "transformer")
}

# The neural taggers (per kind and tag set) and the biLM their ELMo features come from; the HMM trains in
# the pipeline's own process (CPU, seconds).
TAGGER_TRAINERS: dict[str, Trainer] = {
    "elmo": Trainer(train_elmo, {"corpus": "corpus"}, "elmo"),
    **{f"{kind}:{column}": Trainer(train_tagger, {"tagged": "tagged_corpus"}, "tagger",
                                   {"column": column, "kind": kind}, {"elmo": "elmo", "vectors": "embeddings"})
       for kind in ("bilstm", "bilstm+elmo") for column in ("upos", "xpos")},
}
PRETRAIN_TRAINERS: dict[str, Trainer] = {"encoder": Trainer(pretrain_stage, {"corpus": "corpus"}, "pretrain")}
FINETUNE_TRAINERS: dict[str, Trainer] = {  # method "<task>-<mode>", e.g. "upos-lora"
    f"{task}-{mode}": Trainer(finetune_stage, {"encoder": "encoder", "tagged": "tagged_corpus"}, "finetune",
                              {"task": task, "mode": mode})
    for task in get_args(FineTuneTask) for mode in get_args(FineTuneMode)
}


def _resolve_inputs(trainer: Trainer, store: str, inputs: dict[str, str]) -> dict[str, ArtifactRef]:
    """{argument: version or "latest"} → ArtifactRefs that exist in the store. A required input not given
    comes from the lineage of those given when one of them was made from it (tokens name the tokenizer
    that encoded them; a word vocabulary its corpus), else it is the latest of its kind."""
    accepted = {**trainer.inputs, **trainer.optional}
    unknown = set(inputs) - set(accepted)
    if unknown:
        raise ParameterError(f"inputs: unknown name(s) {sorted(unknown)}; this trainer takes {sorted(accepted)}")
    given = {name: artifact_ref(store, f"inputs.{name}", accepted[name], version) for name, version in inputs.items()}
    resolved = dict(given)
    for name, kind in trainer.inputs.items():
        if name in resolved:
            continue
        lineage = [entry for ref in given.values() for entry in read_manifest(ref)["inputs"].values()
                   if entry["kind"] == kind]
        version = lineage[0]["version"] if lineage else "latest"
        resolved[name] = artifact_ref(store, f"inputs.{name}", kind, version)
        if lineage:
            log.info("inputs.%s: %s, from the lineage of %s", name, resolved[name],
                     ", ".join(str(ref) for ref in given.values()))
    return resolved


def _run_here(trainer: Trainer, store: str, inputs: dict[str, str], params: BaseModel) -> ArtifactRef:
    logger = get_run_logger()
    logger.info("%s on %s (pid %d), CUDA_VISIBLE_DEVICES=%s", trainer.kind, socket.gethostname(), os.getpid(),
                os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"))
    if warning := gpu_warning():
        logger.warning("%s: %s", trainer.kind, warning)
    ref = trainer.stage(store, **_resolve_inputs(trainer, store, inputs), **trainer.fixed, params=params)
    logger.info("%s: %s at %s", trainer.kind, ref, ref.path)
    return ref


@flow(name="train-embeddings", log_prints=True)
def train_embeddings(
    store: str = "artifacts",
    method: EmbeddingMethod = "svd",
    inputs: dict[str, str] | None = None,
    svd: SVDParams = SVDParams(),
    lsi: LSIParams = LSIParams(),
    word2vec: Word2VecParams = Word2VecParams(),
    glove: GloVeParams = GloVeParams(),
) -> ArtifactRef:
    """Train word embeddings from artifacts in the store (GPU pool).

    Args:
        store: Artifact store (a folder or an fsspec URL) shared with the workers.
        method: Which trainer.
        inputs: Input artifact versions by argument name (e.g. {"ppmi": "3f2a..."}); missing ones are the latest.
    """
    trainer = EMBEDDING_TRAINERS[method]
    sections = {"svd": svd, "lsi": lsi, "word2vec": word2vec, "glove": glove}
    return _run_here(trainer, store, inputs or {}, sections[trainer.section])


@flow(name="train-lm", log_prints=True)
def train_lm(
    store: str = "artifacts",
    method: LMKind = "ngram",
    inputs: dict[str, str] | None = None,
    ngram: NgramParams = NgramParams(),
    neural: NeuralLMParams = NeuralLMParams(),
) -> ArtifactRef:
    """Train a language model on the tokenized corpus in the store (GPU pool).

    Args:
        store: Artifact store (a folder or an fsspec URL) shared with the workers.
        method: Which trainer.
        inputs: Input artifact versions by argument name (tokens, tokenizer, optionally embeddings for a
            pretrained initialisation); missing required ones are the latest.
    """
    trainer = LM_TRAINERS[method]
    inputs = inputs or {}
    if trainer.section == "neural":
        _pretrained_agrees("neural", neural.pretrained, "embeddings", inputs)
    return _run_here(trainer, store, inputs, {"ngram": ngram, "neural": neural}[trainer.section])


@flow(name="train-seq2seq", log_prints=True)
def train_seq2seq(
    store: str = "artifacts",
    method: Seq2SeqKind = "rnn",
    inputs: dict[str, str] | None = None,
    seq2seq: Seq2SeqParams = Seq2SeqParams(),
) -> ArtifactRef:
    """Train a translation model on a parallel corpus in the store (GPU pool).

    Args:
        store: Artifact store (a folder or an fsspec URL) shared with the workers.
        method: Which model: rnn (encoder-decoder, with or without attention) or transformer.
        inputs: Input artifact versions by argument name ({"pairs": <parallel_corpus version>}); missing: the latest.
    """
    return _run_here(SEQ2SEQ_TRAINERS[method], store, inputs or {}, seq2seq)


@flow(name="train-tagger", log_prints=True)
def train_tagger_flow(
    store: str = "artifacts",
    method: str = "bilstm:upos",
    inputs: dict[str, str] | None = None,
    tagger: TaggerParams = TaggerParams(),
    elmo: ElmoParams = ElmoParams(),
) -> ArtifactRef:
    """Train a neural tagger (`bilstm:upos`, `bilstm+elmo:xpos`, ...) on the tagged corpus, or the ELMo biLM
    (`elmo`) on the corpus, from artifacts in the store (GPU pool).

    Args:
        store: Artifact store (a folder or an fsspec URL) shared with the workers.
        method: `elmo`, or KIND:COLUMN with KIND bilstm or bilstm+elmo and COLUMN upos or xpos.
        inputs: Input artifact versions by argument name (tagged, elmo, vectors: the embeddings that initialise
            the word embeddings with tagger.pretrained; corpus for the biLM); missing required ones are the latest.
    """
    if method not in TAGGER_TRAINERS:
        raise ParameterError(f"method={method!r}: use one of {sorted(TAGGER_TRAINERS)}")
    trainer = TAGGER_TRAINERS[method]
    inputs = dict(inputs or {})
    if method.startswith("bilstm+elmo") and "elmo" not in inputs:
        inputs["elmo"] = "latest"  # an optional input of the trainer, required by this kind
    if trainer.section == "tagger":
        _pretrained_agrees("tagger", tagger.pretrained, "vectors", inputs)
    return _run_here(trainer, store, inputs, {"tagger": tagger, "elmo": elmo}[trainer.section])


def _pretrained_agrees(section: str, pretrained: str, name: str, inputs: dict[str, str]) -> None:
    """The stage initialises from `inputs[name]` (an embeddings version) whatever `{section}.pretrained` says:
    from a form, the two must agree (both or neither)."""
    if (pretrained == "none") == (name in inputs):
        raise ParameterError(
            f"{section}.pretrained={pretrained} needs inputs.{name}, the version of the {pretrained} embeddings to "
            "start from (lexiflow artifacts list --kind embeddings)" if pretrained != "none" else
            f"inputs.{name} is given but {section}.pretrained=none: set {section}.pretrained to the method of those "
            f"embeddings, or leave inputs.{name} out")


def _run_method(trainers: dict[str, Trainer], method: str, store: str, inputs: dict[str, str] | None,
                params: BaseModel) -> ArtifactRef:
    if method not in trainers:  # a free-text method (deployments with many choices): checked here
        raise ParameterError(f"method={method!r}: use one of {', '.join(trainers)}")
    return _run_here(trainers[method], store, inputs or {}, params)


@flow(name="pretrain", log_prints=True)
def pretrain(
    store: str = "artifacts",
    method: str = "encoder",
    inputs: dict[str, str] | None = None,
    pretrain: PretrainParams = PretrainParams(),
) -> ArtifactRef:
    """Pretrain the BERT-style encoder (masked LM) on the corpus in the store (GPU pool).

    Args:
        store: Artifact store (a folder or an fsspec URL) shared with the workers.
        method: encoder (the only pretraining model).
        inputs: Input artifact versions by argument name ({"corpus": <version>}); missing: the latest.
    """
    return _run_method(PRETRAIN_TRAINERS, method, store, inputs, pretrain)


@flow(name="finetune", log_prints=True)
def finetune(
    store: str = "artifacts",
    method: str = "upos-full",
    inputs: dict[str, str] | None = None,
    finetune: FineTuneParams = FineTuneParams(),
) -> ArtifactRef:
    """Fine-tune the pretrained encoder on the tagged corpus in the store (GPU pool).

    Args:
        store: Artifact store (a folder or an fsspec URL) shared with the workers.
        method: <task>-<mode>: task upos or genre, mode scratch, frozen, full, adapters or lora.
        inputs: Input artifact versions by argument name ({"encoder": ..., "tagged": ...}); missing: the latest.
    """
    return _run_method(FINETUNE_TRAINERS, method, store, inputs, finetune)


def train(trainer: Trainer, method: str, store: str, inputs: dict[str, ArtifactRef], params: BaseModel,
          training: TrainingParams) -> ArtifactRef:
    """Run a training stage in this process, or hand it to its deployment (`training.embeddings_deployment`
    or `training.lm_deployment`) on the GPU pool (see the module docstring) and return the artifact it
    published."""
    inputs = {name: ref for name, ref in inputs.items() if ref is not None}
    arguments = {**inputs, **trainer.fixed, "params": params}
    if not training.remote or not trainer.gpu or looking_up():  # a lookup finds what a remote run publishes
        return trainer.stage(store, **arguments)
    # The same arguments the remote run's stage call gets (`_run_here`); version_of fills in the defaults.
    version = trainer.stage.version_of({"store": store, **arguments})
    expected = ArtifactStore(store).ref(trainer.kind, version)
    deployment = training.deployment(trainer.kind)
    logger = get_run_logger()
    if published_manifest(expected) is not None:
        logger.info("%s: reusing %s (no training run needed)", trainer.kind, expected)
        return expected
    logger.info("%s: handing %s training to deployment %s (expecting %s)", trainer.kind, method, deployment, expected)
    parameters = {"store": store, "method": method, "inputs": {name: ref.version for name, ref in inputs.items()},
                  trainer.section: params.model_dump(mode="json")}
    child = run_deployment(deployment, parameters=parameters, timeout=training.timeout_minutes * 60,
                           poll_interval=2, tags=["handoff"])
    state = child.state
    if state is None or not state.is_final():  # run_deployment gave up waiting; the run goes on without us
        raise RuntimeError(f"remote training run {child.name!r} ({child.id}) of {deployment} did not finish within "
                           f"training.timeout_minutes={training.timeout_minutes:g} (it is "
                           f"{state.name if state else 'unknown'}; is a worker of its work pool running?): "
                           f"cancel it in the UI, or let it finish and run the pipeline again to reuse {expected}")
    if not state.is_completed():
        raise RuntimeError(f"remote training run {child.name!r} ({child.id}) of {deployment} ended {state.name}"
                           f"{': ' + state.message if state.message else ''} -- see its logs in the UI")
    if published_manifest(expected) is None:
        raise StoreError(f"remote training run {child.name!r} completed but {expected} is not in {store}: the GPU "
                         f"workers must see the same store and run the same lexiflow code")
    logger.info("%s: remote run %r published %s", trainer.kind, child.name, expected)
    return expected

