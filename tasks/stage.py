"""`@stage`: turn a builder into a cached, retried Prefect task that publishes one artifact.

A builder is `build(out: ArtifactWriter, **arguments) -> None`, where arguments are input
`ArtifactRef`s and pydantic parameter models. The task it becomes is
`task(store: str, **arguments) -> ArtifactRef` and:

1. computes the artifact version: a hash of the input versions, the parameters, optional extra
   material (`fingerprint`, e.g. source file contents) and the code version, derived from the
   code: the task module and every lexiflow module its builder reaches, imports followed
   transitively, each hashed without comments and docstrings (Prefect's TASK_SOURCE alone would
   miss a change in `models/`);
2. returns at once if the store already holds that version, sound (`reusable`: manifest valid, files
   there with their sizes; nothing is recomputed); a damaged one is removed and rebuilt;
3. otherwise builds it into a staging folder and publishes it atomically; a second run of the same
   version on this machine waits for the first and reuses its artifact (`ArtifactStore.build_lock`).

Inside `lookup_only()` a stage task runs without Prefect (no server, no task run): it returns its
artifact's reference if the store holds that version sound, else raises `MustRun`. `lexiflow run` runs the
pipeline's recipe that way first, so a rerun that finds every artifact needs no Prefect server at all.

Prefect's cache key is the same version, given only while the artifact exists and is sound, so a cache hit
can never return a reference to a deleted artifact. Retries (with backoff) cover transient I/O
errors only; `LexiflowError` (bad input or parameters) fails at once.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import inspect
import logging
from collections.abc import Callable, Iterator
from typing import Any

from lexiflow.models.threads import DEFAULT_THREADS, limit_threads
from lexiflow.storage import ArtifactRef, ArtifactStore, StoreError, content_version
from lexiflow.storage.formats import read_manifest
from lexiflow.storage.manifests import ArtifactNotFound
from lexiflow.tasks.code_versions import code_modules, code_version
from lexiflow.tasks.retries import USER_ERRORS, worth_retrying
from prefect import Task, get_run_logger
from prefect.artifacts import (
    create_link_artifact,
    create_markdown_artifact,
    create_progress_artifact,
    update_progress_artifact,
)
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run, task_run
from pydantic import BaseModel

HOW = {"store", "parallel"}  # arguments that choose where/how a stage runs, not what it makes: not versioned
# Fields of a parameter section that choose how, not what: the CPU threads (as the CPU model, they may
# change a float result's last bits, never what the artifact is).
HOW_FIELDS = {"threads"}
logging.getLogger("lexiflow").setLevel(logging.INFO)  # progress lines from models/ reach the run logs


class UserErrorsOnOneLine(logging.Filter):
    """Log a user-caused error (bad input or parameters) as its one-line message, without Prefect's
    traceback: the message names the file/parameter and the fix; the stack would only hide it.
    Other exceptions (bugs, I/O failures) keep their tracebacks."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, USER_ERRORS):
            if record.msg == "Engine execution exited with unexpected exception":
                return False  # Prefect's outer wrapper, after the failure was logged: the error is expected
            record.exc_info, record.exc_text = None, None
        return True


for _name in ("prefect.flow_runs", "prefect.task_runs"):
    if not any(isinstance(f, UserErrorsOnOneLine) for f in logging.getLogger(_name).filters):
        logging.getLogger(_name).addFilter(UserErrorsOnOneLine())


def retry_transient_only(task_obj: Any, task_run_obj: Any, state: Any) -> bool:
    """Prefect's retry condition for `worth_retrying` failures."""
    try:
        state.result()
    except Exception as exc:
        return worth_retrying(exc)
    return False


# A stage's retries: the outer layer over the store's own per-operation retries, which ride out a
# blip but not an outage (storage/faults.py's outages outlast them on purpose).
STAGE_RETRIES: dict[str, Any] = {"retries": 3, "retry_delay_seconds": [1, 2, 4],
                                 "retry_condition_fn": retry_transient_only}


