"""A flaky filesystem for fault-injection tests: local files behind an fsspec protocol that fails
a chosen fraction of reads and writes with `OSError` or `TimeoutError`.

    ArtifactStore("flaky:///tmp/store?fail=0.1&seed=7")

The settings travel inside the URL, so every `ArtifactStore(ref.store)` a stage opens, in any
thread or process, injects faults the same way. The store sees a remote filesystem (not `file`),
so it takes the object-store path: stage locally, upload data files, upload the manifest last.

A fault is drawn (seeded) before each operation (`fail`), and with probability `outage` an
outage starts: the next `outage_ops` operations all fail (longer than the store's own retries of
one operation, so a whole stage attempt fails and the task's retry takes over). The operations:
opening a file, each `read`/`write` on an open file, `put_file`/`get_file`/`cat_file`/
`pipe_file`, and the metadata reads `info`/`ls`/`exists`. An upload fault happens either before
the object is written or after it (the acknowledgement is lost), as on an object store where a
PUT is atomic; a read fault can also strike in mid-file.
`FlakyFileSystem.stats` counts operations and injected faults for the whole process.
"""

from __future__ import annotations

import errno
import random
import threading
from collections import Counter
from typing import Any
from urllib.parse import parse_qs, urlsplit

import fsspec
from fsspec.implementations.local import LocalFileSystem


class InjectedFault(OSError):
    """An `OSError` raised on purpose (a subclass, so tests can tell it from a real one)."""


class InjectedTimeout(TimeoutError):
    """A `TimeoutError` raised on purpose."""


class FlakyFileSystem(LocalFileSystem):
    """Local files; each operation fails with probability `fail` (seeded by `seed`)."""

    protocol = ("flaky",)
    root_marker = "/"
    stats: Counter = Counter()  # process-wide: operations, faults (total and per operation)
    _lock = threading.Lock()

    def __init__(self, fail: float = 0.1, seed: int = 0, outage: float = 0.0, outage_ops: int = 8,
                 **kwargs: Any) -> None:
        kwargs.setdefault("auto_mkdir", True)  # like an object store: no folders to create first
        super().__init__(**kwargs)
        for name, value in (("fail", fail), ("outage", outage)):
            if not 0 <= float(value) < 1:
                raise ValueError(f"flaky filesystem: {name}={value} must be in [0, 1)")
        self.fail, self.outage, self.outage_ops = float(fail), float(outage), int(outage_ops)
        self.rng = random.Random(int(seed))
        self._outage_left = 0

    # ---- URLs: flaky:///abs/path?fail=0.1&seed=3 -------------------------------------------
    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        if isinstance(path, str):
            if path.startswith("flaky://"):
                path = path[len("flaky://"):]
            path = path.split("?", 1)[0]
        return super()._strip_protocol(path)

    @staticmethod
    def _get_kwargs_from_urls(path: str) -> dict[str, Any]:
        query = parse_qs(urlsplit(path).query)
        types = {"fail": float, "seed": int, "outage": float, "outage_ops": int}
        return {name: cast(query[name][0]) for name, cast in types.items() if name in query}

    # ---- the faults ------------------------------------------------------------------------
    def _draw(self) -> bool:
        with self._lock:
            return self.rng.random() < 0.5

    def maybe_fail(self, operation: str, path: Any = "") -> None:
        """Count the operation; raise an injected fault with probability `fail`."""
        with self._lock:
            self.stats["operations"] += 1
            if not self._outage_left and self.rng.random() < self.outage:
                self._outage_left = self.outage_ops
                self.stats["outages"] += 1
            hit = self.rng.random() < self.fail or self._outage_left > 0
            self._outage_left = max(0, self._outage_left - 1)
            timeout = self.rng.random() < 0.5
            if hit:
                self.stats["faults"] += 1
                self.stats[f"faults_{operation}"] += 1
        if hit:
            if timeout:
                raise InjectedTimeout(f"injected timeout: {operation} {path}")
            raise InjectedFault(errno.EIO, f"injected I/O error: {operation} {path}")

    # metadata reads
    def info(self, path, **kwargs):
        self.maybe_fail("info", path)
        return super().info(path, **kwargs)

    def ls(self, path, detail=False, **kwargs):
        self.maybe_fail("ls", path)
        return super().ls(path, detail=detail, **kwargs)

    def exists(self, path, **kwargs):
        self.maybe_fail("exists", path)
        return super().exists(path, **kwargs)

    # whole-object transfers
    def put_file(self, lpath, rpath, callback=None, mode="overwrite", **kwargs):
        def put() -> None:
            if mode == "create" and super(FlakyFileSystem, self).exists(rpath):  # an exclusive create, as on S3
                raise FileExistsError(errno.EEXIST, "exists", rpath)
            super(FlakyFileSystem, self).put_file(lpath, rpath, **kwargs)

        self._transfer("put", put, rpath)

    def get_file(self, rpath, lpath, callback=None, **kwargs):
        self._transfer("get", lambda: super(FlakyFileSystem, self).get_file(rpath, lpath, **kwargs), rpath)

    def pipe_file(self, path, value, mode="overwrite", **kwargs):
        self._transfer("pipe", lambda: super(FlakyFileSystem, self).pipe_file(path, value, **kwargs), path)

    def cat_file(self, path, start=None, end=None, **kwargs):
        self.maybe_fail("cat", path)
        return super().cat_file(path, start=start, end=end, **kwargs)

    def _transfer(self, operation: str, do, path) -> None:
        """Fail before the transfer, or after it (the object is there, the acknowledgement lost)."""
        after = self._draw()
        if not after:
            self.maybe_fail(operation, path)
            do()
            return
        do()
        self.maybe_fail(operation, path)

    def _open(self, path, mode="rb", **kwargs):
        self.maybe_fail("open", path)
        return _FlakyFile(super()._open(path, mode=mode, **kwargs), self, path)


class _FlakyFile:
    """A file whose reads and writes may fail part-way (the underlying file stays consistent)."""

    def __init__(self, inner: Any, fs: FlakyFileSystem, path: str) -> None:
        self._inner, self._fs, self._path = inner, fs, path

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __enter__(self) -> _FlakyFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._inner.close()

    def __iter__(self):
        return iter(self.readline, b"")

    def read(self, *args: Any) -> bytes:
        self._fs.maybe_fail("read", self._path)
        return self._inner.read(*args)

    def read1(self, *args: Any) -> bytes:
        self._fs.maybe_fail("read", self._path)
        return self._inner.read1(*args) if hasattr(self._inner, "read1") else self._inner.read(*args)

    def readinto(self, buffer: Any) -> int:
        self._fs.maybe_fail("read", self._path)
        return self._inner.readinto(buffer)

    def readline(self, *args: Any) -> bytes:
        self._fs.maybe_fail("read", self._path)
        return self._inner.readline(*args)

    def write(self, data: Any) -> int:
        self._fs.maybe_fail("write", self._path)
        return self._inner.write(data)


def flaky_url(path: str, fail: float, seed: int = 0, outage: float = 0.0, outage_ops: int = 8) -> str:
    """The store URL of a local folder behind the flaky filesystem."""
    return f"flaky://{path}?fail={fail}&seed={seed}&outage={outage}&outage_ops={outage_ops}"


fsspec.register_implementation("flaky", FlakyFileSystem, clobber=True)
