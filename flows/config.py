"""Pipeline parameters from a TOML/JSON config file and `--set key=value`: one reading for every entry point.

`lexiflow run` validates the tree into the run's parameters; `lexiflow serve` and `python -m
deployments.definitions` bake the same tree into the `pipeline` and `corpus-rebuild` deployments'
parameters (deployments/definitions.py). Imports nothing heavy: a command reads its config before it
decides what else to import.
"""

from __future__ import annotations

import argparse
import json
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from lexiflow.models.errors import ParameterError


def parse_value(text: str) -> Any:
    """`--set` values: JSON when they parse as JSON (numbers, true/false/null, lists), else text."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def load_config(path: str) -> dict[str, Any]:
    file = Path(path)
    if not file.is_file():
        raise ParameterError(f"--config {path}: no such file")
    language = "JSON" if file.suffix == ".json" else "TOML"
    try:
        text = file.read_text(encoding="utf-8")
        tree = json.loads(text) if language == "JSON" else tomllib.loads(text)
    except UnicodeDecodeError as exc:
        raise ParameterError(f"--config {path}: not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    except OSError as exc:
        raise ParameterError(f"--config {path}: cannot read it ({exc.strerror})") from None
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ParameterError(f"--config {path}: not valid {language} ({exc})") from None
    if not isinstance(tree, dict):  # JSON may hold a list or a number; TOML is always a table
        raise ParameterError(f"--config {path}: expected an object of parameter sections, e.g. "
                             f'{{"svd": {{"dim": 200}}}}, found {json.dumps(tree)[:40]}')
    return tree


def set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    """tree["a"]["b"] = value for dotted "a.b"."""
    *parents, leaf = dotted.split(".")
    for name in parents:
        node = tree.setdefault(name, {})
        if not isinstance(node, dict):
            raise ParameterError(f"--set {dotted}: {name!r} is a value, not a section")
        tree = node
    tree[leaf] = value


def parameter_tree(config: str | None, sets: Iterable[str] | None = None,
                   given: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Config file ← `given` (a command's own flags by dotted name: `store`, `corpus.sources`; None: not
    given) ← `--set`, as given: `flows.params.validate` adds the defaults and checks the whole."""
    tree: dict[str, Any] = load_config(config) if config else {}
    for dotted, value in (given or {}).items():
        if value is not None:
            set_dotted(tree, dotted, value)
    for item in sets or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ParameterError(f"--set {item!r}: expected key=value, e.g. --set svd.dim=200")
        set_dotted(tree, key.strip(), parse_value(value))
    return tree


def merged(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """`over` on `base`, section by section (a value in `over` replaces; a section is merged into base's)."""
    out = dict(base)
    for name, value in over.items():
        out[name] = merged(out[name], value) if isinstance(value, Mapping) and isinstance(out.get(name), Mapping) \
            else value
    return out


def add_configuration(parser: argparse.ArgumentParser) -> None:
    """`--config FILE` and `--set KEY=VALUE` of the commands that deploy, read as `lexiflow run` reads them."""
    parser.add_argument("--config", metavar="FILE", help="pipeline parameters as TOML or JSON (sections as in --set, "
                                                         "as `lexiflow run --config`) that the pipeline and "
                                                         "corpus-rebuild deployments get; applied again on each "
                                                         "deploy")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="a deployed pipeline parameter by dotted name, e.g. --set checks.coverage_floor=0.7")
