"""Does this environment hold what the checkout's lock says? Run from a checkout (an editable install), the
`lexiflow` command stops with one line when it does not: after a `git pull` that changed the lock, the venv
still holds the old versions until `make install` runs again. An install from a wheel has no lock beside it
and is not checked.

Installed versions are read from the names of the `*.dist-info` folders (`polars-2.1.0.dist-info`), one
directory listing per `sys.path` entry: reading each package's metadata instead (`importlib.metadata`) takes
about a second for the ~150 locked packages, at every command."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]
RUNTIME_LOCK = Path("requirements", "runtime.txt")
PINNED = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", re.MULTILINE)


def normalized(name: str) -> str:
    """A distribution's name as PEP 503 compares it (`Typing_Extensions` = `typing-extensions`)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def locked_versions(lock: Path) -> dict[str, str]:
    """Package → version, from a lock's `name==version` lines."""
    return {normalized(name): version for name, version in PINNED.findall(lock.read_text(encoding="utf-8"))}


def installed_versions(path: list[str]) -> dict[str, str]:
    """Package → version of what `import` finds on `path`: the first entry that holds a package wins."""
    found: dict[str, str] = {}
    for entry in path:
        try:
            names = os.listdir(entry or ".")
        except OSError:  # a zip file, a folder that is gone
            continue
        for folder in names:
            if folder.endswith(".dist-info"):
                name, _, version = folder.removesuffix(".dist-info").partition("-")
                found.setdefault(normalized(name), version)
    return found


def stale_install(checkout: Path | None = None, path: list[str] | None = None) -> str | None:
    """The one-line problem when the packages on `path` (sys.path) differ from the runtime lock of `checkout`
    (the one this lexiflow is imported from), else None."""
    checkout = checkout or CHECKOUT
    lock = checkout / RUNTIME_LOCK
    if not lock.is_file():
        return None
    installed = installed_versions(sys.path if path is None else path)
    differences = [f"{name} {installed[name]} installed, {version} locked" if name in installed
                   else f"{name} {version} not installed"
                   for name, version in locked_versions(lock).items() if installed.get(name) != version]
    if not differences:
        return None
    more = f" and {len(differences) - 1} more" if len(differences) > 1 else ""
    return (f"this environment ({sys.prefix}) does not match {RUNTIME_LOCK} ({differences[0]}{more}), "
            f"as after a `git pull` that changed the lock: run `make install` in {checkout}")
