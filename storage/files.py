"""Reading, checking and deleting an artifact's files, on a local path or any fsspec URL (`ArtifactStore` has these
methods from `StoreFiles`), and the fsspec options registered per store URL."""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from lexiflow.storage.manifests import MANIFEST, ArtifactDamaged, StoreError, repair_hint, sha256_of
from lexiflow.storage.transient import retry_transient

_STORAGE_OPTIONS: dict[str, dict[str, Any]] = {}  # URL prefix -> fsspec options (register_storage_options)
# What pyarrow says about a damaged Parquet file (a plain OSError, as I/O trouble is: told apart by message).
_PARQUET_DAMAGE = re.compile(r"checksum|thrift|magic bytes|Parquet|corrupt|Unexpected end of stream|decompress",
                             re.IGNORECASE)


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


class StoreFiles:
    """The file operations of `ArtifactStore` (its `fs`, `root`, `url`, `is_local`, `path` and `manifest`)."""

    # ---- reading files --------------------------------------------------------------------
    def open(self, kind: str, version: str, name: str, mode: str = "rb"):
        return self.fs.open(self.path(kind, version, name), mode)

    def read_parquet(self, kind: str, version: str, name: str, columns: list[str] | None = None) -> pl.DataFrame:
        return pl.from_arrow(self.read_arrow(kind, version, name, columns))

    @retry_transient
    def read_arrow(self, kind: str, version: str, name: str, columns: list[str] | None = None) -> pa.Table:
        with self.open(kind, version, name) as f, self.damage_check(kind, version, name):
            return pq.read_table(f, columns=columns, page_checksum_verification=True)

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
                if sha256_of(f) != entry["sha256"]:
                    raise ArtifactDamaged(f"{kind}:{version}/{entry['name']}: checksum differs from the manifest; "
                                          f"{repair_hint(kind, version)}")

    @retry_transient
    def download(self, path: str, local: Path) -> None:
        """Copy one file of the store to a local path (retried on transient errors, as reads are)."""
        self.fs.get_file(path, str(local))

    # ---- writing --------------------------------------------------------------------------
    def delete(self, kind: str, version: str) -> None:
        """Remove an artifact: manifest first, so readers stop seeing it before its files go."""
        if not self.exists(kind, version):
            raise StoreError(f"no artifact {kind}:{version} in {self.url}")
        self.fs.rm(self.path(kind, version, MANIFEST))
        self.fs.rm(self.path(kind, version), recursive=True)

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
                    if sha256_of(f) != entry["sha256"]:
                        problems.append(f"{kind}:{version}/{name}: checksum differs from the manifest")
        return problems


def _link_target(info: Mapping[str, Any]) -> str:
    with suppress(OSError, KeyError):
        return f" to {os.readlink(info['name'])!r}"
    return ""
