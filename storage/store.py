"""Versioned artifacts on a local path or any fsspec URL.

Layout: `<root>/<kind>/<version>/` holds the artifact's files and `manifest.json`. The manifest
is written last, after every file is complete, and is what makes a directory an artifact:
readers (the catalog included) never see one without it.

Publishing is atomic. A writer stages files in `<root>/.staging/<kind>-<version>-<random>/`
(a local temporary folder for remote stores), computes sizes and SHA-256 checksums, writes the
manifest, then:
- local filesystem: renames the staging folder to its final name in one step; if another run
  published the same version first, ours is discarded (same version, same content);
- object stores (no directory rename): uploads the data files under the final prefix, then the
  manifest last, as an exclusive create where the store supports it (S3 `If-None-Match: *`): the
  manifest upload is the commit point, and a concurrent writer of the same version that loses it
  keeps the winner's manifest.
A crash leaves at most a staging folder (local), or data files without a manifest (object
stores: invisible to readers, overwritten by the next publish), which `clean_staging()` removes.
Files other machines must reach while the artifact is built (shard parts of a Dask cluster) go to
the writer's shared folder, `<root>/.staging/<kind>-<version>-<random>-shards/` on every store
(`ArtifactWriter.shared`), removed when the writer ends and by `clean_staging()` after a crash.

Builds of one version on one machine take turns (`build_lock`): a second run waits for the first,
then finds the artifact published instead of computing it again beside it (sharing its checkpoint
folder). Across machines, publishing stays safe as above; only the work may be done twice.

Object stores: `ArtifactStore("s3://bucket/prefix", storage_options={"endpoint_url": ...})`. The
options are remembered for that URL (and every URL under it) in this process, so the
`ArtifactStore(ref.store)` each stage and loader opens finds them; other processes (the CLI, Prefect
workers) take credentials and endpoint from the standard variables (`AWS_ACCESS_KEY_ID`,
`AWS_SECRET_ACCESS_KEY`, `AWS_ENDPOINT_URL`, or fsspec's `FSSPEC_S3_<OPTION>`). Listings and
existence checks drop the filesystem's listing cache first, so a catalog sees what other processes
and clients published since.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import functools
import hashlib
import io
import json
import logging
import math
import numbers
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, BinaryIO

import fsspec
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from lexiflow.storage.parquet_concat import ParquetAssembler, Segment, write_row_groups
from pydantic import BaseModel, ConfigDict

SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
STAGING = ".staging"
SHARED_SUFFIX = "-shards"  # a writer's shared folder in the store's staging area (ArtifactWriter.shared)
SCRATCH = ".scratch"
KIND_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
VERSION_PATTERN = re.compile(r"^[0-9a-f]{16}$")
_FILE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


log = logging.getLogger("lexiflow")
_STORAGE_OPTIONS: dict[str, dict[str, Any]] = {}  # URL prefix -> fsspec options (register_storage_options)


DEFAULT_ROOT = "artifacts"  # the store a command or flow uses when none is named

class StoreError(Exception):
    """A store problem the user can act on: bad name, missing artifact, failed verification."""


class ArtifactNotFound(StoreError):
    """No published artifact of that kind and version (its manifest is missing)."""


class ArtifactDamaged(StoreError):
    """An artifact whose manifest breaks the schema, or whose files do not match it."""


def repair_hint(kind: str, version: str) -> str:
    return f"remove it with `lexiflow artifacts rm {kind}:{version} --force` and run again to rebuild it"


# Every manifest field and its JSON type (docs/artifacts.md): checked whenever a manifest is read.
MANIFEST_FIELDS: dict[str, type | tuple[type, ...]] = {
    "schema_version": int, "kind": str, "version": str, "created": str, "inputs": dict, "parameters": dict,
    "metrics": dict, "files": list, "code_version": str, "run": dict}
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# Parquet tables the store writes carry a CRC per page, checked when they are read (docs/reliability.md).
PARQUET_OPTIONS: dict[str, Any] = {"compression": "zstd", "write_page_checksum": True}
# What pyarrow says about a damaged Parquet file (a plain OSError, as I/O trouble is: told apart by message).
_PARQUET_DAMAGE = re.compile(r"checksum|thrift|magic bytes|Parquet|corrupt|Unexpected end of stream|decompress",
                             re.IGNORECASE)


def manifest_problems(manifest: Any, kind: str, version: str) -> list[str]:
    """What is wrong with a manifest read for `kind:version` (empty when it follows the schema)."""
    if not isinstance(manifest, dict):
        return [f"{kind}:{version}: manifest is not a JSON object"]
    problems = [f"{kind}:{version}: manifest field {name!r} is missing or not a {getattr(types, '__name__', types)}"
                for name, types in MANIFEST_FIELDS.items()
                if not isinstance(manifest.get(name), types) or isinstance(manifest.get(name), bool)]
    if problems:
        return problems
    if manifest["schema_version"] != SCHEMA_VERSION:
        problems.append(f"{kind}:{version}: manifest schema_version {manifest['schema_version']}, this lexiflow "
                        f"reads {SCHEMA_VERSION}")
    if (manifest["kind"], manifest["version"]) != (kind, version):
        problems.append(f"{kind}:{version}: manifest describes {manifest['kind']!r}:{manifest['version']!r}")
    try:
        dt.datetime.fromisoformat(manifest["created"])
    except ValueError:
        problems.append(f"{kind}:{version}: manifest 'created' is not an ISO-8601 time")
    for name, ref in manifest["inputs"].items():
        if not (isinstance(ref, dict) and isinstance(ref.get("kind"), str) and KIND_PATTERN.fullmatch(ref["kind"])
                and isinstance(ref.get("version"), str) and VERSION_PATTERN.fullmatch(ref["version"])):
            problems.append(f"{kind}:{version}: invalid input {name!r}: {ref!r} in the manifest")
    names = set()
    for entry in manifest["files"]:
        name = entry.get("name") if isinstance(entry, dict) else None
        if not (isinstance(name, str) and _FILE.fullmatch(name) and ".." not in name and name != MANIFEST
                and name not in names and isinstance(entry.get("size"), int) and not isinstance(entry["size"], bool)
                and entry["size"] >= 0 and isinstance(entry.get("sha256"), str) and _SHA256.fullmatch(entry["sha256"])):
            problems.append(f"{kind}:{version}: invalid file entry {entry!r} in the manifest")
        names.add(name)
    return problems


RETRY_DELAYS = (0.05, 0.1, 0.25, 0.5, 1.0)  # seconds between attempts of one storage operation
# OSErrors that another attempt would meet again: the path is missing, taken, forbidden or not a folder.
NOT_TRANSIENT = (FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError, NotADirectoryError)


def is_transient(exc: BaseException) -> bool:
    """A storage or network hiccup worth retrying (TimeoutError and ConnectionError are OSErrors)."""
    return isinstance(exc, OSError) and not isinstance(exc, NOT_TRANSIENT)


def retry_transient(fn: Callable) -> Callable:
    """Retry one whole storage operation (open and parse a file, upload a file) on transient I/O
    errors, as object-store clients do; the stage task's retries are the outer layer. Every
    operation wrapped here is idempotent."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return retrying(functools.partial(fn, *args, **kwargs), RETRY_DELAYS)

    return wrapper


