"""What several command groups share: the default store, reading a store's catalog, naming an artifact on the
command line (`pick`), aliases, and output (strict JSON, one printable line)."""

from __future__ import annotations

import json
import os
from typing import Any

DEFAULT_STORE = os.environ.get("LEXIFLOW_STORE", "artifacts")


def read_catalog(store: str):
    """The catalog of a store that read-only commands read: a local path that does not exist, or is
    not a folder, is a mistyped --store, not an empty store. (Object stores: no artifacts yet is fine.)"""
    from lexiflow.storage import Catalog

    catalog = Catalog(store)
    catalog.store.check_root(create=False)
    return catalog


def names_of(aliases: dict[str, dict[str, str]], kind: str, version: str) -> list[str]:
    """The aliases (`Catalog.aliases()`) that name `kind:version`."""
    return sorted(name for name, named in aliases.get(kind, {}).items() if named == version)


def strict_json(obj: Any) -> str:
    """JSON output by the manifest convention (manifests written before it may hold NaN/Infinity)."""
    from lexiflow.storage.manifests import json_safe

    return json.dumps(json_safe(obj), indent=2, default=str, allow_nan=False)


def pick(catalog, spec: str) -> dict[str, Any]:
    """The manifest `KIND`, `KIND:VERSION`, `KIND:TAG` or `KIND@NAME` names: the latest of the kind, a version
    (16 hex digits), the latest with that method / tokenizer kind / model / tag column (`embeddings:glove`,
    `tokenizer:bpe`, `lm:lstm`, `tagger:upos`), or the version an alias names (`embeddings@production`;
    `lm:lm@production` too, as `--lm` builds it)."""
    import re

    from lexiflow.models.errors import ParameterError
    from lexiflow.storage.catalog import split_alias
    from lexiflow.storage.formats import DISTINGUISHED_BY
    from lexiflow.storage.manifests import validate_kind

    kind, _, which = spec.partition(":")
    validate_kind(split_alias(kind)[0])  # a hostile name is refused as such, before it is read as a tag
    if not which or "@" in which or re.fullmatch(r"[0-9a-f]{16}", which):
        return catalog.get(kind, which or None)
    if re.fullmatch(r"[0-9a-fA-F]*[0-9][0-9a-fA-F]*", which) or re.fullmatch(r"[0-9a-fA-F]{16}", which):
        raise ParameterError(f"{spec}: {which!r} is not a version: a version is 16 lowercase hexadecimal digits, "
                             f"whole (`lexiflow artifacts list --kind {kind}` shows them)")
    if kind not in DISTINGUISHED_BY:
        raise ParameterError(f"{spec}: {which!r} is not a version (16 hex digits), and {kind} artifacts have no "
                             f"tag to select by; use KIND or KIND:VERSION")
    return catalog.get(kind, **{DISTINGUISHED_BY[kind]: which})


def announcer_of(catalog):
    """How this command sends the events of alias moves (flows/release.py), imported only when it moves or deletes."""
    from lexiflow.flows.release import announcer

    return announcer(catalog.store.url)


def printable(text: str) -> str:
    """`text` for one line of a terminal: control characters (newlines, escapes) as Python writes them escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))
