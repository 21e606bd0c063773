"""Releasing a run's artifacts: the names they are released under, the gate, and the events.

Every artifact a pipeline run names (`corpus`, `embeddings.svd`, `lm.ngram`, `tagger.bilstm.upos`, ...)
is released under an alias of its kind derived from that name and `release.alias` (production):
`corpus@production`, `embeddings@production-svd`, `tagger@production-bilstm-upos`; the first artifact of
each kind in the run also under the alias itself (`embeddings@production`: the first of `embeddings`,
`tokenizer@production`: the word vocabulary). The checks compare each artifact with the version released
under its name (tasks/checks.py). A run releases when `release.when` says so (`scheduled`: only runs a
schedule started; `always`) and every blocking check passed; then each alias that moves is logged in the
store's release log, as one transaction (all or none: storage/releases.py), and announced by a
`lexiflow.artifact.released` event, after all of them moved (a downstream job started by the first event finds the
whole release). Manual moves (`lexiflow release`, `--rollback`) are announced the same way (`announcer`).
"""

from __future__ import annotations

import functools
import re
from typing import Any

from lexiflow.models import checks
from lexiflow.models.errors import LexiflowError
from lexiflow.storage import ArtifactRef, Catalog
from lexiflow.storage.releases import Announce
from lexiflow.tasks.params import ReleaseParams
from lexiflow.tasks.stage import RELEASED, STAGE_RETRIES, LookupTask, emit_artifact_event
from prefect import get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run


class ReleaseRefused(LexiflowError):
    """A blocking check failed: the aliases stay where they were (the message: each failure's numbers)."""


def own_alias(name: str, kind: str, alias: str) -> str:
    """The alias a run name is released under: `alias`, or `alias-<suffix>` (embeddings.svd: production-svd)."""
    suffix = re.sub(r"[^a-z0-9]+", "-", name.removeprefix(kind).lower()).strip("-")
    return f"{alias}-{suffix}" if suffix else alias


def aliases(refs: dict[str, ArtifactRef], alias: str) -> dict[str, list[str]]:
    """{run name: the aliases of its kind it is released under}: its own, and `alias` for the first of each kind."""
    found: dict[str, list[str]] = {}
    for name, ref in refs.items():
        first = all(other.kind != ref.kind for other in map(refs.get, found))
        found[name] = list(dict.fromkeys([alias] * first + [own_alias(name, ref.kind, alias)]))
    return found


@functools.partial(LookupTask, name="released-versions", cache_policy=NO_CACHE, persist_result=False, **STAGE_RETRIES)
def released_versions(refs: dict[str, ArtifactRef], alias: str) -> dict[str, ArtifactRef]:
    """{run name: the version released under its own name} for the names something is released under: what
    the checks compare with."""
    catalog, found = Catalog(next(iter(refs.values())).store), {}
    for name, ref in refs.items():
        version = catalog.released(ref.kind, own_alias(name, ref.kind, alias))
        if version is not None and catalog.store.exists(ref.kind, version):  # removed with --force: a first build
            found[name] = catalog.store.ref(ref.kind, version)
    return found


def publish_checks(checked: ArtifactRef, results: list[dict[str, Any]]) -> None:
    """The checks as a table artifact of the run (`release-checks`), published whether the release happens or not."""
    try:
        create_table_artifact([checks_row(row) for row in results], key="release-checks",
                              description=f"Release checks ({checked}): each artifact against the released version")
    except Exception:  # no Prefect run context (a plain function call): nothing to show it in
        pass


def checks_row(row: dict[str, Any]) -> dict[str, Any]:
    """A check as the `release-checks` table shows it: the verdict first (the columns a 1400 px page shows
    before it scrolls), figures to 4 significant digits, a range's both bounds."""
    result = checks.Result(**row)
    return {"passed": result.passed, "blocking": result.blocking, "artifact": result.artifact, "check": result.check,
            "value": _cell(result.value), "released": _cell(result.released), "limit": result.bounds,
            "rule": result.rule}


def _cell(value: Any) -> Any:
    """A float to 4 significant digits (a count stays whole); NaN, not measured, None."""
    return None if value is None or value != value else float(f"{value:.4g}") if isinstance(value, float) else value


def wanted(params: ReleaseParams) -> bool:
    """Whether this run releases: `always`, or `scheduled` and a schedule created this flow run."""
    if params.when != "scheduled":
        return params.when == "always"
    if not flow_run.id:
        return False
    from prefect import get_client

    with get_client(sync_client=True) as client:
        return bool(client.read_flow_run(flow_run.id).auto_scheduled)


def announcer(store: str) -> Announce | None:
    """How this process sends a move's `lexiflow.artifact.released` event: inside a flow or task run, or with a
    Prefect server configured (PREFECT_API_URL). None elsewhere: the moves' events then wait in the store's outbox
    for the next command or run that can send them (storage/releases.py), rather than go to a temporary server
    started for nobody to hear them. The payload says the action (release or rollback), where from, and why."""
    from prefect.context import FlowRunContext, TaskRunContext
    from prefect.settings import get_current_settings

    if not (FlowRunContext.get() or TaskRunContext.get() or get_current_settings().api.url):
        return None

    def announce(entry: dict[str, Any], payload: dict[str, Any]) -> None:
        ref = ArtifactRef(store=store, kind=entry["kind"], version=entry["to"])
        emit_artifact_event(RELEASED, ref, entry["alias"], {**payload, "action": entry["action"], "from": entry["from"],
                                                            "seq": entry["seq"], "reason": entry["reason"]})

    return announce


@task(name="release", cache_policy=NO_CACHE, persist_result=False, **STAGE_RETRIES)
def move_aliases(refs: dict[str, ArtifactRef], checked: ArtifactRef, alias: str) -> list[tuple[ArtifactRef, str]]:
    """Move every alias of the run's artifacts that does not name its version yet, as one transaction (all or
    none, its events sent once all moved); [(ref, alias)] moved."""
    catalog = Catalog(checked.store)
    moves = [(refs[name].kind, refs[name].version, each) for name, names in aliases(refs, alias).items()
             for each in names]
    entries = catalog.release_many(moves, reason=f"checks passed ({checked})", flow_run=str(flow_run.id or "") or None,
                                   payload={"checks": checked.version}, announce=announcer(checked.store))
    return [(catalog.store.ref(e["kind"], e["to"]), e["alias"]) for e in entries if not e.get("unchanged")]


def release(refs: dict[str, ArtifactRef], checked: ArtifactRef, results: list[dict[str, Any]],
            params: ReleaseParams) -> list[tuple[ArtifactRef, str]]:
    """The gate: release when wanted and every blocking check passed; refuse (ReleaseRefused, the run
    fails) when wanted and one failed; else only say how the checks went."""
    logger = get_run_logger()
    failed = [checks.Result(**row) for row in results if row["blocking"] and not row["passed"]]
    if not wanted(params):
        if failed:
            logger.warning("not releasing (release.when=%s); a release would be refused: %s", params.when,
                           checks.failure_line(failed))
        return []
    if failed:
        raise ReleaseRefused(checks.failure_line(failed))
    moved = move_aliases(refs, checked, params.alias)  # announced by it, once all moved
    logger.info("released: %s", ", ".join(f"{ref.kind}@{alias}={ref.version}" for ref, alias in moved) or
                "every alias already names this run's versions")
    return moved