class MustRun(Exception):  # noqa: N818 -- a signal, not an error: the stage named must be built
    """Raised by a stage task inside `lookup_only()` when the store lacks its artifact (or holds it damaged)."""


_LOOKUP_ONLY = contextvars.ContextVar("lookup_only", default=False)


@contextlib.contextmanager
def lookup_only() -> Iterator[None]:
    """Tasks called inside run without Prefect: stages only look their artifact up (`MustRun` when it must be
    built), other `LookupTask`s (store reads) call their function."""
    token = _LOOKUP_ONLY.set(True)
    try:
        yield
    finally:
        _LOOKUP_ONLY.reset(token)


def looking_up() -> bool:
    return _LOOKUP_ONLY.get()


class LookupTask(Task):
    """A Prefect task that, inside `lookup_only()`, runs `lookup` (default: its own function) instead."""

    lookup: Callable[..., Any] | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if looking_up():
            return (self.lookup or self.fn)(*args, **kwargs)
        return super().__call__(*args, **kwargs)


@functools.partial(LookupTask, name="read-manifest", cache_policy=NO_CACHE, persist_result=False, **STAGE_RETRIES)
def published_manifest(ref: ArtifactRef) -> dict[str, Any] | None:
    """An artifact's manifest, or None when it is not published: for a flow's own reads of the store
    (a flow body has no retries of its own, a task run has the stages')."""
    try:  # one read, no exists(): fsspec's default exists() answers False on any error
        return read_manifest(ref)
    except ArtifactNotFound:
        return None


def reusable(store: ArtifactStore, kind: str, version: str, logger: Any = None) -> bool:
    """Whether the store holds `kind:version` sound: its manifest follows the schema and its files are
    there with their sizes (one manifest read and one listing; the content is checked where it is read:
    Parquet page checksums, SHA-256 of files read whole). With a `logger` (the caller holds the build
    lock), a damaged artifact is removed, to be rebuilt, with a warning naming it."""
    try:
        problems = store.verify(kind, version)
    except ArtifactNotFound:
        return False
    if problems and logger is not None:
        logger.warning("%s:%s: damaged (%s); rebuilding it", kind, version, "; ".join(problems)[:500])
        with contextlib.suppress(StoreError):  # another run removed it first
            store.delete(kind, version)
    return not problems


def _is_refs(value: Any) -> bool:
    return isinstance(value, list | tuple) and bool(value) and all(isinstance(v, ArtifactRef) for v in value)


def split_arguments(arguments: dict[str, Any]) -> tuple[dict[str, ArtifactRef], dict[str, Any]]:
    """Input artifacts (a ref; a list of refs named `name.0`, `name.1`, ...; a dict of refs named `name.key`)
    and parameters."""
    inputs: dict[str, ArtifactRef] = {}
    params: dict[str, Any] = {}
    for k, v in arguments.items():
        if isinstance(v, ArtifactRef):
            inputs[k] = v
        elif _is_refs(v):
            inputs.update({f"{k}.{i}": ref for i, ref in enumerate(v)})
        elif isinstance(v, dict) and v and _is_refs(list(v.values())):
            inputs.update({f"{k}.{name}": ref for name, ref in v.items()})
        elif k not in HOW:
            params[k] = v.model_dump(mode="json", exclude=HOW_FIELDS) if isinstance(v, BaseModel) else v
    return inputs, params


def stage_threads(arguments: dict[str, Any]) -> int:
    """The thread count a stage runs with: its parameter section's `threads`, else the default."""
    for value in arguments.values():
        threads = getattr(value, "threads", None)
        if isinstance(threads, int):
            return threads
    return DEFAULT_THREADS


_PROGRESS: dict[str, Any] = {}  # task run id → its progress artifact: a retry moves the same bar


