"""Staging, publishing and build locks: how `ArtifactStore.writer` makes an artifact appear whole or not at all
(`ArtifactStore` has these methods from `Publishing`), and what crashed writers leave (`leftovers`).

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
"""

from __future__ import annotations

import datetime as dt
import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from functools import partial
from pathlib import Path
from typing import Any

from lexiflow.storage.lockfiles import held_lock_file, lock_file_at, lock_held
from lexiflow.storage.manifests import (
    KIND_PATTERN,
    MANIFEST,
    SCRATCH,
    SHARED_SUFFIX,
    STAGING,
    VERSION_PATTERN,
    StoreError,
    validate_kind,
    validate_version,
)
from lexiflow.storage.transient import retry_transient

log = logging.getLogger("lexiflow")


class Publishing:
    """Staging, publishing, scratch state and build locks of `ArtifactStore` (its `fs`, `root`, `url`, `is_local`,
    `path`, `exists`, `manifest` and `refresh`)."""

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
        waiting = partial(log.info, "%s:%s: another run is building it on this machine; waiting for it", kind, version)
        with lock_file_at(path, fcntl.LOCK_EX, waiting):
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
                alive = lock_held(folder / f"{base}.lock")
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
                if lock_held(Path(tempfile.gettempdir()) / f"lexiflow-{self._store_id()}-{writer}.lock"):
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


def _newest_mtime(path: Path) -> float:
    """Modification time of a local file, or of the newest entry in a folder."""
    times = [0.0]
    for entry in (path, *(path.rglob("*") if path.is_dir() else ())):
        with suppress(FileNotFoundError):  # removed meanwhile (its writer finished)
            times.append(entry.lstat().st_mtime)
    return max(times)


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
