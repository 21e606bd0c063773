"""Every stage's code version covers the lexiflow code its artifact's content depends on.

A stage's version hashes its task module and the modules in its `@stage(code=[...])`. A module the
builder reaches but the list leaves out (directly, or through another module: models/text.py through
models/ingest/sharding.py) could change what the stage writes while the version stays, and the stale artifact
would be reused. The modules a builder reaches are derived here from the code itself: the names its
function (and the task module's functions and tasks it calls) uses, then every lexiflow import of those
modules, transitively, function-level imports included."""

import ast
import importlib
import inspect
import pkgutil
import types

from lexiflow import tasks

OURS = ("lexiflow.models", "lexiflow.storage", "lexiflow.tasks")
# Modules that cannot change an artifact's content, not followed further.
CANNOT_CHANGE_CONTENT = {
    "lexiflow.models", "lexiflow.tasks", "lexiflow.storage",
    "lexiflow.models.errors",  # exception classes and messages
    "lexiflow.models.progress",  # progress logging
    "lexiflow.models.heap",  # allocator settings
    "lexiflow.tasks.stage", "lexiflow.storage.store",  # versioning and publishing; the layout has SCHEMA_VERSION
    "lexiflow.tasks.params",  # parameter models: their values are part of the version
    "lexiflow.storage.catalog",  # reading inputs; Catalog.load's loaders are storage.loaders (LOADED_BY)
    "lexiflow.storage.loaders",  # required, not followed, with Catalog: each loader imports the models/ it loads with
    "lexiflow.tasks.report_image",  # Prefect UI artifacts only, no file of the report
}


LOADED_BY = {"lexiflow.storage.catalog": "lexiflow.storage.loaders"}


def _ours(name: str) -> bool:
    return name.startswith(OURS)


def imported_names(module_name: str) -> dict[str, str]:
    """{name bound by an import anywhere in the module: the lexiflow module it comes from}."""
    names = {}
    for node in ast.walk(ast.parse(inspect.getsource(importlib.import_module(module_name)))):
        if isinstance(node, ast.Import):
            names.update({(a.asname or a.name): a.name for a in node.names if _ours(a.name)})
        elif isinstance(node, ast.ImportFrom) and node.module and _ours(node.module):
            base = importlib.import_module(node.module)
            for a in node.names:
                obj = getattr(base, a.name)
                origin = obj.__name__ if isinstance(obj, types.ModuleType) else getattr(obj, "__module__", None)
                names[a.asname or a.name] = origin if origin and _ours(origin) else node.module
    return names


def closure(modules: set[str]) -> set[str]:
    seen, todo = set(), [m for m in modules if m not in CANNOT_CHANGE_CONTENT]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += [m for m in imported_names(module).values() if m not in CANNOT_CHANGE_CONTENT]
    return seen


def reached(fn: types.FunctionType, seen: set) -> set[str]:
    """Lexiflow modules whose names `fn` uses, following functions and tasks of its own module."""
    home, imports, modules = fn.__module__, imported_names(fn.__module__), set()
    codes = [fn.__code__]
    while codes:
        code = codes.pop()
        codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]
        for name in code.co_names:
            value = fn.__globals__.get(name)
            if name in imports:
                modules.add(imports[name])
            elif isinstance(value, types.ModuleType) and _ours(value.__name__):
                modules.add(value.__name__)
            callee = getattr(value, "fn", value)  # a Prefect task's function
            if inspect.isfunction(callee) and callee.__module__ == home and callee not in seen:
                seen.add(callee)
                modules |= reached(callee, seen)
    return modules


def stages():
    for info in pkgutil.iter_modules(tasks.__path__):
        module = importlib.import_module(f"lexiflow.tasks.{info.name}")
        for obj in vars(module).values():
            if hasattr(obj, "code_modules") and obj.fn.__module__ == module.__name__:
                yield obj


def test_every_stage_versions_the_code_it_depends_on():
    found, gaps = 0, {}
    for stage in stages():
        found += 1
        build = stage.fn.__wrapped__
        used = reached(build, {build})
        needed = closure(used) - {build.__module__} | {LOADED_BY[m] for m in used if m in LOADED_BY}
        missing = needed - {m.__name__ for m in stage.code_modules}
        if missing:
            gaps[f"{build.__module__}.{build.__name__}"] = sorted(missing)
    assert found >= 14, found
    assert gaps == {}, f"add to @stage(code=[...]): {gaps}"


def test_the_code_version_follows_every_listed_module():
    from lexiflow.tasks.corpus import ingest_corpus
    from lexiflow.tasks.stage import code_version

    assert {"lexiflow.models.text", "lexiflow.models.ingest", "lexiflow.tasks.parallel",
            "lexiflow.storage.formats"} <= {m.__name__ for m in ingest_corpus.code_modules}
    assert code_version(ingest_corpus.code_modules) != code_version(
        [m for m in ingest_corpus.code_modules if m.__name__ != "lexiflow.models.text"])
