"""Versioned artifacts on a local path or any fsspec URL: `ArtifactStore` (the write side, the catalog being the
read side) and `ArtifactRef`, the small pointer tasks pass on.

Layout: `<root>/<kind>/<version>/` holds the artifact's files and `manifest.json`. The manifest
is written last, after every file is complete, and is what makes a directory an artifact:
readers (the catalog included) never see one without it.

The store's parts, one job each: names, versions and the manifest schema (`manifests.py`); reading,
checking and deleting files, local or fsspec (`files.py`); staging, atomic publishing, build locks
and leftovers (`publishing.py`); writing a staged artifact's files (`writer.py`); lock files
(`lockfiles.py`); retries of transient errors (`transient.py`).

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
import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import fsspec
from lexiflow.storage.files import StoreFiles, register_storage_options, storage_options_for
from lexiflow.storage.lockfiles import held_lock_file
from lexiflow.storage.manifests import (
    KIND_PATTERN,
    MANIFEST,
    SCHEMA_VERSION,
    VERSION_PATTERN,
    ArtifactDamaged,
    ArtifactNotFound,
    StoreError,
    json_safe,
    manifest_problems,
    repair_hint,
    validate_file_name,
    validate_kind,
    validate_version,
)
from lexiflow.storage.publishing import Publishing
from lexiflow.storage.transient import is_transient, retry_transient, retrying
from lexiflow.storage.writer import PARQUET_OPTIONS, ArtifactWriter, read_segment, write_segment
from pydantic import BaseModel, ConfigDict

# Names of the store's parts that other modules import from here. Versioned modules (tasks/, storage/pieces.py,
# storage/formats.py) keep importing them from here: a changed import line would change their code versions, so
# every artifact's version (tasks/stage.py); storage/catalog.py and storage/releases.py: many names each.
__all__ = [
    "DEFAULT_ROOT", "KIND_PATTERN", "MANIFEST", "PARQUET_OPTIONS", "VERSION_PATTERN", "ArtifactDamaged",
    "ArtifactNotFound", "ArtifactRef", "ArtifactStore", "ArtifactWriter", "StoreError", "held_lock_file",
    "is_transient", "read_segment", "repair_hint", "retry_transient", "retrying", "storage_options_for",
    "validate_kind", "validate_version", "write_segment"]

DEFAULT_ROOT = "artifacts"  # the store a command or flow uses when none is named


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


class ArtifactStore(StoreFiles, Publishing):
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
