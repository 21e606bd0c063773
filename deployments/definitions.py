"""lexiflow's Prefect deployments, defined in Python: one `DeploymentSpec` line per deployment.

Why Python and not `prefect.yaml`: the same list is used by `lexiflow serve` (one box), by
`python -m deployments.definitions` (a real cluster) and by the tests; the store, the corpus
sources, the cron and the code source are configuration, not copies of YAML; and the parameter
schema is made strict here (`additionalProperties: false`), which prefect.yaml cannot express.
With `enforce_parameter_schema` (on), the Prefect API then refuses a run with an unknown or invalid
parameter *when it is created* (HTTP 409 naming the field), before any worker starts anything. A
run created with enforcement switched off still fails at its flow's entry, before any stage runs:
Prefect validates the flow's signature and our pydantic sections (`extra="forbid"`, bounds).

    pipeline           cpu pool, manual: the full parameter form
    corpus-rebuild     cpu pool, cron (weekly by default): the pipeline on the configured sources,
                       released when its checks pass; unchanged sources give the same artifact
                       versions, so nothing is recomputed; a grown corpus is rebuilt incrementally
                       (parallel.pieces on by default)
    train-embeddings   gpu pool: embeddings from artifacts in the store (the pipeline's hand-off)
    train-lm           gpu pool: a language model on the tokenized corpus
    train-seq2seq      gpu pool: a translation model on the parallel corpus
    train-tagger       gpu pool: a neural tagger (BiLSTM, BiLSTM+ELMo) or the ELMo biLM
    pretrain           gpu pool: the BERT-style encoder (masked LM) on the corpus
    finetune           gpu pool: the encoder fine-tuned on the tagged corpus (one task, one mode)
    serve-release      cpu pool, triggered by each release of the embeddings: the example downstream job

Add a deployment: one `DeploymentSpec(...)` line in `DEPLOYMENTS`.
"""

from __future__ import annotations

import argparse
import html
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from lexiflow.flows.config import add_configuration, merged
from lexiflow.flows.training_kinds import TRAINING_FLOWS
from lexiflow.models.errors import ParameterError
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CRON = "0 3 * * 1"  # Mondays 03:00


class DeployConfig(BaseModel):
    """Where the code and the data are, and the schedule of the corpus rebuild."""

    model_config = ConfigDict(extra="forbid")
    source: str = Field(str(ROOT), description="Code the workers run: a folder they all see (one box, a shared "
                                               "checkout) or a git URL (Prefect clones it per run).")
    store: str = Field(os.environ.get("LEXIFLOW_STORE", str(ROOT / "artifacts")),
                       description="Artifact store shared by every worker: a folder or an fsspec URL (s3://...).")
    sources: list[str] = Field(["builtin:enwiki"], min_length=1, description="Corpus sources of corpus-rebuild.")
    rebuild_cron: str = Field(os.environ.get("LEXIFLOW_REBUILD_CRON", DEFAULT_CRON),
                              description="Cron of corpus-rebuild (5 fields).")
    timezone: str = Field("UTC", description="Time zone of the cron.")
    remote_training: bool = Field(True, description="Deployed pipelines hand training to the gpu pool.")
    parameters: dict[str, Any] = Field({}, description="Pipeline parameters the pipeline and corpus-rebuild "
                                       "deployments get (a --config file and --set, read as `lexiflow run` reads "
                                       "them: flows/config.py); the fields above win over them.")
    serving: str = Field(None, validate_default=True, description=(
        "Folder the example downstream job (serve-release) exports the released embeddings and tokenizer to; "
        "default: `serving` beside a local store's folder, else in $PREFECT_HOME. Never the checkout."))
    alias: str = Field("production", description="The alias corpus-rebuild releases to and serve-release serves.")
    cpu_pool: str = "cpu"
    gpu_pool: str = "gpu"

    @field_validator("serving", mode="before")
    @classmethod
    def _serving_beside_the_store(cls, value: str | None, info: ValidationInfo) -> str:
        if value:
            return value
        store = info.data.get("store", "")
        if "://" in store and not store.startswith("file://"):  # an object store: the server's home
            from lexiflow.flows.prefect_env import default_home

            return str(default_home() / "serving")
        return str(Path(store.removeprefix("file://")).resolve().parent / "serving")


@dataclass(frozen=True)
class DeploymentSpec:
    name: str
    entrypoint: str  # path/to/file.py:flow_function, relative to the code source
    pool: Literal["cpu", "gpu"]
    description: str
    parameters: Callable[[DeployConfig], dict[str, Any]] = lambda c: {"store": c.store}
    cron: Callable[[DeployConfig], str | None] = lambda c: None
    tags: tuple[str, ...] = field(default_factory=tuple)
    triggers: Callable[[DeployConfig], list[Any]] = lambda c: []


