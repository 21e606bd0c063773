"""Layering rules, read from the code: no import cycle between lexiflow's modules, no lexiflow module imports
another one's private (`_name`) names, `storage/` imports nothing above it (and its store not the catalog), and
every language-model class is in the explicit registry (nothing registers itself as an import side effect); a
pool worker's modules import neither Prefect nor the models.

Import cycles are checked over every module of the package, counting every import a module makes: at the top,
under `if TYPE_CHECKING:` (a type-only cycle still ties the two modules together: a protocol, or a module both
import, breaks it) and inside functions (a deferred import still makes each module need the other; code versions
follow these too, tasks/stage.py)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import pkgutil
import subprocess
import sys
from pathlib import Path

import lexiflow
from lexiflow.models.lm import neural, registry
from lexiflow.models.lm.ngram import NgramLM

SUBPACKAGES = ("models", "storage", "tasks", "flows", "deployments")


def lexiflow_modules() -> list[str]:
    names = [info.name for info in pkgutil.iter_modules(lexiflow.__path__, "lexiflow.")]
    for sub in SUBPACKAGES:
        package = importlib.import_module(f"lexiflow.{sub}")
        names.append(package.__name__)
        names += [info.name for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}.")]
    return sorted(set(names))


def module_source(name: str) -> tuple[Path, ast.Module]:
    path = Path(importlib.util.find_spec(name).origin)
    return path, ast.parse(path.read_text(encoding="utf-8"))


def submodule(name: str) -> bool:
    """Whether `package.name` is a module (found without importing it, nor any module but packages)."""
    parent = importlib.util.find_spec(name.rpartition(".")[0])
    return parent.submodule_search_locations is not None and importlib.util.find_spec(name) is not None


def private_imports(name: str) -> list[str]:
    """`from lexiflow.x import _y`, and `x._y` on a lexiflow module bound by an import, in module `name`."""
    path, tree = module_source(name)
    found, modules = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update({a.asname or a.name: a.name for a in node.names if a.name.startswith("lexiflow.")})
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lexiflow"):
            for alias in node.names:
                if alias.name.startswith("_"):
                    found.append(f"{path.name}:{node.lineno} from {node.module} import {alias.name}")
                elif submodule(f"{node.module}.{alias.name}"):
                    modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                and isinstance(node.value, ast.Name) and node.value.id in modules):
            found.append(f"{path.name}:{node.lineno} {node.value.id}.{node.attr}")
    return found


def imported_modules(name: str) -> set[str]:
    """The lexiflow modules module `name` imports, anywhere in it: `from a.b import c` is `a.b.c` where that is a
    module, else `a.b`; importing a package's module is not counted as importing the package."""
    _, tree = module_source(name)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("lexiflow.")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("lexiflow"):
            found |= {f"{node.module}.{a.name}" if submodule(f"{node.module}.{a.name}") else node.module
                      for a in node.names}
    return found - {name}


