"""Partial results per source piece, kept in the store across artifact versions (docs/design.md,
"Incremental rebuilds"), and their garbage collection.

Layout, beside the artifacts (a dot folder: no kind, never listed by the catalog):

    <root>/.pieces/<stage>/<key>/piece.json        the commit point: the piece's metadata and its files' names
    <root>/.pieces/<stage>/<key>/<name>-<random>   its data files (Arrow IPC), written before piece.json
    <root>/.pieces/uses/<kind>/<version>.json      the pieces an artifact version is made of: {stage: [key, ...]}

A piece is written as an artifact is committed: its data files first, under names of their own (a random
suffix, so two writers of one key never write the same file), then `piece.json`, created exclusively
(`ArtifactStore.create_file`: a link of a complete file on a local filesystem, one PUT with
`If-None-Match: *` on an object store). Readers only look for `piece.json`; a writer that loses the race
leaves data files no `piece.json` names, which `garbage` removes once old. A key is a hash of what the piece's
content depends on (the source's content, the parameters, the code), so two writers of one key write the same
content and either's commit serves.

An artifact's builder writes its `uses` record before it writes any piece; `garbage` keeps the pieces some
artifact in the store uses, and those of records younger than the grace period (a build at work, whose
artifact is not published yet); everything else under `.pieces/` older than the grace period goes.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

from lexiflow.storage.store import KIND_PATTERN, VERSION_PATTERN, ArtifactStore, retry_transient

PIECES = ".pieces"
USES = "uses"
COMMIT = "piece.json"


def piece_key(salt: str, identity: Any) -> str:
    """The key of a piece: what it depends on, beyond the `salt` its space gives (code, parameters)."""
    material = json.dumps([salt, identity], sort_keys=True, default=str)
    return hashlib.sha256(material.encode()).hexdigest()[:32]


def stage_folder(store: ArtifactStore, stage: str) -> str:
    return f"{store.root}/{PIECES}/{stage}"


def read_piece(store: ArtifactStore, stage: str, key: str) -> dict[str, Any] | None:
    """A committed piece's metadata (with `folder`), or None."""
    folder = f"{stage_folder(store, stage)}/{key}"
    try:
        with store.fs.open(f"{folder}/{COMMIT}", "rb") as f:
            meta = json.loads(f.read())
    except FileNotFoundError:
        return None
    meta["folder"] = folder
    return meta


def new_file(store: ArtifactStore, stage: str, key: str, name: str) -> str:
    """The path of a new data file of a piece, an Arrow IPC file (open it with `store.fs`)."""
    folder = f"{stage_folder(store, stage)}/{key}"
    if store.is_local:
        os.makedirs(folder, exist_ok=True)
    return f"{folder}/{name}-{os.urandom(6).hex()}.arrow"


def commit_piece(store: ArtifactStore, stage: str, key: str, meta: Mapping[str, Any]) -> None:
    """Make a piece whose data files are written visible (exclusive: the first commit of a key stands)."""
    store.create_file(f"{stage_folder(store, stage)}/{key}/{COMMIT}", json.dumps(dict(meta), sort_keys=True).encode())


def _uses_path(store: ArtifactStore, kind: str, version: str) -> str:
    return f"{store.root}/{PIECES}/{USES}/{kind}/{version}.json"


def record_uses(store: ArtifactStore, kind: str, version: str, keys: Mapping[str, Iterable[str]]) -> None:
    """Record the pieces `kind:version` is made of (before they are written: gc keeps them from then), each key
    as often as the artifact holds its piece (two runs of the same documents: a stage below that adds the pieces'
    results, `read_uses`, adds it twice)."""
    data = json.dumps({stage: sorted(found) for stage, found in keys.items()}, sort_keys=True).encode()
    path = _uses_path(store, kind, version)
    if not store.create_file(path, data):  # written by an earlier build of this version: take the newer list
        with store.fs.open(path, "wb") as f:
            f.write(data)


def read_uses(store: ArtifactStore, kind: str, version: str) -> dict[str, list[str]] | None:
    """The pieces `kind:version` is made of, by stage (`record_uses`), or None: built without pieces."""
    try:
        with store.fs.open(_uses_path(store, kind, version), "rb") as f:
            return json.loads(f.read())
    except FileNotFoundError:
        return None


def _mtime(info: Mapping[str, Any]) -> float:
    value = info.get("mtime", info.get("LastModified", info.get("updated", 0)))
    return value.timestamp() if hasattr(value, "timestamp") else float(value or 0)


def garbage(store: ArtifactStore, older_than: float, gone: Iterable[tuple[str, str]] = ()) -> list[str]:
    """What under `<root>/.pieces/` no artifact needs, as paths: pieces no `uses` record names, records of
    artifacts no longer in the store (or in `gone`: about to be removed), data files no `piece.json` names;
    nothing younger than `older_than` seconds (a record without its artifact may be a build at work) but the
    records of the artifacts `gone` names."""
    top = f"{store.root}/{PIECES}"
    store.refresh()
    if not retry_transient(store.fs.exists)(top):
        return []
    now, gone = time.time(), set(gone)
    found: dict[str, dict[str, Any]] = retry_transient(store.fs.find)(top, detail=True)
    needed: dict[str, set[str]] = {}
    pieces: dict[tuple[str, str], list[tuple[str, dict[str, Any]]]] = {}
    removed: list[str] = []
    for path, info in found.items():
        parts = path[len(top) + 1:].split("/")
        if len(parts) == 3 and parts[0] == USES:
            kind, version = parts[1], parts[2].removesuffix(".json")
            valid = KIND_PATTERN.fullmatch(kind) and VERSION_PATTERN.fullmatch(version)
            published = valid and (kind, version) not in gone and store.exists(kind, version)
            if published or (valid and (kind, version) not in gone and now - _mtime(info) < older_than):
                with store.fs.open(path, "rb") as f:
                    for stage, keys in json.loads(f.read()).items():
                        needed.setdefault(stage, set()).update(keys)
            else:
                removed.append(path)
        elif len(parts) == 3:
            pieces.setdefault((parts[0], parts[1]), []).append((parts[2], info))
    for (stage, key), files in pieces.items():
        folder = f"{top}/{stage}/{key}"
        if now - max(_mtime(info) for _, info in files) < older_than:
            continue  # being written
        if key not in needed.get(stage, ()):
            removed.append(folder)
            continue
        meta = read_piece(store, stage, key)
        named = set((meta or {}).get("files", {}).values()) | {COMMIT}
        removed.extend(f"{folder}/{name}" for name, _ in files if name not in named)
    return removed


def remove_garbage(store: ArtifactStore, paths: Iterable[str]) -> None:
    for path in paths:
        if store.fs.exists(path):
            store.fs.rm(path, recursive=True)