def _released_embeddings(c: DeployConfig) -> list[Any]:
    """Start on each release of this store's embeddings under the alias (tasks/stage.py's RELEASED event)."""
    from lexiflow.tasks.stage import RELEASED
    from prefect.events import DeploymentEventTrigger

    return [DeploymentEventTrigger(name="on-release", expect={RELEASED}, match={
        "lexiflow.kind": "embeddings", "lexiflow.alias": c.alias, "lexiflow.store": c.store})]


def _pipeline_parameters(c: DeployConfig) -> dict[str, Any]:
    """The configured parameters (as given: the flow adds the defaults), with the deployment's store and where
    training runs."""
    return {**merged({"training": {"remote": c.remote_training}}, c.parameters), "store": c.store}


# corpus-rebuild's defaults, under the configured parameters (a deploy config's `parallel.pieces: false` wins):
# the scheduled rebuild of a growing corpus keeps per-piece partial results (docs/design.md, "Incremental rebuilds")
REBUILD_DEFAULTS: dict[str, Any] = {"parallel": {"pieces": True}}

DEPLOYMENTS: list[DeploymentSpec] = [
    DeploymentSpec("pipeline", "flows/pipeline.py:pipeline", "cpu",
                   "The full pipeline, every parameter in the form. Unchanged stages are reused.",
                   _pipeline_parameters, tags=("manual",)),
    DeploymentSpec("corpus-rebuild", "flows/pipeline.py:pipeline", "cpu",
                   "Scheduled rebuild of the corpus from its configured sources and of every stage downstream, "
                   "released (alias moved) when every blocking check passes. Unchanged sources give the same "
                   "versions: nothing is recomputed. A grown or changed corpus is rebuilt incrementally, reusing "
                   "the per-piece partial results kept in the store (parallel.pieces, on here by default).",
                   lambda c: merged(merged(REBUILD_DEFAULTS, _pipeline_parameters(c)), {
                       "corpus": {"sources": c.sources}, "release": {"when": "always", "alias": c.alias}}),
                   cron=lambda c: c.rebuild_cron, tags=("scheduled",)),
    *(DeploymentSpec(spec.name, f"flows/training.py:{spec.entrypoint}", "gpu",
                     f"Train {spec.what} (started by the pipeline, or by hand).", tags=("training",))
      for spec in TRAINING_FLOWS),  # the table of trainer kinds
    DeploymentSpec("serve-release", "flows/downstream.py:serve_release", "cpu",
                   "Example downstream job: export the released embeddings and tokenizer to a serving folder. "
                   "Starts on each release of the embeddings (a deployment trigger on lexiflow.artifact.released).",
                   lambda c: {"store": c.store, "folder": c.serving, "alias": c.alias}, triggers=_released_embeddings,
                   tags=("downstream",)),
]


def pool_name(spec: DeploymentSpec, config: DeployConfig) -> str:
    return config.gpu_pool if spec.pool == "gpu" else config.cpu_pool


def ensure_pools(config: DeployConfig) -> None:
    """Create the `cpu` and `gpu` process work pools if they do not exist (needs PREFECT_API_URL)."""
    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound
    from prefect.workers.process import ProcessWorker

    with get_client(sync_client=True) as client:
        for name in (config.cpu_pool, config.gpu_pool):
            try:
                client.read_work_pool(name)
            except ObjectNotFound:
                client.create_work_pool(WorkPoolCreate(
                    name=name, type="process", base_job_template=ProcessWorker.get_default_base_job_template(),
                    description=f"lexiflow {'GPU training' if name == config.gpu_pool else 'CPU'} workers"))


def _strict(schema: Any) -> Any:
    """The flow's parameter schema with unknown top-level names refused (nested sections already
    refuse theirs: pydantic writes `additionalProperties: false` for `extra="forbid"`), and descriptions
    escaped for the UI, which renders them as HTML (`<unk>`, `</w>` vanished as tags)."""
    from prefect.utilities.callables import ParameterSchema

    class StrictParameterSchema(ParameterSchema):
        additionalProperties: bool = False

    from lexiflow.tasks.params import title

    dumped = _escape_descriptions(schema.model_dump())
    for name, prop in dumped["properties"].items():  # Prefect titles a parameter by its name: in words, as its fields
        prop["title"] = title(name)
    return StrictParameterSchema(**dumped, additionalProperties=False)


