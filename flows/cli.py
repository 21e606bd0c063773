"""The `lexiflow` command line.

    lexiflow run [--store DIR] [--corpus SOURCE ...] [--config FILE] [--set key=value ...]
    lexiflow artifacts list [--store DIR] [--kind KIND] [--json]
    lexiflow artifacts show KIND[:VERSION] [--store DIR]
    lexiflow artifacts verify [--store DIR] [--full]

Errors a user can fix print one line (`error: ...`) and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tomllib
from pathlib import Path
from typing import Any

# Quiet, offline Prefect unless the user configured otherwise; set before Prefect is imported.
PREFECT_DEFAULTS = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "PREFECT_SERVER_UI_SHOW_PROMOTIONAL_CONTENT": "false",
    "PREFECT_LOGGING_EXTRA_LOGGERS": "lexiflow",
}
DEFAULT_STORE = os.environ.get("LEXIFLOW_STORE", "artifacts")


def parse_value(text: str) -> Any:
    """`--set` values: JSON when they parse as JSON (numbers, true/false/null, lists), else text."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def load_config(path: str) -> dict[str, Any]:
    from models.errors import ParameterError

    file = Path(path)
    if not file.is_file():
        raise ParameterError(f"--config {path}: no such file")
    try:
        if file.suffix == ".json":
            return json.loads(file.read_text())
        return tomllib.loads(file.read_text())
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ParameterError(f"--config {path}: not valid {'JSON' if file.suffix == '.json' else 'TOML'} ({exc})"
                             ) from None


def pipeline_params(args: argparse.Namespace):
    """Defaults ← config file ← --corpus ← --set, validated as a whole."""
    from flows.params import set_dotted, validate
    from models.errors import ParameterError

    tree: dict[str, Any] = load_config(args.config) if args.config else {}
    if args.store:
        tree["store"] = args.store
    if args.corpus:
        set_dotted(tree, "corpus.sources", args.corpus)
    for item in args.set or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ParameterError(f"--set {item!r}: expected key=value, e.g. --set svd.dim=200")
        set_dotted(tree, key.strip(), parse_value(value))
    return validate(tree)


def cmd_run(args: argparse.Namespace) -> int:
    params = pipeline_params(args)
    from flows.pipeline import run_pipeline
    from storage import ArtifactStore

    refs = run_pipeline(params)
    store = ArtifactStore(params.store)
    print(f"\nArtifacts in {store.root}:")
    for name, ref in refs.items():
        print(f"  {name:<17} {ref.version}  {store.path(ref.kind, ref.version)}")
    report = refs["evaluation"]
    metrics = store.manifest(report.kind, report.version)["metrics"]
    print(f"\nEvaluation report: {store.path(report.kind, report.version, 'report.md')}")
    print("Headline figures: " + ", ".join(
        f"{k} {metrics[k]:.3f}" for k in ("ws353_spearman", "simlex999_spearman", "analogy_add_accuracy",
                                          "analogy_mul_accuracy", "analogy_coverage")))
    return 0


def _listing(manifest: dict[str, Any]) -> dict[str, Any]:
    return {"kind": manifest["kind"], "version": manifest["version"], "created": manifest["created"],
            "inputs": {name: ref["version"] for name, ref in manifest["inputs"].items()},
            "parameters": manifest["parameters"], "metrics": manifest["metrics"], "path": manifest["path"]}


def cmd_list(args: argparse.Namespace) -> int:
    from storage import Catalog

    manifests = [_listing(m) for m in Catalog(args.store).list(args.kind)]
    if args.json:
        print(json.dumps(manifests, indent=2, default=str))
        return 0
    if not manifests:
        print(f"no artifacts in {args.store}")
    for m in manifests:
        inputs = ", ".join(f"{k}={v}" for k, v in m["inputs"].items()) or "-"
        print(f"{m['kind']:<17} {m['version']}  {m['created'][:19]}  inputs: {inputs}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from storage import Catalog

    kind, _, version = args.artifact.partition(":")
    catalog = Catalog(args.store)
    manifest = catalog.get(kind, version or None)
    manifest["lineage"] = catalog.lineage(manifest["version"])
    print(json.dumps(manifest, indent=2, default=str))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from storage import ArtifactStore

    checked, problems = ArtifactStore(args.store).audit(full=args.full)
    for problem in problems:
        print(problem)
    print(f"{checked} artifacts checked ({'checksums' if args.full else 'sizes'}), {len(problems)} problems")
    return 1 if problems else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lexiflow", description="Batch NLP pipeline on Prefect.")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the pipeline", description=(
        "Run the full pipeline (corpus → vocabulary → co-occurrence → PPMI → SVD → evaluation). "
        "Stages whose inputs and parameters are unchanged are reused from the store."))
    run.add_argument("--store", help=f"artifact store folder or fsspec URL (default {DEFAULT_STORE})")
    run.add_argument("--corpus", nargs="+", metavar="SOURCE",
                     help="corpus sources: files, folders, globs, builtin:enwiki (default) or builtin:lee")
    run.add_argument("--config", metavar="FILE", help="pipeline parameters as TOML or JSON (sections as in --set)")
    run.add_argument("--set", action="append", metavar="KEY=VALUE",
                     help="override a parameter by dotted name, e.g. --set svd.dim=200 --set corpus.lowercase=false")
    run.set_defaults(func=cmd_run)

    artifacts = sub.add_parser("artifacts", help="inspect the artifact store")
    art = artifacts.add_subparsers(dest="artifacts_command", required=True)
    ls = art.add_parser("list", help="list artifacts, oldest first")
    ls.add_argument("--kind", help="only this kind")
    ls.add_argument("--json", action="store_true",
                    help="JSON: kind, version, created, inputs, parameters, metrics, path per artifact")
    ls.set_defaults(func=cmd_list)
    show = art.add_parser("show", help="one artifact's manifest and lineage")
    show.add_argument("artifact", metavar="KIND[:VERSION]", help="e.g. embeddings (the latest) or embeddings:3f2a...")
    show.set_defaults(func=cmd_show)
    verify = art.add_parser("verify", help="check every artifact's files against its manifest")
    verify.add_argument("--full", action="store_true", help="also compare SHA-256 checksums")
    verify.set_defaults(func=cmd_verify)
    for p in (ls, show, verify):
        p.add_argument("--store", default=DEFAULT_STORE, help=f"artifact store (default {DEFAULT_STORE})")
    return parser


def main(argv: list[str] | None = None) -> int:
    for key, value in PREFECT_DEFAULTS.items():
        os.environ.setdefault(key, value)
    args = build_parser().parse_args(argv)
    from models.errors import LexiflowError
    from storage import StoreError

    try:
        return args.func(args)
    except (LexiflowError, StoreError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
