"""The catalog: what artifacts a store holds, the latest of a kind, and lineage.

It is derived from the manifests themselves (a listing of `<root>/*/*/manifest.json`), not kept
in a separate index, so it is correct by construction when several runs publish at once: an
artifact is in the catalog exactly when its manifest exists. On object stores every listing
starts from the store itself, not the client's listing cache, so one catalog sees artifacts that
other processes or clients published after it was opened.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from lexiflow.storage.built_by import next_step
from lexiflow.storage.formats import DISTINGUISHED_BY  # noqa: F401  (re-exported: the catalog selects by it)
from lexiflow.storage.store import (
    KIND_PATTERN,
    MANIFEST,
    VERSION_PATTERN,
    ArtifactNotFound,
    ArtifactRef,
    ArtifactStore,
    StoreError,
    retry_transient,
    validate_kind,
    validate_version,
)

log = logging.getLogger("lexiflow")


class Catalog:
    """Read side of a store: `Catalog(root).latest("embeddings")`, `.get(kind, version)`, `.lineage(version)`.
    An artifact as a model object: `lexiflow.loaders.load(catalog, kind, version)`."""

    def __init__(self, root: str | os.PathLike[str] | ArtifactStore = "artifacts",
                 storage_options: Mapping[str, Any] | None = None) -> None:
        self.store = root if isinstance(root, ArtifactStore) else ArtifactStore(root, storage_options)
        self.left_out: list[str] = []  # why the last `list` left artifacts out (damaged manifests)

    @retry_transient
    def entries(self, kind: str | None = None) -> list[tuple[str, str]]:
        """(kind, version) of every published artifact. Only `<kind>/<version>/manifest.json` with
        valid names counts: a writer's staging folder (`.staging/...`, which holds a manifest just
        before its atomic rename) is never visible to readers."""
        fs, root = self.store.fs, self.store.root
        self.store.refresh()  # an object store's cached listing would miss what others published since
        pattern = f"{root}/{validate_kind(kind) if kind else '*'}/*/{MANIFEST}"
        found = []
        for path in fs.glob(pattern):
            found_kind, found_version = path.rsplit("/", 3)[-3:-1]
            if KIND_PATTERN.fullmatch(found_kind) and VERSION_PATTERN.fullmatch(found_version):
                found.append((found_kind, found_version))
        return sorted(found)

    def list(self, kind: str | None = None) -> list[dict[str, Any]]:
        """Manifests, oldest first, each with its `path` added. An artifact whose manifest cannot be
        read (damaged, or deleted meanwhile) is left out with a warning: it is no artifact to use,
        and one must not hide the others (`lexiflow artifacts verify` reports it)."""
        manifests, self.left_out = [], []
        for found_kind, version in self.entries(kind):
            try:
                manifest = self.store.manifest(found_kind, version)
            except StoreError as exc:
                log.warning("left out of the catalog: %s", exc)
                self.left_out.append(str(exc))
                continue
            manifest.update(kind=found_kind, version=version, path=self.store.location(found_kind, version))
            manifests.append(manifest)
        return sorted(manifests, key=lambda m: (str(m.get("created", "")), m["kind"], m["version"]))

    def kinds(self) -> list[str]:
        return sorted({m["kind"] for m in self.list()})

    def latest(self, kind: str, /, **selector: Any) -> dict[str, Any] | None:
        """The newest manifest of a kind, among those whose metrics match `selector`, e.g.
        `latest("embeddings", method="glove")`, `latest("tokenizer", kind="bpe")`, `latest("lm", model="lstm")`,
        `latest("tagger", column="upos")` (one run publishes several artifacts of a kind: `DISTINGUISHED_BY`)."""
        found = [m for m in self.list(kind) if all(m["metrics"].get(k) == v for k, v in selector.items())]
        return found[-1] if found else None

    def get(self, kind: str, version: str | None = None, /, **selector: Any) -> dict[str, Any]:
        """A manifest by kind and version (the latest of the kind, matching `selector`, when version is None)."""
        if version is None:
            manifest = self.latest(kind, **selector)
            if manifest is None:
                which = "".join(f" with {k}={v}" for k, v in selector.items())
                raise ArtifactNotFound(f"no {kind} artifact{which} in {self.store.url}; "
                                       f"{next_step(kind, self.store.url, selector)}")
            return manifest
        try:
            manifest = self.store.manifest(kind, validate_version(version))
        except ArtifactNotFound as exc:
            raise ArtifactNotFound(f"{exc}; `lexiflow artifacts list --kind {kind} --store {self.store.url}` shows "
                                   f"the versions there, or {next_step(kind, self.store.url)}") from None
        manifest["path"] = self.store.location(kind, version)
        return manifest

    def find(self, version: str) -> dict[str, Any]:
        """The manifest of a version, whatever its kind."""
        validate_version(version)
        self.store.refresh()
        matches = self.store.fs.glob(f"{self.store.root}/*/{version}/{MANIFEST}")
        if not matches:
            raise ArtifactNotFound(f"no artifact with version {version} in {self.store.url}; "
                                   f"{next_step('', self.store.url)}")
        return self.get(matches[0].rsplit("/", 3)[-3], version)

    def ref(self, kind: str, version: str | None = None, /, **selector: Any) -> ArtifactRef:
        manifest = self.get(kind, version, **selector)
        return self.store.ref(manifest["kind"], manifest["version"])

    def lowercased(self, manifest: dict[str, Any]) -> bool:
        """Whether the corpus an artifact (a tokenizer) was made from is lowercased: the corpus stage
        lowercases (or not) before any tokenizer sees the text, so text meant for it must match."""
        corpus = manifest["inputs"].get("corpus")
        if corpus is None or not self.store.exists("corpus", corpus["version"]):
            return False
        return bool(self.store.manifest("corpus", corpus["version"])["parameters"].get("params", {}).get("lowercase"))

    def lineage(self, version: str, kind: str | None = None) -> dict[str, Any]:
        """The artifact and, recursively, the artifacts it was made from (inputs are looked up by
        kind and version: one manifest read each, no listing)."""
        try:
            manifest = self.find(version) if kind is None else self.get(kind, version)
        except ArtifactNotFound:  # removed (`lexiflow artifacts rm --force`): a run that needs it rebuilds it
            return {"kind": kind, "version": version, "missing": True}
        return {
            "kind": manifest["kind"],
            "version": manifest["version"],
            "parameters": manifest["parameters"],
            "inputs": {name: self.lineage(ref["version"], ref["kind"]) for name, ref in manifest["inputs"].items()},
        }
