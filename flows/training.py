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
`PRETRAIN_TRAINERS` or `FINETUNE_TRAINERS`; the flows (their parameter sections those their trainers read),
their deployments and the `training.<family>_deployment` settings derive from these tables and the table of
trainer kinds (flows/training_kinds.py), where a new family is one line.
"""

from __future__ import annotations

import inspect
import logging
import os
import socket
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from lexiflow.flows.params import PipelineParams, TrainingParams, artifact_ref
from lexiflow.flows.training_kinds import TRAINING_FLOWS, TrainingFlow
from lexiflow.models.device import gpu_warning
from lexiflow.models.errors import ParameterError
from lexiflow.storage import ArtifactRef, ArtifactStore, StoreError
from lexiflow.storage.formats import read_manifest
from lexiflow.tasks.elmo import train_elmo
from lexiflow.tasks.embeddings import glove_embeddings, lsi_embeddings, svd_embeddings, word2vec_embeddings
from lexiflow.tasks.lm import train_lm as lm_stage
from lexiflow.tasks.params import FineTuneMode, FineTuneTask
from lexiflow.tasks.pretraining import finetune as finetune_stage
from lexiflow.tasks.pretraining import pretrain as pretrain_stage
from lexiflow.tasks.stage import looking_up, published_manifest
from lexiflow.tasks.tagger import train_tagger as tagger_stage
from lexiflow.tasks.translation import train_seq2seq as seq2seq_stage
from prefect import Flow, flow, get_run_logger
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
    pretrained: str | None = None  # the optional input `<section>.pretrained` names (a flow's form: both or neither)
    needs: tuple[str, ...] = ()  # optional inputs this one requires (the latest when not given)

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
                  gpu=kind != "ngram", pretrained=None if kind == "ngram" else "embeddings")
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
    **{f"{kind}:{column}": Trainer(tagger_stage, {"tagged": "tagged_corpus"}, "tagger",
                                   {"column": column, "kind": kind}, {"elmo": "elmo", "vectors": "embeddings"},
                                   pretrained="vectors", needs=("elmo",) if kind == "bilstm+elmo" else ())
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


def _pretrained_agrees(section: str, pretrained: str, name: str, inputs: dict[str, str]) -> None:
    """The stage initialises from `inputs[name]` (an embeddings version) whatever `{section}.pretrained` says:
    from a form, the two must agree (both or neither)."""
    if (pretrained == "none") == (name in inputs):
        raise ParameterError(
            f"{section}.pretrained={pretrained} needs inputs.{name}, the version of the {pretrained} embeddings to "
            "start from (lexiflow artifacts list --kind embeddings)" if pretrained != "none" else
            f"inputs.{name} is given but {section}.pretrained=none: set {section}.pretrained to the method of those "
            f"embeddings, or leave inputs.{name} out")


def training_flow(spec: TrainingFlow) -> Flow:
    """The flow of one row of the table of trainer kinds: `store`, `method` (a trainer of its family), `inputs`
    (versions by argument name) and one parameter section per section its trainers read, typed and described as
    in the pipeline's form (its signature and docstring, so its UI form, are derived)."""
    trainers = TRAINERS[spec.family]
    sections = list(dict.fromkeys(trainer.section for trainer in trainers.values()))
    names = sorted({name for t in trainers.values() for name in (*t.inputs, *t.optional)})

    def run(store: str = "artifacts", method: str = next(iter(trainers)), inputs: dict[str, str] | None = None,
            **params: BaseModel) -> ArtifactRef:
        if method not in trainers:  # a run created without the schema's check: refused here
            raise ParameterError(f"method={method!r}: use one of {', '.join(trainers)}")
        trainer = trainers[method]
        inputs = {**dict.fromkeys(trainer.needs, "latest"), **(inputs or {})}
        section = params.get(trainer.section) or PipelineParams.model_fields[trainer.section].default
        if trainer.pretrained:
            _pretrained_agrees(trainer.section, section.pretrained, trainer.pretrained, inputs)
        return _run_here(trainer, store, inputs, section)

    fields = PipelineParams.model_fields
    run.__signature__ = inspect.Signature([
        inspect.Parameter("store", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=str, default="artifacts"),
        inspect.Parameter("method", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Literal[tuple(trainers)],
                          default=next(iter(trainers))),
        inspect.Parameter("inputs", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=dict[str, str] | None,
                          default=None),
        *(inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=fields[name].annotation,
                            default=fields[name].default) for name in sections)])
    run.__doc__ = (f"Train {spec.what} (GPU pool).\n\nArgs:\n"
                   "    store: Artifact store (a folder or an fsspec URL) shared with the workers.\n"
                   f"    method: Which trainer: {', '.join(trainers)}.\n"
                   f"    inputs: Input artifact versions by argument name ({', '.join(names)}); a required one not "
                   "given comes from the lineage of those given, else it is the latest.\n"
                   + "".join(f"    {name}: {fields[name].description}\n" for name in sections))
    run.__name__ = run.__qualname__ = spec.entrypoint
    return flow(name=spec.name, log_prints=True)(run)


# One trainer table per family of the table of trainer kinds (flows/training_kinds.py), and its flow, bound to the
# name its deployment's entrypoint gives (`flows/training.py:train_lm`, ...).
TRAINERS: dict[str, dict[str, Trainer]] = {
    "embeddings": EMBEDDING_TRAINERS, "lm": LM_TRAINERS, "seq2seq": SEQ2SEQ_TRAINERS, "tagger": TAGGER_TRAINERS,
    "pretrain": PRETRAIN_TRAINERS, "finetune": FINETUNE_TRAINERS}
assert set(TRAINERS) == {spec.family for spec in TRAINING_FLOWS}, "flows/training_kinds.py and TRAINERS disagree"
FLOWS: dict[str, Flow] = {spec.family: training_flow(spec) for spec in TRAINING_FLOWS}
globals().update({spec.entrypoint: FLOWS[spec.family] for spec in TRAINING_FLOWS})


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