def retrying(fn: Callable[[], Any], delays: Sequence[float], worth: Callable[[BaseException], bool] = is_transient,
             on_retry: Callable[[BaseException, float], None] | None = None) -> Any:
    """fn(), run again after each of `delays` while it fails with an error `worth` another attempt
    (`on_retry(error, delay)` told first); the last failure, or one not worth it, is raised."""
    for delay in (*delays, None):
        try:
            return fn()
        except Exception as exc:
            if delay is None or not worth(exc):
                raise
            if on_retry is not None:
                on_retry(exc, delay)
            time.sleep(delay)
    raise AssertionError("unreachable: the last attempt returns or raises")


def validate_kind(kind: str) -> str:
    if not isinstance(kind, str) or not KIND_PATTERN.fullmatch(kind):
        raise StoreError(f"invalid artifact kind {kind!r}: use lowercase letters, digits and '_'")
    return kind


def validate_version(version: str) -> str:
    if not isinstance(version, str) or not VERSION_PATTERN.fullmatch(version):
        raise StoreError(f"invalid artifact version {version!r}: expected 16 hexadecimal digits")
    return version


def validate_file_name(name: str) -> str:
    """Artifact files live flat in their folder: no separators, no `..`, no hidden files."""
    if not isinstance(name, str) or not _FILE.fullmatch(name) or ".." in name:
        raise StoreError(f"invalid artifact file name {name!r}: letters, digits, '.', '_', '-' only")
    return name


def register_storage_options(url: str, options: Mapping[str, Any] | None) -> None:
    """Use fsspec `options` (credentials, `endpoint_url`, ...) for every store at `url` or under it
    in this process; `None` forgets them. `ArtifactStore(url, storage_options=...)` calls this."""
    key = str(url).rstrip("/")
    if options is None:
        _STORAGE_OPTIONS.pop(key, None)
    else:
        _STORAGE_OPTIONS[key] = dict(options)


def storage_options_for(url: str) -> dict[str, Any]:
    """The registered options of the longest registered prefix of `url` (empty when none)."""
    url = str(url).rstrip("/")
    matches = [prefix for prefix in _STORAGE_OPTIONS if url == prefix or url.startswith(prefix + "/")]
    return dict(_STORAGE_OPTIONS[max(matches, key=len)]) if matches else {}