def _escape_descriptions(node: Any) -> Any:
    if isinstance(node, dict):
        return {key: html.escape(value, quote=False) if key == "description" and isinstance(value, str)
                else _escape_descriptions(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_escape_descriptions(value) for value in node]
    return node


def deploy(config: DeployConfig, only: list[str] | None = None) -> dict[str, str]:
    """Create or update the deployments (and the pools); returns {flow/deployment: id}."""
    from prefect import Flow, get_client
    from prefect.exceptions import ObjectNotFound

    check(config)
    ensure_pools(config)
    ids = {}
    for spec in DEPLOYMENTS:
        if only and spec.name not in only:
            continue
        flow = Flow.from_source(config.source, spec.entrypoint)
        cron = spec.cron(config)
        # A redeploy (a `serve` restart, a code change) keeps what was paused in the UI paused: Prefect
        # would otherwise set the deployment and its schedules active again.
        with get_client(sync_client=True) as client:
            try:
                existing = client.read_deployment_by_name(f"{flow.name}/{spec.name}")
            except ObjectNotFound:
                existing = None
        active = existing is None or all(s.active for s in existing.schedules)
        when = "" if cron is None else f" Runs at cron '{cron}', time zone {config.timezone}."  # the UI shows no zone
        deployment = flow.to_deployment(
            name=spec.name, work_pool_name=pool_name(spec, config), description=spec.description + when,
            parameters=spec.parameters(config), tags=["lexiflow", *spec.tags], enforce_parameter_schema=True,
            paused=existing.paused if existing else None,
            schedules=None if cron is None else [_cron_schedule(cron, config.timezone, active)],
            triggers=spec.triggers(config) or None)
        deployment._parameter_openapi_schema = _strict(deployment._parameter_openapi_schema)
        ids[f"{flow.name}/{spec.name}"] = str(deployment.apply())
    return ids


def _cron_schedule(cron: str, timezone: str, active: bool = True) -> Any:
    """The schedule; a ParameterError naming the setting when the cron or the time zone is invalid."""
    from prefect.client.schemas.schedules import CronSchedule
    from prefect.schedules import Cron
    from pydantic import ValidationError

    try:
        CronSchedule(cron=cron, timezone=timezone)  # validates the expression and the time zone
    except ValidationError as exc:
        raise ParameterError(
            f"--timezone {timezone!r}: not an IANA time zone (e.g. UTC, Europe/Berlin)"
            if "timezone" in exc.errors()[0]["loc"] else
            f"--cron {cron!r} (or LEXIFLOW_REBUILD_CRON): not a cron expression; use 5 fields, minute hour "
            f"day-of-month month day-of-week, e.g. {DEFAULT_CRON!r}") from None
    return Cron(cron, timezone=timezone, active=active)


def check(config: DeployConfig) -> None:
    """Refuse a bad schedule or bad pipeline parameters before anything is started, created or deployed: a
    ParameterError naming the setting (`corpus-rebuild: invalid pipeline parameters: svd.dim: ...`)."""
    from lexiflow.flows.params import validate

    for spec in DEPLOYMENTS:
        if (cron := spec.cron(config)) is not None:
            _cron_schedule(cron, config.timezone)
    for spec in DEPLOYMENTS:
        if spec.entrypoint.endswith(":pipeline"):
            try:
                validate(spec.parameters(config))
            except ParameterError as exc:
                raise ParameterError(f"{spec.name}: {exc}") from None


def deploy_config(parameters: dict[str, Any], **fields: Any) -> DeployConfig:
    """The configuration of the deployments from a pipeline parameter tree (flows/config.py) and the fields
    given (None: not given). The tree's `store` and `corpus.sources` are the deployments' store and
    corpus-rebuild's sources unless `store` and `sources` are given."""
    fields = {name: value for name, value in fields.items() if value is not None}
    if "store" in parameters:
        fields.setdefault("store", str(parameters["store"]))
    corpus = parameters.get("corpus")
    if isinstance(corpus, dict) and corpus.get("sources"):
        fields.setdefault("sources", corpus["sources"])
    return DeployConfig(parameters=parameters, **fields)


def main(argv: list[str] | None = None) -> int:
    """Deploy to the server in PREFECT_API_URL (a real cluster); see docs/operations.md."""
    parser = argparse.ArgumentParser(prog="python -m deployments.definitions", description=main.__doc__)
    defaults = DeployConfig()
    parser.add_argument("--source", default=defaults.source, help="code folder shared by the workers, or a git URL")
    parser.add_argument("--store", help=f"artifact store shared by the workers (default {defaults.store})")
    parser.add_argument("--sources", nargs="+", help="corpus sources of corpus-rebuild (default: the config's "
                                                     "corpus.sources, else builtin:enwiki)")
    add_configuration(parser)
    parser.add_argument("--cron", default=defaults.rebuild_cron, help=f"corpus-rebuild cron (default {DEFAULT_CRON})")
    parser.add_argument("--timezone", default=defaults.timezone)
    parser.add_argument("--serving", help="serve-release's folder (default: `serving` beside a local store, else "
                                          "in $PREFECT_HOME)")
    parser.add_argument("--local-training", action="store_true", help="deployed pipelines train in-process")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="deploy only these")
    args = parser.parse_args(argv)
    from lexiflow.flows.config import parameter_tree

    try:
        config = deploy_config(parameter_tree(args.config, args.set), source=args.source, store=args.store,
                               sources=args.sources, rebuild_cron=args.cron, timezone=args.timezone,
                               serving=args.serving, remote_training=False if args.local_training else None)
        ids = deploy(config, args.only)
    except ParameterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for name, deployment_id in ids.items():
        print(f"{name}  {deployment_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
