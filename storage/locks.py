"""The store lock: deletion (`gc`, `artifacts rm`) and alias moves (release, rollback) exclude each other.

- A local store: an OS lock (`flock`) on `<root>/.lock`. Movers hold it shared (they may run together: the release
  log orders them), deleters exclusive, so a deleter decides and deletes while no move is under way, and a move
  checks that its version exists while no deletion is. A killed holder releases it with its process. The last
  holder removes the file (one that locked a removed file finds it gone, and locks the new one at the path).
- An object store has no lock: a deleter holds a lease, `<root>/.lock` created exclusively (the conditional write
  `put_file(mode="create")`, `If-None-Match: *`), which other deleters wait for; a mover writes its release intent
  first (storage/releases.py), then looks for a lease, and backs off while there is one, while a deleter, once its
  lease is there, keeps every version a pending intent names. Each side writes before it reads what the other
  wrote, so at least one of them sees the other (S3 is strongly consistent). A lease outlives a killed deleter
  until it expires (`LEASE_SECONDS`), when the next deleter or mover takes it for abandoned.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from lexiflow.storage.lockfiles import lock_file_at
from lexiflow.storage.manifests import StoreError
from lexiflow.storage.store import ArtifactStore

log = logging.getLogger("lexiflow")

LOCK = ".lock"  # <root>/.lock: the OS lock file (local) or the deleter's lease (object stores)
LEASE_SECONDS = 600.0  # an object store's lease older than this was left by a killed deleter
POLL_SECONDS = 0.5  # how often a waiter on an object store's lease looks again
WAITING: Callable[[str], None] | None = None  # called with the lock's path just before a caller waits (tests)


def lock_path(store: ArtifactStore) -> str:
    return f"{store.root}/{LOCK}"


def _waiting(path: str) -> None:
    log.info("waiting for another lexiflow process that releases or deletes in the store (%s)", path)
    if WAITING is not None:
        WAITING(path)


@contextmanager
def store_lock(store: ArtifactStore, exclusive: bool) -> Iterator[None]:
    """Hold the store: `exclusive` for deleters, shared for movers (see the module's docstring)."""
    if not store.is_local:
        if exclusive:
            with lease(store):
                yield
        else:
            yield  # a mover on an object store checks for a lease after writing its intent (`lease_held`)
        return
    path = Path(lock_path(store))
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise StoreError(f"{path}: not the store's lock file (a link or a folder); remove it")
    mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
    with lock_file_at(path, mode, lambda: _waiting(str(path))) as handle:
        try:
            yield
        finally:
            try:  # the last holder removes the file: the store holds no lock file while idle
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                path.unlink(missing_ok=True)  # anyone who opened it meanwhile finds it gone once locked, and retries
            except BlockingIOError:
                pass  # another holder: it removes it


def lease_held(store: ArtifactStore) -> bool:
    """Whether a deleter holds the object store's lease (an expired one counts as none)."""
    store.refresh()
    try:
        with store.fs.open(lock_path(store), "rb") as f:
            body = json.loads(f.read() or b"{}")
    except FileNotFoundError:
        return False
    except ValueError:
        body = {}
    return float(body.get("expires", 0)) > time.time()


@contextmanager
def lease(store: ArtifactStore) -> Iterator[None]:
    """The object store's deleter lease (see the module's docstring)."""
    path, holder = lock_path(store), f"{socket.gethostname()}:{os.getpid()}:{os.urandom(4).hex()}"
    waited = False
    while not store.create_file(path, json.dumps({"holder": holder, "expires": time.time() + LEASE_SECONDS}).encode()):
        if not lease_held(store):  # abandoned by a killed deleter: take it
            with suppress(FileNotFoundError):
                store.fs.rm(path)
            continue
        if not waited:
            _waiting(path)
            waited = True
        time.sleep(POLL_SECONDS)
    try:
        yield
    finally:
        with suppress(FileNotFoundError):
            store.fs.rm(path)


def wait_for_no_lease(store: ArtifactStore) -> None:
    """A mover on an object store that found a lease after writing its intent: wait until it goes."""
    _waiting(lock_path(store))
    while lease_held(store):
        time.sleep(POLL_SECONDS)