def json_safe(value: Any) -> Any:
    """`value` for strict JSON (docs/artifacts.md, "Non-finite numbers"): a NaN becomes null (no value)
    and an infinity the string "Infinity" or "-Infinity", inside dicts and lists too; JSON has no such
    numbers and strict parsers (jq, JavaScript's JSON.parse, Go, ...) reject Python's NaN/Infinity."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral) and not math.isfinite(value):
        return None if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    return value


def metric_number(value: Any) -> Any:
    """A manifest figure for arithmetic or formatting: "Infinity"/"-Infinity" as floats; anything else
    (numbers, null, other strings) as it is."""
    return float(value) if value in ("Infinity", "-Infinity") else value


def content_version(kind: str, inputs: Mapping[str, str], parameters: Mapping[str, Any], code: str) -> str:
    """The version of an artifact: a hash of everything that determines its content."""
    material = {"kind": kind, "inputs": dict(sorted(inputs.items())), "parameters": parameters, "code": code,
                "schema": SCHEMA_VERSION}
    blob = json.dumps(material, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class ArtifactRef(BaseModel):
    """A small, serializable pointer to a published artifact: what tasks return and pass on."""

    model_config = ConfigDict(frozen=True)
    store: str
    kind: str
    version: str

    @property
    def path(self) -> str:
        return ArtifactStore(self.store).path(self.kind, self.version)

    def __str__(self) -> str:
        return f"{self.kind}:{self.version}"


class ArtifactStore:
    """Write side of the store (publish, verify, delete); `Catalog` is the read side."""

    def __init__(self, root: str | os.PathLike[str] = DEFAULT_ROOT,
                 storage_options: Mapping[str, Any] | None = None) -> None:
        self.url = str(root)
        if storage_options is not None:
            register_storage_options(self.url, storage_options)  # for the ArtifactStore(ref.store) of stages
        self.fs, self.root = fsspec.core.url_to_fs(self.url, **storage_options_for(self.url))
        self.root = self.root.rstrip("/")
        self.is_local = "file" in (self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,))
        if self.is_local:
            self.root = os.path.abspath(self.root)

    def __repr__(self) -> str:
        return f"ArtifactStore({self.url!r})"

    # ---- names ----------------------------------------------------------------------------
    def path(self, kind: str, version: str, name: str | None = None) -> str:
        parts = [self.root, validate_kind(kind), validate_version(version)]
        if name is not None:
            parts.append(validate_file_name(name))
        return "/".join(parts)

    def location(self, kind: str, version: str) -> str:
        """Where readers outside lexiflow find an artifact: a local path, or a full URL (s3://...)."""
        path = self.path(kind, version)
        return path if self.is_local else self.fs.unstrip_protocol(path)

    def ref(self, kind: str, version: str) -> ArtifactRef:
        return ArtifactRef(store=self.url, kind=kind, version=version)

    def check_root(self, create: bool = True) -> None:
        """Fail at once when a local store's folder cannot be made (a file in its path, no
        permission), rather than in the first stage; with `create=False` (readers), when it is not an
        existing folder: a mistyped store, not an empty one. Object stores show such problems on first use."""
        if not self.is_local:
            return
        root = Path(self.root)
        if not create:
            if not root.is_dir():
                why = "not a folder" if root.exists() else "no such folder"
                raise StoreError(f"store {self.url}: {why}; give the store `lexiflow run` wrote, with --store or "
                                 "LEXIFLOW_STORE")
            return
        try:
            Path(self.root).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            blocker = next((p for p in (root, *root.parents) if p.exists()), root)
            why = f"{blocker} is a file, not a folder" if not blocker.is_dir() else exc.strerror
            raise StoreError(f"store {self.url}: cannot create its folder ({why}); choose another store path") \
                from None

    def refresh(self) -> None:
        """Forget the filesystem's cached listings (object stores), so the next existence check or
        listing sees what other processes and clients have published since."""
        if not self.is_local:
            self.fs.invalidate_cache()

    @retry_transient
    def exists(self, kind: str, version: str) -> bool:
        self.refresh()
        return self.fs.exists(self.path(kind, version, MANIFEST))

    @retry_transient
    def manifest(self, kind: str, version: str) -> dict[str, Any]:
        """The manifest of `kind:version`, checked against the schema (`ArtifactDamaged` if it breaks it)."""
        self.refresh()
        try:
            with self.fs.open(self.path(kind, version, MANIFEST), "r") as f:
                manifest = json.load(f)
        except FileNotFoundError:
            raise ArtifactNotFound(f"no artifact {kind}:{version} in {self.url}") from None
        except (ValueError, UnicodeDecodeError) as exc:  # only tampering can do this: manifests are published whole
            raise ArtifactDamaged(f"{kind}:{version}: manifest is not valid JSON ({exc})") from None
        if problems := manifest_problems(manifest, kind, version):
            raise ArtifactDamaged("; ".join(problems))
        return manifest

    # ---- reading files --------------------------------------------------------------------
    def open(self, kind: str, version: str, name: str, mode: str = "rb"):
        return self.fs.open(self.path(kind, version, name), mode)

    def read_parquet(self, kind: str, version: str, name: str) -> pl.DataFrame:
        return pl.from_arrow(self.read_arrow(kind, version, name))

    @retry_transient
    def read_arrow(self, kind: str, version: str, name: str) -> pa.Table:
        with self.open(kind, version, name) as f, self.damage_check(kind, version, name):
            return pq.read_table(f, page_checksum_verification=True)

    @contextmanager
    def damage_check(self, kind: str, version: str, name: str) -> Iterator[None]:
        """Around a read of a Parquet file of an artifact: a damaged file (page checksum, footer) is an
        `ArtifactDamaged` naming it and the repair, not an I/O error to retry."""
        try:
            yield
        except (OSError, pa.ArrowInvalid) as exc:
            if type(exc) not in (OSError, pa.ArrowInvalid) or not _PARQUET_DAMAGE.search(str(exc)):
                raise
            why = " ".join(str(exc).split())[:160]
            raise ArtifactDamaged(f"{kind}:{version}/{name}: damaged ({why}); {repair_hint(kind, version)}") from None

    @retry_transient
    def read_json(self, kind: str, version: str, name: str) -> Any:
        with self.open(kind, version, name, "r") as f:
            return json.load(f)

    @retry_transient
    def read_text(self, kind: str, version: str, name: str) -> str:
        with self.open(kind, version, name, "r") as f:
            return f.read()

    @contextmanager
    def local_copy(self, kind: str, version: str, name: str) -> Iterator[Path]:
        """A local path to an artifact file (downloaded for remote stores), for libraries that need
        one; its SHA-256 is checked against the manifest first (they read it whole anyway)."""
        entries = [e for e in self.manifest(kind, version)["files"] if e["name"] == name]
        path = self.path(kind, version, name)
        if self.is_local:
            self._check_copies(kind, version, entries, Path(path).parent)
            yield Path(path)
            return
        with tempfile.TemporaryDirectory(prefix="lexiflow-") as tmp:
            local = Path(tmp) / name
            self.download(path, local)
            self._check_copies(kind, version, entries, Path(tmp))
            yield local

    @contextmanager
    def local_dir(self, kind: str, version: str) -> Iterator[Path]:
        """A local folder holding the artifact's files (downloaded for remote stores), for
        `load(dir)` methods; every file's SHA-256 is checked against the manifest first."""
        entries = self.manifest(kind, version)["files"]
        path = self.path(kind, version)
        if self.is_local:
            self._check_copies(kind, version, entries, Path(path))
            yield Path(path)
            return
        with tempfile.TemporaryDirectory(prefix="lexiflow-") as tmp:
            for entry in entries:
                self.download(self.path(kind, version, entry["name"]), Path(tmp) / entry["name"])
            self._check_copies(kind, version, entries, Path(tmp))
            yield Path(tmp)

    @staticmethod
    def _check_copies(kind: str, version: str, entries: list[dict[str, Any]], folder: Path) -> None:
        """Files about to be read whole (model folders, word2vec files) against their manifest entries."""
        for entry in entries:
            file = folder / entry["name"]
            if not file.is_file() or file.is_symlink():
                raise ArtifactDamaged(f"{kind}:{version}/{entry['name']}: missing or not a plain file; "
                                      f"{repair_hint(kind, version)}")
            with file.open("rb") as f:
                if _sha256(f) != entry["sha256"]:
                    raise ArtifactDamaged(f"{kind}:{version}/{entry['name']}: checksum differs from the manifest; "
                                          f"{repair_hint(kind, version)}")

    @retry_transient
    def download(self, path: str, local: Path) -> None:
        """Copy one file of the store to a local path (retried on transient errors, as reads are)."""
        self.fs.get_file(path, str(local))

    # ---- writing --------------------------------------------------------------------------
    @contextmanager
    def writer(
        self,
        kind: str,
        version: str,
        *,
        inputs: Mapping[str, ArtifactRef] | None = None,
        parameters: Mapping[str, Any] | None = None,
        code_version: str = "",
        run: Mapping[str, Any] | None = None,
    ) -> Iterator[ArtifactWriter]:
        """Stage an artifact; publish it on normal exit, discard everything on an exception."""
        validate_kind(kind), validate_version(version)
        with self._staging_folder(kind, version) as (staging, shared):
            out = ArtifactWriter(staging, self._scratch(kind, version), staging.with_name(staging.name + "-work"),
                                 shared)
            self._restore_scratch(kind, version, out.scratch)
            try:
                yield out
                manifest = {
                    "schema_version": SCHEMA_VERSION,
                    "kind": kind,
                    "version": version,
                    "created": dt.datetime.now(dt.UTC).isoformat(),
                    "inputs": {name: {"kind": r.kind, "version": r.version} for name, r in (inputs or {}).items()},
                    "parameters": dict(parameters or {}),
                    "metrics": out.metrics,
                    "files": out.file_entries(),
                    "code_version": code_version,
                    "run": dict(run or {}),
                }
                (staging / MANIFEST).write_text(json.dumps(json_safe(manifest), indent=2, default=str, allow_nan=False))
                self._publish(staging, kind, version)
                self._drop_scratch(kind, version, out.scratch)  # resumable state is no longer needed
            except BaseException:
                self._save_scratch(kind, version, out.scratch)
                raise

    @contextmanager
    def _staging_folder(self, kind: str, version: str) -> Iterator[tuple[Path, str]]:
        """A new staging folder, and a lock file beside it held while this writer lives: `gc` removes
        the folders whose lock is free (killed writers; an OS lock goes with its process). Local stores
        stage in `<root>/.staging/`, object stores in the temp folder, named after the store.
        Also yields the writer's shared folder (`ArtifactWriter.shared`): `<store>/.staging/<name>-shards`,
        a path or URL every machine that reaches the store reaches too; removed with the rest."""
        name = f"{kind}-{version}-{os.urandom(6).hex()}"
        if self.is_local:
            parent, prefix = Path(self.root) / STAGING, ""
        else:
            parent, prefix = Path(tempfile.gettempdir()), f"lexiflow-{self._store_id()}-"
        parent.mkdir(parents=True, exist_ok=True)
        staging = parent / f"{prefix}{name}"
        shared = f"{self.root}/{STAGING}/{name}{SHARED_SUFFIX}"
        with held_lock_file(staging.with_name(staging.name + ".lock")):  # before the folder: gc never sees it unlocked
            staging.mkdir()
            try:
                yield staging, shared if self.is_local else self.fs.unstrip_protocol(shared)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
                shutil.rmtree(staging.with_name(staging.name + "-work"), ignore_errors=True)
                self._remove_shared(shared)

    def _remove_shared(self, path: str) -> None:
        """Best effort (gc removes what stays: `leftovers`)."""
        if self.is_local:
            shutil.rmtree(path, ignore_errors=True)
            return
        with suppress(OSError):
            self.fs.invalidate_cache(path)
            if self.fs.exists(path):
                self.fs.rm(path, recursive=True)


    @contextmanager
    def build_lock(self, kind: str, version: str) -> Iterator[None]:
        """Hold the right to build `kind:version` on this machine (an OS file lock, so a killed holder
        releases it). The caller checks `exists` once it holds the lock: another run may have
        published the version while this one waited. The lock file goes when the block ends
        normally; a run that waited on it then finds it gone and locks the file now at its path, so
        a newcomer never builds beside it."""
        validate_kind(kind), validate_version(version)
        path = self._lock_path(kind, version)
        path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            handle = path.open("a")
            try:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    log.info("%s:%s: another run is building it on this machine; waiting for it", kind, version)
                    fcntl.flock(handle, fcntl.LOCK_EX)
                with suppress(FileNotFoundError):
                    if os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino:
                        break  # the file at the path is the one locked
            except BaseException:
                handle.close()
                raise
            handle.close()  # the run waited for removed this file: lock the one at the path now
        with handle:
            yield
            path.unlink(missing_ok=True)

    def _lock_path(self, kind: str, version: str) -> Path:
        """Local stores: beside the scratch folder. Object stores: a folder of this user's in the temp
        folder (a shared one may belong to another user), one file per store, kind and version."""
        if self.is_local:
            return self._scratch(kind, version).with_name(f"{kind}-{version}.lock")
        return self._temp_folder("locks") / f"{self._store_id()}-{kind}-{version}.lock"

    def _temp_folder(self, purpose: str) -> Path:
        return Path(tempfile.gettempdir()) / f"lexiflow-{purpose}-{os.getuid()}"

    def _store_id(self) -> str:
        return hashlib.sha256(self.url.encode()).hexdigest()[:12]

    def _scratch(self, kind: str, version: str) -> Path:
        """Where a builder keeps resumable state (checkpoints) across crashes and retries; it
        survives a failed build and is removed once the artifact is published. Object stores: a
        local folder, saved to `<root>/.scratch/<kind>-<version>/` when a build fails and restored
        by the next attempt, on this machine or another worker. That local folder is this user's and
        this store's: builds of one version for two stores run at once (their locks differ) and must
        not resume from, or delete, each other's checkpoints."""
        if self.is_local:
            return Path(self.root) / SCRATCH / f"{kind}-{version}"
        return self._temp_folder("scratch") / f"{self._store_id()}-{kind}-{version}"

    def _remote_scratch(self, kind: str, version: str) -> str:
        return f"{self.root}/{SCRATCH}/{kind}-{version}"

    @retry_transient
    def _restore_scratch(self, kind: str, version: str, scratch: Path) -> None:
        if self.is_local or (scratch.is_dir() and any(scratch.iterdir())):
            return  # local stores keep scratch in place; a local copy is at least as recent
        remote = self._remote_scratch(kind, version)
        self.refresh()
        if not self.fs.exists(remote):
            return
        download = retry_transient(self.fs.get_file)
        for path in self.fs.find(remote):
            local = scratch / path[len(remote) + 1:]
            local.parent.mkdir(parents=True, exist_ok=True)
            download(path, str(local))

    def _save_scratch(self, kind: str, version: str, scratch: Path) -> None:
        """After a failed build on an object store, upload its resumable state (best effort: the
        build's own error is what the caller must see)."""
        if self.is_local or not scratch.is_dir():
            return
        remote, upload = self._remote_scratch(kind, version), retry_transient(self.fs.put_file)
        try:
            for file in sorted(scratch.rglob("*")):
                if file.is_file():
                    upload(str(file), f"{remote}/{file.relative_to(scratch).as_posix()}")
        except OSError as exc:
            log.warning("%s:%s: could not save resumable state to %s (%s)", kind, version, remote, exc)

    def _drop_scratch(self, kind: str, version: str, scratch: Path) -> None:
        shutil.rmtree(scratch, ignore_errors=True)
        if not self.is_local:
            try:
                if self.fs.exists(remote := self._remote_scratch(kind, version)):
                    self.fs.rm(remote, recursive=True)
            except OSError:  # left for clean_staging; never an artifact
                pass

    def _publish(self, staging: Path, kind: str, version: str) -> None:
        final = self.path(kind, version)
        if self.is_local:
            Path(final).parent.mkdir(parents=True, exist_ok=True)
            # On disk before the rename: after a power loss the published folder must not hold files
            # the page cache never wrote (empty or short, under a manifest that says otherwise).
            for path in (*staging.iterdir(), staging):
                _fsync(path)
            for attempt in range(2):
                try:
                    os.rename(staging, final)  # atomic; fails if another run published it first
                    _fsync(Path(final).parent)  # the rename itself, and a new kind's folder
                    _fsync(Path(self.root))
                    return
                except OSError:
                    if self.exists(kind, version):
                        return  # published by another run: same version, same content
                    if attempt or not os.path.isdir(final):
                        raise
                    self._discard_orphan(final)
            return
        # Object store: no rename. Data files under the final prefix first (invisible without a
        # manifest), then the manifest as an exclusive create: the commit point.
        if self.exists(kind, version):
            return  # another run published it meanwhile: same version, same content
        upload = retry_transient(self.fs.put_file)  # a repeated upload writes the same bytes again
        files = [file for file in sorted(staging.iterdir()) if file.name != MANIFEST]
        for file in files:
            upload(str(file), f"{final}/{file.name}")
        try:
            upload(str(staging / MANIFEST), f"{final}/{MANIFEST}", mode="create")
        except FileExistsError:  # a concurrent writer committed first (or our own acknowledgement was lost)
            ours = json.loads((staging / MANIFEST).read_text())["files"]
            if self.manifest(kind, version)["files"] == ours:
                return  # its files are byte for byte ours: its manifest describes what is there
            # A builder that is not deterministic: our uploads may have replaced some of its files.
            # Upload ours again, all of them, then our manifest: it describes the files now there.
            log.warning("%s:%s: a concurrent writer published different bytes; publishing ours", kind, version)
            for file in files:
                upload(str(file), f"{final}/{file.name}")
            upload(str(staging / MANIFEST), f"{final}/{MANIFEST}")

    def _discard_orphan(self, final: str) -> None:
        """Move aside a folder without a manifest at an artifact's place (the files an interrupted
        upload left: never an artifact, since local writers only ever rename whole folders)."""
        trash = Path(self.root) / STAGING / f"orphan-{os.path.basename(final)}-{os.urandom(4).hex()}"
        try:
            os.rename(final, trash)
        except FileNotFoundError:
            return  # another writer moved it first
        shutil.rmtree(trash, ignore_errors=True)

    def delete(self, kind: str, version: str) -> None:
        """Remove an artifact: manifest first, so readers stop seeing it before its files go."""
        if not self.exists(kind, version):
            raise StoreError(f"no artifact {kind}:{version} in {self.url}")
        self.fs.rm(self.path(kind, version, MANIFEST))
        self.fs.rm(self.path(kind, version), recursive=True)

    def create_file(self, path: str, data: bytes) -> bool:
        """Write a small file at `path` (under the root) whole, unless one is there: an exclusive create,
        True when this call made it, False when the file was there already. Readers see all of it or
        nothing: local stores link a complete temporary file into place (a link never replaces a file),
        object stores upload it in one PUT with `If-None-Match: *` (`put_file(mode="create")`, as
        manifests are committed). A retried upload whose first acknowledgement was lost finds its own
        bytes there, which counts as made by this call."""
        if self.is_local:
            folder = Path(self.root) / STAGING
            folder.mkdir(parents=True, exist_ok=True)
            parent = self._local_folder_inside(path)
            temporary = folder / f"create-{os.urandom(6).hex()}.tmp"
            # Its lock file is held while it lives, as a staging folder's is: gc removes it only once its writer died.
            with held_lock_file(temporary.with_name(temporary.name + ".lock")):
                try:
                    temporary.write_bytes(data)
                    _fsync(temporary)
                    try:
                        os.link(temporary, path)
                    except FileExistsError:
                        return False
                    _fsync(parent)
                    return True
                finally:
                    temporary.unlink(missing_ok=True)
        with tempfile.NamedTemporaryFile(prefix="lexiflow-") as temporary:
            temporary.write(data)
            temporary.flush()
            try:
                retry_transient(self.fs.put_file)(temporary.name, path, mode="create")
            except FileExistsError:
                self.refresh()
                with self.fs.open(path, "rb") as f:
                    return f.read() == data
        return True

    def _local_folder_inside(self, path: str) -> Path:
        """The folder of `path` (a local store's file), made where missing, refusing a symbolic link or a file on
        the way from the root: a link planted in the store must not lead a write outside it."""
        root, parent = Path(self.root), Path(path).parent
        try:
            parts = parent.relative_to(root).parts
        except ValueError:
            raise StoreError(f"{path}: not inside the store {self.url}") from None
        here = root
        for part in parts:
            here = here / part
            if here.is_symlink():
                raise StoreError(f"{here}: a symbolic link in the store; lexiflow writes no file through one (remove "
                                 "it, or restore the folder from a backup)")
            if here.exists() and not here.is_dir():
                raise StoreError(f"{here}: a file where the store keeps a folder; restore it from a backup")
        parent.mkdir(parents=True, exist_ok=True)
        return parent

    def clean_staging(self, older_than: float = 0.0) -> int:
        """Remove what killed writers left (`leftovers`); returns how many entries were removed."""
        found = self.leftovers(older_than)
        self.remove_leftovers(found)
        return len(found)

    def leftovers(self, older_than: float = 0.0) -> list[str]:
        """What killed or crashed writers left, as paths (local) or URLs (object stores):
        - staging folders, their work and shared (`-shards`) folders and lock files: in `<root>/.staging/`
          (local stores) or, for object stores, in this machine's temp folder (`lexiflow-<store id>-<kind>-
          <version>-...`).
          A live writer holds its lock file (an OS lock, released when its process dies): those whose
          lock is free go at once, those whose lock is held never; an entry without a lock file (a
          writer from before locks) goes once `older_than` seconds old;
        - object stores: saved scratch state (`.scratch`), anything in `.staging` (writers' shared folders,
          except those of writers alive on this machine), and artifact folders
          without a manifest (an upload that never reached its commit point), once `older_than` seconds
          old (age = newest file: an upload at work on another machine looks like a crashed one, and
          holds no lock here).
        Local `.scratch` folders are resumable state and stay (the next build of the version resumes)."""
        self.refresh()
        now, found = time.time(), []
        folder = Path(self.root) / STAGING if self.is_local else Path(tempfile.gettempdir())
        prefix = "" if self.is_local else f"lexiflow-{self._store_id()}-"
        if folder.is_dir():
            for entry in sorted(folder.iterdir()):
                if not entry.name.startswith(prefix):
                    continue
                base = entry.name.removesuffix(".lock").removesuffix("-work").removesuffix(SHARED_SUFFIX)
                alive = _held(folder / f"{base}.lock")
                if alive is False or (alive is None and now - _newest_mtime(entry) >= older_than):
                    found.append(str(entry))
        if not self.is_local:
            found += self._remote_leftovers(now, older_than)
        return found

    def _remote_leftovers(self, now: float, older_than: float) -> list[str]:
        found = []
        for folder in (f"{self.root}/{STAGING}", f"{self.root}/{SCRATCH}"):
            if not self.fs.exists(folder):
                continue
            for entry in self.fs.ls(folder, detail=True):
                writer = entry["name"].rsplit("/", 1)[-1].removesuffix(SHARED_SUFFIX)
                if _held(Path(tempfile.gettempdir()) / f"lexiflow-{self._store_id()}-{writer}.lock"):
                    continue  # the shared folder of a writer alive on this machine
                newest = max((_mtime(info) for info in self.fs.find(entry["name"], detail=True).values()),
                             default=_mtime(entry))
                if now - newest >= older_than:
                    found.append(entry["name"])
        folders: dict[str, list[dict[str, Any]]] = {}
        for path, info in self.fs.find(self.root, detail=True).items():
            parts = path[len(self.root) + 1:].split("/")
            if len(parts) == 3 and KIND_PATTERN.fullmatch(parts[0]) and VERSION_PATTERN.fullmatch(parts[1]):
                folders.setdefault(f"{self.root}/{parts[0]}/{parts[1]}", []).append(info)
        for folder, infos in folders.items():
            if all(not i["name"].endswith("/" + MANIFEST) for i in infos) and \
                    now - max(map(_mtime, infos)) >= older_than:
                found.append(folder)
        return [self.fs.unstrip_protocol(path) for path in found]

    def remove_leftovers(self, found: list[str]) -> None:
        for entry in found:
            if "://" in entry:
                with suppress(FileNotFoundError):
                    self.fs.rm(self.fs._strip_protocol(entry), recursive=True)
            elif os.path.isdir(entry) and not os.path.islink(entry):
                shutil.rmtree(entry, ignore_errors=True)
            else:
                Path(entry).unlink(missing_ok=True)

    @retry_transient
    def verify(self, kind: str, version: str, full: bool = False) -> list[str]:
        """Problems with an artifact: its manifest against the schema, its files against the manifest
        (present, plain files, sizes; checksums too with `full`), and any symbolic link in its folder.
        Empty when sound. One listing of the folder, so cheap enough to check each artifact a run reuses."""
        try:
            manifest = self.manifest(kind, version)  # drops cached listings: sizes are the store's own
        except ArtifactDamaged as exc:
            return [str(exc)]
        listing = {info["name"].rstrip("/").rsplit("/", 1)[-1]: info
                   for info in self.fs.ls(self.path(kind, version), detail=True)}
        problems = [f"{kind}:{version}/{name}: a symbolic link{_link_target(info)}; artifacts hold plain files only "
                    "(export never follows links)" for name, info in sorted(listing.items()) if info.get("islink")]
        for entry in manifest["files"]:
            name, info = entry["name"], listing.get(entry["name"])
            if info is None or (info.get("type") != "file" and not info.get("islink")):
                problems.append(f"{kind}:{version}/{name}: missing")
            elif info.get("islink"):
                continue  # reported above
            elif info["size"] != entry["size"]:
                problems.append(f"{kind}:{version}/{name}: size differs from the manifest")
            elif full:
                with self.fs.open(self.path(kind, version, name), "rb") as f:
                    if _sha256(f) != entry["sha256"]:
                        problems.append(f"{kind}:{version}/{name}: checksum differs from the manifest")
        return problems


def write_segment(rows: pl.DataFrame | pa.Table, schema: pa.Schema, row_group_size: int,
                  path: str | None = None) -> Segment:
    """`rows` as row groups of a table of `schema` written with the store's options, for
    `ArtifactWriter.parquet_parts` to append: in memory (`path` None) or as the file at `path` (a local path
    or a store URL)."""
    table = rows.to_arrow() if isinstance(rows, pl.DataFrame) else rows
    table = table.select(schema.names).cast(schema)
    if path is None:
        encoded = pa.BufferOutputStream()
        write_row_groups(encoded, table, row_group_size, **PARQUET_OPTIONS)
        return Segment(encoded.getvalue().to_pybytes(), table.num_rows)
    with fsspec.open(path, "wb", **storage_options_for(path)) as f:
        write_row_groups(f, table, row_group_size, **PARQUET_OPTIONS)
    return Segment(path, table.num_rows)


def read_segment(segment: Segment, columns: list[str] | None = None) -> pl.DataFrame:
    """The rows of a `write_segment` (its `columns`)."""
    if isinstance(segment.source, bytes):
        return pl.read_parquet(io.BytesIO(segment.source), columns=columns)
    with fsspec.open(segment.source, "rb", **storage_options_for(segment.source)) as f:
        return pl.read_parquet(f, columns=columns)


class ArtifactWriter:
    """Files and metrics of an artifact being staged. Paths are local, whatever the store."""

    def __init__(self, folder: Path, scratch: Path, work: Path, shared: str | None = None) -> None:
        self.folder = folder
        self.scratch = scratch  # resumable state, kept until the artifact is published
        # This writer's own files of this attempt (shard results, a job for DDP ranks): unlike the
        # scratch folder, no other writer of the same version shares it. Removed when the writer ends.
        self.work = work
        # The same, for files other machines read or write (shard parts on a cluster): a folder in the
        # store's staging area, as a path (local stores) or URL (object stores: open it with fsspec).
        self.shared = shared if shared is not None else str(work) + SHARED_SUFFIX
        self.metrics: dict[str, Any] = {}
        self.progress: Callable[[float | None], None] | None = None  # set by the caller, fed by the builder
        # sha256 of files hashed as they were written (`parquet_parts`), with the (inode, size, mtime) they had
        # then: `file_entries` need not read them back (a 400 MB file: ~0.3 s at the end of the stage)
        self._digests: dict[str, tuple[str, tuple[int, int, int]]] = {}

    def path(self, name: str) -> Path:
        """Where to write file `name` (for libraries that write to a path themselves)."""
        return self.folder / validate_file_name(name)

    def write_parquet(self, name: str, data: pl.DataFrame | pa.Table, schema: pa.Schema | None = None,
                      row_group_size: int | None = None) -> Path:
        """`row_group_size`: rows per row group (smaller groups let shards read only their rows)."""
        table = data.to_arrow() if isinstance(data, pl.DataFrame) else data
        if schema is not None:
            table = table.select(schema.names).cast(schema)
        path = self.path(name)
        write_row_groups(path, table, row_group_size, **PARQUET_OPTIONS)  # as parquet_parts writes rows
        return path

    @contextmanager
    def parquet_parts(self, name: str, schema: pa.Schema, row_group_size: int) -> Iterator[Callable[[Any], None]]:
        """Write a table part by part, in order, without holding it whole: yields `write(part)`, a part being
        a polars or Arrow table, encoded here, or a `Segment`: row groups encoded elsewhere (a shard worker's
        `write_segment`), appended byte for byte. Tables are regrouped into row groups of exactly
        `row_group_size`, as `write_parquet` cuts the whole table (the same bytes however the rows came); a
        segment ends the row group before it."""
        pending: list[pa.Table] = []
        path = self.path(name)
        with open(path, "wb") as f:
            sink = _Digesting(f)
            assembler = ParquetAssembler(sink)
            empty = io.BytesIO()
            pq.ParquetWriter(empty, schema, **PARQUET_OPTIONS).close()
            assembler.append(empty)  # the footer's template: schema and writer (and the file of no rows)

            def flush(all_rows: bool) -> None:
                held = pa.concat_tables(pending).combine_chunks()
                rows = held.num_rows if all_rows else held.num_rows - held.num_rows % row_group_size
                if rows:
                    encoded = io.BytesIO()
                    write_row_groups(encoded, held.slice(0, rows), row_group_size, **PARQUET_OPTIONS)
                    assembler.append(encoded)
                    pending[:] = [held.slice(rows)]

            def write(part: Any) -> None:
                if isinstance(part, Segment):  # its row groups as they are, after the rows before it
                    if not part.rows:
                        return
                    if pending:
                        flush(all_rows=True)
                        pending.clear()
                    with (io.BytesIO(part.source) if isinstance(part.source, bytes)
                          else fsspec.open(part.source, "rb", **storage_options_for(part.source))) as source:
                        assembler.append(source, f"{name} ({part!r})")
                    return
                table = part.to_arrow() if isinstance(part, pl.DataFrame) else part
                pending.append(table.select(schema.names).cast(schema))
                flush(all_rows=False)

            yield write
            if pending:
                flush(all_rows=True)
            assembler.close()
        self._digests[name] = (sink.digest.hexdigest(), _identity(path))

    def write_json(self, name: str, obj: Any) -> Path:
        path = self.path(name)
        path.write_text(json.dumps(obj, indent=2, default=str))
        return path

    def write_text(self, name: str, text: str) -> Path:
        path = self.path(name)
        path.write_text(text, encoding="utf-8")
        return path

    def file_entries(self) -> list[dict[str, Any]]:
        entries = []
        for file in sorted(self.folder.iterdir()):
            if file.name == MANIFEST:
                continue
            if file.is_symlink() or not file.is_file():  # a link could point readers outside the store
                raise StoreError(f"artifact files must be plain files, found {file.name!r}")
            digest, identity = self._digests.get(file.name, ("", None))
            if identity != _identity(file):  # not written by parquet_parts, or changed since
                with file.open("rb") as f:
                    digest = _sha256(f)
            entries.append({"name": file.name, "size": file.stat().st_size, "sha256": digest})
        return entries


class _Digesting:
    """A binary file written in order, hashed (sha256) as it is written."""

    def __init__(self, f: BinaryIO) -> None:
        self.f, self.digest = f, hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        return self.f.write(data)


def _identity(path: Path) -> tuple[int, int, int]:
    """What changes when a file is replaced or rewritten: inode, size, modification time."""
    stat = path.stat()
    return stat.st_ino, stat.st_size, stat.st_mtime_ns


@contextmanager
def held_lock_file(path: Path) -> Iterator[None]:
    """Create the lock file `path` and hold an OS lock on it while the block runs (a killed holder releases it),
    then remove it. Locked before anything it guards exists, and checked to be the file still at its path: a `gc`
    that found it free in the instant between its creation and the lock has removed it, so lock a new one."""
    with lock_file_at(path, fcntl.LOCK_EX):
        try:
            yield
        finally:
            path.unlink(missing_ok=True)


@contextmanager
def lock_file_at(path: Path, mode: int, waiting: Callable[[], None] | None = None) -> Iterator[Any]:
    """Hold an OS lock (`mode`: fcntl.LOCK_EX or LOCK_SH) on the file at `path`, made if missing, while the block
    runs; yields its open file. The file locked is the one at the path when the lock is taken: one removed while
    this caller waited (by its last holder, or a `gc`) is let go, and the new one at the path locked.
    `waiting()` is called before the caller waits for another holder."""
    while True:
        handle = path.open("a")
        try:
            fcntl.flock(handle, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            if waiting is not None:
                waiting()
            fcntl.flock(handle, mode)
        try:
            if os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino:
                break
        except FileNotFoundError:
            pass
        handle.close()
    with handle:
        yield handle


def _held(lock: Path) -> bool | None:
    """Whether a writer holds this lock file (None: there is none)."""
    try:
        handle = lock.open("r")  # never creates it
    except FileNotFoundError:
        return None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
    return False  # closing the handle released our lock


def _newest_mtime(path: Path) -> float:
    """Modification time of a local file, or of the newest entry in a folder."""
    times = [0.0]
    for entry in (path, *(path.rglob("*") if path.is_dir() else ())):
        with suppress(FileNotFoundError):  # removed meanwhile (its writer finished)
            times.append(entry.lstat().st_mtime)
    return max(times)


def _link_target(info: Mapping[str, Any]) -> str:
    with suppress(OSError, KeyError):
        return f" to {os.readlink(info['name'])!r}"
    return ""


def _mtime(info: Mapping[str, Any]) -> float:
    """Modification time (epoch seconds) from an fsspec `info` entry, local or object store."""
    value = info.get("LastModified", info.get("mtime", info.get("created", 0.0)))
    return value.timestamp() if isinstance(value, dt.datetime) else float(value or 0.0)


def _fsync(path: Path) -> None:
    """Flush a file's or a folder's data and metadata to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(f) -> str:
    digest = hashlib.sha256()
    for block in iter(lambda: f.read(1 << 20), b""):
        digest.update(block)
    return digest.hexdigest()
