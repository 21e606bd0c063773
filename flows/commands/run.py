"""`lexiflow run`: the pipeline, against the Prefect server `flows/server.py` chooses (or none, when every
artifact is in the store already), then what it built and its headline figures."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lexiflow.flows import prefect_env
from lexiflow.flows.commands.common import DEFAULT_STORE

if TYPE_CHECKING:
    from lexiflow.flows.params import PipelineParams


def params_tree(args: argparse.Namespace) -> dict[str, Any]:
    """Config file ← --store ← --corpus ← --set, as given (`validate` adds the defaults and checks the whole)."""
    from lexiflow.flows.config import parameter_tree

    return parameter_tree(args.config, args.set, {
        "store": args.store or None, "corpus.sources": args.corpus or None,
        "release.when": "always" if getattr(args, "release", False) else None})


def pipeline_params(args: argparse.Namespace):
    """Defaults ← config file ← --corpus ← --set, validated as a whole."""
    from lexiflow.flows.params import validate

    return validate(params_tree(args))


def cmd_run(args: argparse.Namespace) -> int:
    from lexiflow.flows import server

    home = prefect_env.default_home()
    tree = params_tree(args)
    # A first run into a store starts its temporary server now: its start-up overlaps the imports below.
    if "store" in tree:
        store = str(tree["store"])
    else:
        from lexiflow.storage.store import DEFAULT_ROOT as store  # 3 s of imports: a named store waits none
    server.prestart(home, store)
    try:
        from lexiflow.flows.params import validate

        params = validate(tree)
        prestart_cluster(params)
        from lexiflow.flows.pipeline import reuse_all, run_pipeline
        from lexiflow.storage import ArtifactStore

        ArtifactStore(params.store).check_root()  # before the run: one line, not a failed run
        # With no server to report to, a rerun that finds every artifact starts none (docs/design.md, "Caching")
        refs = reuse_all(params) if server.running(home) is None else None
        if refs is None:
            with prefect_api(home):
                refs = run_pipeline(params)
    except BaseException:
        server.stop_temporary()  # bad parameters found after `prestart`: its server goes at once, not at exit
        raise
    store = ArtifactStore(params.store)
    print(f"\nArtifacts in {store.root}:")
    for name, ref in refs.items():
        print(f"  {name:<17} {ref.version}  {store.path(ref.kind, ref.version)}")
    report = refs["report"]
    print(f"\nEvaluation report: {store.path(report.kind, report.version, 'report.md')}")
    print("Headline figures:")
    for name, ref in refs.items():
        if (figures := headline(ref.kind, store.manifest(ref.kind, ref.version)["metrics"])) is not None:
            print(f"  {name:<17} {figures}")
    return 0


def prestart_cluster(params: PipelineParams) -> None:
    """A Dask run without a cluster address whose corpus is more than one shard (or whose shards are set in rows)
    starts its LocalCluster now, in the background: its workers start while this process imports the pipeline
    (~8 s on one core), not in the first stage (300 MB on 2 cores: ~3 s). A smaller corpus runs its shards here,
    with no cluster."""
    parallel = params.parallel
    if parallel.runner != "dask" or parallel.dask_address:
        return
    from lexiflow.models.errors import LexiflowError
    from lexiflow.models.ingest.sources import resolve_sources
    from lexiflow.tasks.runners import start_local_cluster

    with contextlib.suppress(LexiflowError, OSError):  # a bad source is the corpus stage's to report
        if parallel.shard_rows or sum(path.stat().st_size for path in resolve_sources(params.corpus.sources)) \
                > parallel.shard_bytes:
            start_local_cluster(parallel.workers)


@contextlib.contextmanager
def prefect_api(home: Path) -> Iterator[str]:
    """Run against the server `flows/server.py` chooses (the user's, `lexiflow serve`'s, or a temporary
    one tied to this process), in this process and in the processes it starts."""
    from lexiflow.flows import server
    from prefect.settings import PREFECT_API_URL, get_current_settings, temporary_settings

    api_url = server.choose(home, say=lambda line: print(line, file=sys.stderr, flush=True))
    before = os.environ.get("PREFECT_API_URL")
    os.environ["PREFECT_API_URL"] = api_url  # process-pool shards inherit it
    try:
        if api_url == get_current_settings().api.url:
            yield api_url  # already this process's server: a second settings context would start a second
            return  # set of Prefect's event/log workers, which the first context's shutdown then waits on
        with temporary_settings(updates={PREFECT_API_URL: api_url}):
            yield api_url
    finally:
        flush_prefect_workers()
        if before is None:
            os.environ.pop("PREFECT_API_URL", None)
        else:
            os.environ["PREFECT_API_URL"] = before


def flush_prefect_workers(timeout: float = 30.0) -> None:
    """Send the run's queued logs and events while its server is up, and stop those workers: a worker
    left bound to a server that goes away (a `lexiflow serve` stopped later) would make a later drain in
    this process (Prefect's, at exit or in a test harness) wait for it forever."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        worker.drain_all(timeout=timeout)


def headline(kind: str, metrics: dict[str, Any]) -> str | None:
    """The headline figures of an artifact's manifest metrics (None for kinds without any): a score
    with nothing to score (null in the manifest, NaN in older ones) is "–", an infinite perplexity "inf"."""
    from lexiflow.storage.manifests import metric_number
    from lexiflow.tasks.report_image import HEADLINE

    def figure(key: str, digits: int) -> str:
        value = metric_number(metrics.get(key))
        return "–" if value is None else f"{value:.{digits}f}"

    if kind == "evaluation":
        return ", ".join(f"{k} {figure(k, 3)}" for k in HEADLINE)
    if kind == "tagger":
        return ", ".join(f"{k} {figure(k, 4)}" for k in ("accuracy", "known_accuracy", "unknown_accuracy")
                         if metrics.get(k) is not None) or "not evaluated (no valid or test sentences)"
    if kind == "lm":
        return ", ".join(f"{k} {figure(k, 1)}" for k in ("valid_perplexity", "valid_word_perplexity",
                                                         "test_perplexity", "test_word_perplexity")
                         if metrics.get(k) is not None)
    return None


def add_parser(sub: Any) -> None:
    run = sub.add_parser("run", help="run the pipeline", description=(
        "Run the full pipeline (corpus → vocabulary → co-occurrence → PPMI → SVD → evaluation). "
        "Stages whose inputs and parameters are unchanged are reused from the store."))
    run.add_argument("--store", help=f"artifact store folder or fsspec URL (default {DEFAULT_STORE})")
    run.add_argument("--corpus", nargs="+", metavar="SOURCE",
                     help="corpus sources: files, folders, globs, builtin:enwiki (default) or builtin:lee")
    run.add_argument("--config", metavar="FILE", help="pipeline parameters as TOML or JSON (sections as in --set)")
    run.add_argument("--set", action="append", metavar="KEY=VALUE",
                     help="override a parameter by dotted name, e.g. --set svd.dim=200 --set corpus.lowercase=false")
    run.add_argument("--release", action="store_true",
                     help="release what the run built (move KIND@production; --set release.alias=NAME for another "
                          "alias) when every blocking check passes; else the run fails naming the checks")
    run.set_defaults(func=cmd_run)
