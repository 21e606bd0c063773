"""The store's names, versions and manifests: the layout's folder and file names, what a kind, a version and
a file name may be, the manifest schema and its check, content versions, the errors a user can act on, and the
JSON the manifests hold (strict: no NaN). No I/O: `store.py` and its parts build on it."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import numbers
import re
from collections.abc import Mapping
from typing import Any

SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
STAGING = ".staging"
SHARED_SUFFIX = "-shards"  # a writer's shared folder in the store's staging area (ArtifactWriter.shared)
SCRATCH = ".scratch"
KIND_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
VERSION_PATTERN = re.compile(r"^[0-9a-f]{16}$")
_FILE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class StoreError(Exception):
    """A store problem the user can act on: bad name, missing artifact, failed verification."""


class ArtifactNotFound(StoreError):
    """No published artifact of that kind and version (its manifest is missing)."""


class ArtifactDamaged(StoreError):
    """An artifact whose manifest breaks the schema, or whose files do not match it."""


def repair_hint(kind: str, version: str) -> str:
    return f"remove it with `lexiflow artifacts rm {kind}:{version} --force` and run again to rebuild it"


# Every manifest field and its JSON type (docs/artifacts.md): checked whenever a manifest is read.
MANIFEST_FIELDS: dict[str, type | tuple[type, ...]] = {
    "schema_version": int, "kind": str, "version": str, "created": str, "inputs": dict, "parameters": dict,
    "metrics": dict, "files": list, "code_version": str, "run": dict}
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def manifest_problems(manifest: Any, kind: str, version: str) -> list[str]:
    """What is wrong with a manifest read for `kind:version` (empty when it follows the schema)."""
    if not isinstance(manifest, dict):
        return [f"{kind}:{version}: manifest is not a JSON object"]
    problems = [f"{kind}:{version}: manifest field {name!r} is missing or not a {getattr(types, '__name__', types)}"
                for name, types in MANIFEST_FIELDS.items()
                if not isinstance(manifest.get(name), types) or isinstance(manifest.get(name), bool)]
    if problems:
        return problems
    if manifest["schema_version"] != SCHEMA_VERSION:
        problems.append(f"{kind}:{version}: manifest schema_version {manifest['schema_version']}, this lexiflow "
                        f"reads {SCHEMA_VERSION}")
    if (manifest["kind"], manifest["version"]) != (kind, version):
        problems.append(f"{kind}:{version}: manifest describes {manifest['kind']!r}:{manifest['version']!r}")
    try:
        dt.datetime.fromisoformat(manifest["created"])
    except ValueError:
        problems.append(f"{kind}:{version}: manifest 'created' is not an ISO-8601 time")
    for name, ref in manifest["inputs"].items():
        if not (isinstance(ref, dict) and isinstance(ref.get("kind"), str) and KIND_PATTERN.fullmatch(ref["kind"])
                and isinstance(ref.get("version"), str) and VERSION_PATTERN.fullmatch(ref["version"])):
            problems.append(f"{kind}:{version}: invalid input {name!r}: {ref!r} in the manifest")
    names = set()
    for entry in manifest["files"]:
        name = entry.get("name") if isinstance(entry, dict) else None
        if not (isinstance(name, str) and _FILE.fullmatch(name) and ".." not in name and name != MANIFEST
                and name not in names and isinstance(entry.get("size"), int) and not isinstance(entry["size"], bool)
                and entry["size"] >= 0 and isinstance(entry.get("sha256"), str) and _SHA256.fullmatch(entry["sha256"])):
            problems.append(f"{kind}:{version}: invalid file entry {entry!r} in the manifest")
        names.add(name)
    return problems


def validate_kind(kind: str) -> str:
    if not isinstance(kind, str) or not KIND_PATTERN.fullmatch(kind):
        raise StoreError(f"invalid artifact kind {kind!r}: use lowercase letters, digits and '_'")
    return kind


def validate_version(version: str) -> str:
    if not isinstance(version, str) or not VERSION_PATTERN.fullmatch(version):
        raise StoreError(f"invalid artifact version {version!r}: expected 16 hexadecimal digits")
    return version


def validate_file_name(name: str) -> str:
    """Artifact files live flat in their folder: no separators, no `..`, no hidden files."""
    if not isinstance(name, str) or not _FILE.fullmatch(name) or ".." in name:
        raise StoreError(f"invalid artifact file name {name!r}: letters, digits, '.', '_', '-' only")
    return name


def json_safe(value: Any) -> Any:
    """`value` for strict JSON (docs/artifacts.md, "Non-finite numbers"): a NaN becomes null (no value)
    and an infinity the string "Infinity" or "-Infinity", inside dicts and lists too; JSON has no such
    numbers and strict parsers (jq, JavaScript's JSON.parse, Go, ...) reject Python's NaN/Infinity."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral) and not math.isfinite(value):
        return None if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    return value


def metric_number(value: Any) -> Any:
    """A manifest figure for arithmetic or formatting: "Infinity"/"-Infinity" as floats; anything else
    (numbers, null, other strings) as it is."""
    return float(value) if value in ("Infinity", "-Infinity") else value


def content_version(kind: str, inputs: Mapping[str, str], parameters: Mapping[str, Any], code: str) -> str:
    """The version of an artifact: a hash of everything that determines its content."""
    material = {"kind": kind, "inputs": dict(sorted(inputs.items())), "parameters": parameters, "code": code,
                "schema": SCHEMA_VERSION}
    blob = json.dumps(material, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def sha256_of(f) -> str:
    """SHA-256 (hex) of an open binary file, read from where it is to its end."""
    digest = hashlib.sha256()
    for block in iter(lambda: f.read(1 << 20), b""):
        digest.update(block)
    return digest.hexdigest()
