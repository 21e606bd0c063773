"""`lexiflow artifacts export KIND[:VERSION] DIR`: an artifact's files in the open formats users
expect, in a plain folder, for tools that know nothing of lexiflow.

Every artifact file is already in an open format and is copied as is, with `manifest.json`:
Parquet tables (corpus, vocabulary, tokens, sparse matrices as row/col/value, vectors), word2vec
text `vectors.txt` and binary `vectors.bin` (embeddings), JSON configs, and safetensors + JSON
config for neural weights. Some kinds add a derived file, made by a model (`extras`, kind → writer,
given by the layer above: `lexiflow.loaders.EXPORT_EXTRAS`).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from lexiflow.storage.catalog import Catalog
from lexiflow.storage.manifests import MANIFEST, StoreError

Extra = Callable[[Catalog, dict[str, Any], Path], list[Path]]  # (catalog, manifest, folder) -> files written


def export(catalog: Catalog, kind: str, version: str | None, dest: str | Path,
           extras: Mapping[str, Extra] | None = None) -> list[Path]:
    """Copy artifact `kind:version` (the latest when version is None) into folder `dest` (new, or
    empty), with the files `extras[kind]` derives; returns the paths written. The files go into a temporary folder
    beside `dest`, renamed to `dest` at the end: a failed export leaves nothing behind."""
    manifest = catalog.get(kind, version)
    kind, version = manifest["kind"], manifest["version"]
    dest = Path(dest)
    if dest.exists() and not dest.is_dir():
        raise StoreError(f"export destination {dest} exists and is not a folder")
    if dest.is_dir() and any(dest.iterdir()):  # never mix two exports, nor overwrite a manifest.json
        raise StoreError(f"export destination {dest} is not empty; choose a new or empty folder")
    target = dest.resolve()
    made = [p for p in target.parents if not p.exists()]  # folders to remove again if the export fails
    staging = target.with_name(f".{target.name}.{os.urandom(4).hex()}.tmp")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging.mkdir()
    except OSError as exc:  # a file in its path, no permission
        blocker = next(p for p in target.parents if p.exists())
        why = f"{blocker} is a file, not a folder" if not blocker.is_dir() else exc.strerror
        raise StoreError(f"export destination {dest}: cannot create it ({why}); choose another folder") from None
    try:
        store, names = catalog.store, [entry["name"] for entry in manifest["files"]] + [MANIFEST]
        for name in names:
            if store.is_local and os.path.islink(store.path(kind, version, name)):  # could point out of the store
                raise StoreError(f"{kind}:{version}/{name}: a symbolic link, not exported (artifacts hold plain "
                                 f"files only); run `lexiflow artifacts verify`")
            try:
                store.download(store.path(kind, version, name), staging / name)
            except FileNotFoundError:
                raise StoreError(f"{kind}:{version}/{name}: listed in the manifest but missing from the store "
                                 f"{store.url}; run `lexiflow artifacts verify`") from None
        derived = extras[kind](catalog, manifest, staging) if extras and kind in extras else []
        os.rename(staging, target)  # replaces an empty folder; fails if one appeared meanwhile with files
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        for folder in made:  # deepest first; stop at one that is not empty (someone else's files)
            try:
                folder.rmdir()
            except OSError:
                break
        raise
    return [dest / name for name in names] + [dest / path.name for path in derived]
