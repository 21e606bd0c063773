"""Lock files: an OS lock (`flock`) held on a file while a block runs, released with its process if that is killed.
Writers hold one beside their staging folder, builders one per version (`ArtifactStore.build_lock`), and the store
lock (`locks.py`) is one; `gc` tells a live writer's leftovers from a dead one's by them (`lock_held`)."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


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
            try:
                fcntl.flock(handle, mode | fcntl.LOCK_NB)
            except BlockingIOError:
                if waiting is not None:
                    waiting()
                fcntl.flock(handle, mode)
            if os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino:
                break
        except FileNotFoundError:
            pass
        except BaseException:  # interrupted while waiting: no open file left behind
            handle.close()
            raise
        handle.close()
    with handle:
        yield handle


def lock_held(lock: Path) -> bool | None:
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