def module_graph(modules: list[str]) -> dict[str, set[str]]:
    """{module: the modules of `modules` it imports}."""
    return {name: imported_modules(name) & set(modules) for name in modules}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or through others (the graph's strongly
    connected components of two or more modules; Tarjan's algorithm), each sorted, the list sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while not group or group[-1] != v:
                group.append(stack.pop())
            if len(group) > 1:
                cycles.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(cycles)


def test_the_cycle_scan_finds_cycles_of_every_kind_of_import(tmp_path, monkeypatch):
    """The check can fail: an import at the top, one under TYPE_CHECKING and one inside a function each count."""
    (tmp_path / "lexiflow_probe_a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from lexiflow.models import errors\n"
        "import lexiflow.storage\ndef f():\n    from lexiflow.models.lm.registry import KINDS\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert imported_modules("lexiflow_probe_a") == {"lexiflow.models.errors", "lexiflow.storage",
                                                    "lexiflow.models.lm.registry"}
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e", "d"}, "f": {"g"}, "g": {"f"}}
    assert import_cycles(graph) == [["a", "b", "c"], ["f", "g"]]


def test_no_import_cycle():
    assert import_cycles(module_graph(["lexiflow", *lexiflow_modules()])) == []  # the package's own __init__ too


def test_the_scan_finds_private_imports(tmp_path, monkeypatch):
    """The check can fail: a module that imports a private name, both ways, is reported."""
    (tmp_path / "lexiflow_probe.py").write_text(
        "from lexiflow.models.lm.ngram import _find\nfrom lexiflow.models import evaluation\n"
        "x = evaluation._private_thing\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert private_imports("lexiflow_probe") == [
        "lexiflow_probe.py:1 from lexiflow.models.lm.ngram import _find",
        "lexiflow_probe.py:3 evaluation._private_thing"]


def test_no_module_imports_a_private_name_of_another():
    modules = lexiflow_modules()
    assert {"lexiflow.loaders", "lexiflow.storage.catalog", "lexiflow.models.lm.registry", "lexiflow.flows.cli"} <= \
        set(modules)
    assert [hit for name in modules for hit in private_imports(name)] == []


def test_storage_imports_only_storage():
    for name in (m for m in lexiflow_modules() if m.startswith("lexiflow.storage")):
        path, tree = module_source(name)
        for node in ast.walk(tree):
            imported = ([a.name for a in node.names] if isinstance(node, ast.Import)
                        else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            above = [m for m in imported if m.startswith("lexiflow") and not m.startswith("lexiflow.storage")]
            assert not above, f"{path.name}:{node.lineno} imports {above}: storage/ sits below models/ and loaders"


def test_the_store_sits_below_the_catalog():
    """`storage/store.py` (bytes, versions, publish) and the storage modules it is made of never import the catalog
    (listings, lineage, aliases) or the releases built on it, not even inside a function: the catalog is built on
    the store, so no import cycle between them."""
    seen, todo, found = set(), ["lexiflow.storage.store"], []
    while todo:
        name = todo.pop()
        seen.add(name)
        path, tree = module_source(name)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lexiflow.storage"):
                modules = [node.module] + [f"{node.module}.{a.name}" for a in node.names
                                           if submodule(f"{node.module}.{a.name}")]
                found += [f"{path.name}:{node.lineno} {m}" for m in modules if m.rsplit(".", 1)[-1] in
                          ("catalog", "releases")]
                todo += [m for m in modules if m not in seen and m not in todo and m != "lexiflow.storage"]
    assert len(seen) > 5 and found == [], (sorted(seen), found)


def test_a_pool_worker_imports_neither_prefect_nor_the_models():
    """What a worker imports to run any shard or merge (tasks/shards.py): no Prefect, no stage module, no
    `tasks.params` (every model: torch, gensim), in a fresh process: ~1.0 s of imports on a worker's first task,
    not ~2.9 s (benchmarks/results/scaling-notes.md)."""
    stages = [f"lexiflow.tasks.{name}" for name in ("stage", "params", "corpus", "vocabulary", "matrices")]
    pool = ", ".join(f"lexiflow.tasks.{name}" for name in ("shards", "parts", "parallel", "runners"))
    code = (f"import sys, {pool}; print(sorted(m for m in sys.modules if "
            f"m.split('.')[0] in ('prefect', 'torch', 'gensim', 'sklearn') or m in {stages}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_every_language_model_class_is_in_the_registry():
    classes = {NgramLM}
    for info in pkgutil.iter_modules(importlib.import_module("lexiflow.models.lm").__path__, "lexiflow.models.lm."):
        module = importlib.import_module(info.name)
        classes |= {c for _, c in inspect.getmembers(module, inspect.isclass)
                    if issubclass(c, neural.NeuralLM) and c is not neural.NeuralLM}
    assert classes == set(registry.KINDS.values())
    assert all(registry.KINDS[c.kind] is c for c in classes if c is not NgramLM)  # the saved kind loads its class
    assert "__init_subclass__" not in vars(neural.NeuralLM)  # no self-registration on import