def _progress_artifact(kind: str) -> Callable[[float | None], None]:
    """A Prefect progress artifact for this stage's task run, created on the first report (of any attempt)."""
    run_id = str(task_run.id or "")

    def report(fraction: float | None) -> None:
        if fraction is None:
            return
        try:
            if not run_id or run_id not in _PROGRESS:
                artifact_id = create_progress_artifact(100 * fraction, description=f"{kind}: progress")
                if run_id:
                    _PROGRESS[run_id] = artifact_id
            else:
                update_progress_artifact(_PROGRESS[run_id], 100 * fraction)
        except Exception:  # outside a run context, or the API is busy: progress is a nicety
            pass

    return report


def link_artifact(store: ArtifactStore, kind: str, version: str) -> None:
    """A Prefect artifact (keyed per stage) from the run to the artifact in the store: a link to an object
    store's location, or a local folder's path as text (a browser refuses file:// links from a web page)."""
    location, key = store.location(kind, version), f"{kind.replace('_', '-')}-artifact"
    try:
        if store.is_local:
            create_markdown_artifact(f"`{kind}:{version}` in `{location}`", key=key,
                                     description=f"{kind} artifact in the store ({store.url})")
        else:
            create_link_artifact(location, link_text=f"{kind}:{version}", key=key,
                                 description=f"{kind} artifact in the store ({store.url})")
    except Exception:  # outside a run context, or the API is busy: the link is a nicety
        pass


PUBLISHED, RELEASED = "lexiflow.artifact.published", "lexiflow.artifact.released"


def emit_artifact_event(event: str, ref: ArtifactRef, alias: str = "", payload: dict[str, Any] | None = None) -> None:
    """A Prefect event about an artifact (PUBLISHED when a stage made it, RELEASED when an alias moved to it):
    the resource carries its kind, version, alias (empty for PUBLISHED) and store, which automations and
    deployment triggers match on (docs/operations.md); inside a run, Prefect adds the run as a related resource."""
    from prefect.events import emit_event

    try:
        emit_event(event, resource={"prefect.resource.id": f"lexiflow.artifact.{ref.kind}.{ref.version}",
                                    "prefect.resource.name": f"{ref.kind}@{alias}" if alias else str(ref),
                                    "lexiflow.kind": ref.kind, "lexiflow.version": ref.version,
                                    "lexiflow.alias": alias, "lexiflow.store": ref.store}, payload=payload or {})
    except Exception as exc:  # no server to send it to: the artifact (and an alias) stand regardless
        logging.getLogger("lexiflow").warning("event %s for %s not sent: %s", event, ref, exc)


