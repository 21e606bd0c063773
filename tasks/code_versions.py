"""Code versions: which lexiflow modules a stage's artifact depends on, and their hash.

A stage's code version covers the lexiflow code its artifact's content depends on, derived from the code: the
names its builder (and the functions of its own module it calls) uses, then every lexiflow import of those
modules, transitively, function-level imports included. Each module is hashed as its AST without docstrings, so
a comment or docstring edit rebuilds nothing.

What versioning reads of a module's AST (its hash, the names its imports bind) is kept on disk, keyed by the
SHA-256 of the module's source, in `$XDG_CACHE_HOME/lexiflow/code-facts.json` (`~/.cache` by default): a cached
run parses nothing. Keyed by content, an entry is never stale; a damaged or unwritable cache only costs the
parsing.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import importlib.util
import inspect
import json
import os
import tempfile
from collections.abc import Callable, Iterable
from importlib.machinery import ModuleSpec, PathFinder
from pathlib import Path
from types import CodeType, ModuleType
from typing import Any

VERSIONED_PACKAGES = ("lexiflow.models", "lexiflow.storage", "lexiflow.tasks")
# Modules that cannot change an artifact's content: not hashed, not followed.
CANNOT_CHANGE_CONTENT = frozenset({
    "lexiflow.models.errors",  # exception classes and messages
    "lexiflow.models.progress",  # progress logging
    "lexiflow.models.heap",  # allocator settings
    "lexiflow.tasks.stage", "lexiflow.tasks.code_versions",  # versioning
    "lexiflow.storage.store",  # publishing; the layout has SCHEMA_VERSION
    "lexiflow.storage.manifests", "lexiflow.storage.files", "lexiflow.storage.publishing",  # the store's parts
    "lexiflow.storage.writer", "lexiflow.storage.lockfiles", "lexiflow.storage.transient",
    "lexiflow.storage.parquet_concat",  # Parquet files appended from row groups: their layout, not their rows
    "lexiflow.tasks.params",  # parameter models: their values are part of the version
    "lexiflow.storage.catalog",  # reading inputs: manifests and listings, no model objects
    "lexiflow.tasks.report_image",  # Prefect UI artifacts only, no file of the report
})


def _versioned(name: str) -> bool:
    return name.startswith(VERSIONED_PACKAGES) and name not in CANNOT_CHANGE_CONTENT


@functools.cache
def _imported_names(module_name: str) -> dict[str, str]:
    """{name bound by an import anywhere in the module: the lexiflow module it comes from}. Read from the
    module's file, nothing imported: a cached run derives every stage's version without torch."""
    return {bound: module if attr is None else _origin(module, attr) for bound, module, attr in
            _facts(module_name)["imports"]}


@functools.cache
def _origin(module_name: str, name: str) -> str:
    """The lexiflow module whose code `from module_name import name` gets, as importing would answer: a
    submodule, or where a re-exported name is defined (followed through the module's own imports)."""
    for bound, module, attr in _facts(module_name)["top"]:
        if bound == name:
            if not module.startswith(VERSIONED_PACKAGES):
                return module_name
            return module if attr is None else _origin(module, attr)
    return f"{module_name}.{name}" if _spec(f"{module_name}.{name}") is not None else module_name


@functools.cache
def _spec(name: str) -> ModuleSpec | None:
    """A lexiflow module's spec, found without importing it or its packages (a package's __init__ may import
    torch)."""
    package = name.rpartition(".")[0]
    if package in ("", "lexiflow"):  # lexiflow's subpackages are mapped folders (setup.py): its finder knows them
        return importlib.util.find_spec(name)
    parent = _spec(package)
    return None if parent is None or parent.submodule_search_locations is None else \
        PathFinder.find_spec(name, parent.submodule_search_locations)


@functools.cache
def _source(module_name: str) -> str:
    return Path(_spec(module_name).origin).read_text(encoding="utf-8")


def _closure(modules: Iterable[str]) -> set[str]:
    """The modules given and every lexiflow module they import, transitively."""
    seen, todo = set(), list(modules)
    while todo:
        module = todo.pop()
        if _versioned(module) and module not in seen:
            seen.add(module)
            todo += _imported_names(module).values()
    return seen


def _defined_in(value: Any) -> set[str]:
    """The modules a global value's code lives in: a module, a class or function, or a table of them."""
    if isinstance(value, dict):
        return set().union(*map(_defined_in, value.values()))
    if isinstance(value, list | tuple | set | frozenset):
        return set().union(*map(_defined_in, value))
    if isinstance(value, ModuleType):
        return {value.__name__}
    if inspect.isclass(value) or inspect.isfunction(value):
        return {value.__module__}
    return set()


def _reached(fn: Callable, seen: set) -> set[str]:
    """Lexiflow modules whose names `fn` uses, following the functions and tasks of its own module."""
    home, imports, modules = fn.__module__, _imported_names(fn.__module__), set()
    codes = [fn.__code__]
    while codes:
        code = codes.pop()
        codes += [c for c in code.co_consts if isinstance(c, CodeType)]
        # locals too, arguments aside: `from lexiflow.models import encoder as enc` in a function binds a local
        for name in code.co_names + code.co_varnames[code.co_argcount + code.co_kwonlyargcount:]:
            value = fn.__globals__.get(name)
            if name in imports:
                modules.add(imports[name])
            else:
                modules |= _defined_in(value)
            callee = getattr(value, "fn", value)  # a Prefect task's function
            if inspect.isfunction(callee) and callee.__module__ == home and callee not in seen:
                seen.add(callee)
                modules |= _reached(callee, seen)
    return modules - {home}  # the stage's own module is hashed whole, its functions followed above


def code_modules(build: Callable, variant: Any = None, variants: Iterable[Any] = ()) -> list[str]:
    """The modules a builder's artifact depends on: its own module, and the closure of what it uses.
    A stage that serves several kinds (`variants`: the modules, module names or objects each kind's code lives in)
    depends on the chosen kind's code only: editing the Transformer does not retrain n-gram models."""
    own = build.__module__
    kinds = [v if isinstance(v, str) else v.__name__ if isinstance(v, ModuleType) else v.__module__ for v in variants]
    shared = _closure(_reached(build, {build}) - set(kinds)) - _closure(kinds)
    chosen = _closure([kinds[list(variants).index(variant)]]) if variant is not None else set()
    return sorted({own} | shared | chosen)


@functools.cache
def module_hash(name: str) -> str:
    return _facts(name)["hash"]


def source_hash(source: str) -> str:
    """SHA-256 of the code's AST with docstrings removed: comments and docstrings do not count."""
    return _facts_of(source)["hash"]


# Bump when what _facts_of records changes: old entries are then never read.
FACTS_FORMAT = f"1:{VERSIONED_PACKAGES}"


@functools.cache
def _facts(module_name: str) -> dict[str, Any]:
    source = _source(module_name)
    key = hashlib.sha256(f"{FACTS_FORMAT}\n{source}".encode()).hexdigest()
    cache = _facts_cache()
    if key not in cache:
        cache[key] = _facts_of(source)
        _save_facts(cache)
    return cache[key]


def _facts_of(source: str) -> dict[str, Any]:
    """The module's hash; the lexiflow names its imports anywhere bind, as (name, module, attribute or None for
    `import module`) in the order they bind; its top-level imports alike, any package, for `_origin`."""
    tree = ast.parse(source)
    for node in ast.walk(tree):  # docstrings out
        body = getattr(node, "body", None)
        if (isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    imports = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imports += [(a.asname or a.name, a.name, None) for a in node.names if a.name.startswith(VERSIONED_PACKAGES)]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(VERSIONED_PACKAGES):
            imports += [(a.asname or a.name, node.module, a.name) for a in node.names]
    top = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            top += [(a.asname or a.name, node.module, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            top += [(a.asname, a.name, None) for a in node.names if a.asname]
    return {"hash": hashlib.sha256(ast.dump(tree).encode()).hexdigest(), "imports": imports, "top": top}


def facts_path() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lexiflow" / "code-facts.json"


@functools.cache
def _facts_cache() -> dict[str, Any]:
    try:
        cache = json.loads(facts_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):  # none yet, unreadable or damaged: parse again
        return {}
    return cache if isinstance(cache, dict) else {}


def _save_facts(cache: dict[str, Any], keep: int = 2000) -> None:
    """Write the cache whole, atomically (a concurrent reader sees the old file or the new); the newest `keep`
    entries only, so edits do not grow it without end."""
    path = facts_path()
    with contextlib.suppress(OSError):  # a read-only home: the next run parses again
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".code-facts-")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(dict(list(cache.items())[-keep:]), f)
        os.replace(tmp, path)


def code_version(modules: Iterable[str]) -> str:
    digest = hashlib.sha256()
    for name in sorted(modules):
        digest.update(f"{name}:{module_hash(name)}".encode())
    return digest.hexdigest()[:16]