def stage(kind: str, fingerprint: Callable[[dict], Any] | None = None,
          parameters: Callable[[dict], dict[str, Any]] | None = None,
          variants: tuple[str, dict[str, Any]] | None = None, **task_options: Any):
    """Decorate `build(out, **arguments)`; see the module docstring. `parameters(arguments)`: the
    parameters the artifact depends on, for a builder that reads only part of its arguments
    (default: every argument that is not an input artifact or in HOW). `variants=(argument, {value:
    module, module name or object})`: a stage serving several kinds, each kind's code versioned on its own."""

    def decorate(build: Callable[..., None]):
        choice, kinds = variants or (None, {})

        def modules_for(arguments: dict[str, Any]) -> list[str]:
            return code_modules(build, kinds.get(arguments.get(choice)), kinds.values())

        hashes: dict[str | None, str] = {}  # a plain dict, not functools.cache: Dask pickles the task by value

        def code_hash(variant: str | None) -> str:  # derived on first use: the module is fully defined by then
            if variant not in hashes:
                hashes[variant] = code_version(modules_for({choice: variant}))
            return hashes[variant]
        # Prefect reads parameters from the signature: `store` first, then the builder's own.
        own = list(inspect.signature(build).parameters.values())[1:]
        store_param = inspect.Parameter("store", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=str)
        signature = inspect.Signature([store_param, *own], return_annotation=ArtifactRef)

        def describe(arguments: dict[str, Any]) -> tuple[dict[str, ArtifactRef], dict[str, Any], str]:
            """(inputs, parameters, version) of the artifact these arguments determine. Defaults are
            filled in first, as Prefect does when it calls the task, so a version computed before a
            call (`version_of`) is the one the call publishes, whichever defaults the caller left out."""
            bound = signature.bind_partial(**arguments)
            bound.apply_defaults()
            arguments = bound.arguments
            inputs, params = split_arguments(arguments)
            if parameters is not None:
                params = parameters(arguments)
            if fingerprint is not None:
                params["_content"] = fingerprint(arguments)
            code = code_hash(arguments.get(choice))
            return inputs, params, content_version(kind, {k: r.version for k, r in inputs.items()}, params, code)

        def cache_key(_ctx: Any, arguments: dict[str, Any]) -> str | None:
            try:
                store = ArtifactStore(arguments["store"])
                version = describe(arguments)[2]
                if not reusable(store, kind, version):
                    return None  # nothing (sound) to reuse: a stale Prefect record must not answer for it
            except (OSError, *USER_ERRORS):
                return None  # store unreachable, or bad input: the task itself retries or reports it
            return f"{kind}-{version}-{hashlib.sha256(store.url.encode()).hexdigest()[:12]}"

        @functools.wraps(build)
        def run(*args: Any, **kwargs: Any) -> ArtifactRef:
            arguments = signature.bind(*args, **kwargs).arguments
            store = arguments.pop("store")
            artifacts = ArtifactStore(store)
            inputs, params, version = describe({"store": store, **arguments})
            ref = artifacts.ref(kind, version)
            logger = get_run_logger()
            if reusable(artifacts, kind, version):
                logger.info("%s: reusing %s", kind, ref)
                return ref
            with artifacts.build_lock(kind, version):
                if reusable(artifacts, kind, version, logger):
                    logger.info("%s: reusing %s, built by another run while this one waited", kind, ref)
                    return ref
                run_info = {"flow_run_id": str(flow_run.id or ""), "flow_run_name": flow_run.name or "",
                            "task_run_id": str(task_run.id or "")}
                with artifacts.writer(kind, version, inputs=inputs, parameters=params,
                                      code_version=code_hash(arguments.get(choice)),
                                      run=run_info) as out:
                    out.progress = _progress_artifact(kind)
                    # what a builder keeping partial results per piece keys them by (tasks/pieces.py)
                    out.store_url, out.version, out.code_version = store, version, code_hash(arguments.get(choice))
                    with limit_threads(stage_threads(arguments), f"{kind} threads"):
                        build(out, **arguments)
            _PROGRESS.pop(str(task_run.id or ""), None)  # no later attempt will move this bar
            logger.info("%s: published %s at %s", kind, ref, artifacts.path(kind, version))
            link_artifact(artifacts, kind, version)
            emit_artifact_event(PUBLISHED, ref)
            return ref

        def lookup(*args: Any, **kwargs: Any) -> ArtifactRef:
            """The artifact's reference if the store holds it sound; else `MustRun` (no work, no Prefect)."""
            arguments = signature.bind(*args, **kwargs).arguments
            artifacts, version = ArtifactStore(arguments["store"]), describe(arguments)[2]
            if not reusable(artifacts, kind, version):
                raise MustRun(f"{kind}:{version}")
            return artifacts.ref(kind, version)

        run.__signature__ = signature
        # No tags: Prefect 3.8 acquires a tag-concurrency lease per tagged task run (an API round
        # trip measured at ~2 s here), which made cached reruns slower than the work they skip.
        options = {"name": kind, **STAGE_RETRIES, "cache_key_fn": cache_key,
                   "persist_result": True, "result_serializer": "json", **task_options}
        prefect_task = LookupTask(run, **options)
        prefect_task.lookup = lookup
        prefect_task.code_modules = modules_for  # what the code version hashes, per arguments
        prefect_task.describe = describe  # for tests that publish without Prefect, and planning
        prefect_task.version_of = lambda arguments: describe(arguments)[2]
        return prefect_task

    return decorate
