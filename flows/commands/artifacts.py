"""`lexiflow artifacts list|show|verify|export|rm|gc`: inspecting and cleaning the artifact store."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from lexiflow.flows.commands.common import DEFAULT_STORE, announcer_of, names_of, pick, read_catalog, strict_json


def _listing(manifest: dict[str, Any], aliases: dict[str, dict[str, str]]) -> dict[str, Any]:
    return {"kind": manifest["kind"], "version": manifest["version"], "created": manifest["created"],
            "aliases": names_of(aliases, manifest["kind"], manifest["version"]),
            "inputs": {name: ref["version"] for name, ref in manifest["inputs"].items()},
            "parameters": manifest["parameters"], "metrics": manifest["metrics"], "path": manifest["path"]}


def cmd_list(args: argparse.Namespace) -> int:
    from lexiflow.storage.formats import DISTINGUISHED_BY

    catalog = read_catalog(args.store)
    aliases = catalog.aliases(args.kind)
    manifests = [_listing(m, aliases) for m in catalog.list(args.kind)]
    for reason in catalog.left_out:
        print(f"warning: left out: {reason}", file=sys.stderr)
    if args.json:
        print(strict_json(manifests))
        return 0
    if not manifests:
        print(f"no artifacts in {args.store}")
    for m in manifests:
        inputs = ", ".join(f"{k}={v}" for k, v in m["inputs"].items()) or "-"
        tag = m["metrics"].get(DISTINGUISHED_BY.get(m["kind"], ""), "-")  # what tells it from others of its kind
        released = "".join(f"@{name} " for name in m["aliases"])
        print(f"{m['kind']:<17} {m['version']}  {tag!s:<11} {m['created'][:19]}  {released}inputs: {inputs}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    catalog = read_catalog(args.store)
    manifest = pick(catalog, args.artifact)
    manifest["aliases"] = names_of(catalog.aliases(manifest["kind"]), manifest["kind"], manifest["version"])
    manifest["lineage"] = catalog.lineage(manifest["version"])
    print(strict_json(manifest))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    checked, problems = read_catalog(args.store).audit(full=args.full)
    for problem in problems:
        print(problem)
    print(f"{checked} artifacts checked ({'checksums' if args.full else 'sizes'}), {len(problems)} problems")
    return 1 if problems else 0


def cmd_rm(args: argparse.Namespace) -> int:
    from lexiflow.models.errors import ParameterError
    from lexiflow.storage import StoreError
    from lexiflow.storage.releases import deleting, pending_versions

    kind, _, version = args.artifact.partition(":")
    if not version:
        raise ParameterError(f"{args.artifact}: give KIND:VERSION (`lexiflow artifacts list` shows them)")
    catalog = read_catalog(args.store)
    store = catalog.store
    with deleting(catalog, announcer_of(catalog)):  # no alias moves while it decides and deletes
        if not store.exists(kind, version):
            raise StoreError(f"no artifact {kind}:{version} in {store.url}")
        released = names_of(catalog.aliases(kind), kind, version)
        if (kind, version) in pending_versions(store) and not args.force:
            raise StoreError(f"{kind}:{version} is being released; try again once the release is done")
        if released and not args.force:
            raise StoreError(f"{kind}:{version} is released as {', '.join(f'{kind}@{name}' for name in released)}; "
                             "release another version first, or add --force (the alias then names a missing artifact)")
        built_from_it = catalog.dependents(kind, version)
        if built_from_it and not args.force:
            raise StoreError(f"{kind}:{version}: {len(built_from_it)} artifact(s) were built from it "
                             f"({', '.join(built_from_it[:5])}{', ...' if len(built_from_it) > 5 else ''}); remove "
                             "them first, or add --force (they stay usable, their lineage then names a missing input)")
        store.delete(kind, version)
    print(f"removed {kind}:{version}")
    if built_from_it:
        print(f"{len(built_from_it)} artifact(s) built from it stay usable; their lineage names {kind}:{version} as "
              "missing, and the next run that needs it rebuilds it (same version): "
              + ", ".join(built_from_it))
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    from lexiflow.storage.pieces import garbage as piece_garbage
    from lexiflow.storage.pieces import remove_garbage as remove_piece_garbage
    from lexiflow.storage.releases import deleting

    catalog = read_catalog(args.store)
    store = catalog.store
    with deleting(catalog, announcer_of(catalog)):  # no alias moves between deciding and deleting
        leftovers = store.leftovers(older_than=args.older_than)
        versions = catalog.unreferenced(args.keep) if args.keep is not None else []
        pieces = piece_garbage(store, args.older_than, gone=versions)  # docs/design.md, "Incremental rebuilds"
        verb = "would remove" if args.dry_run else "removed"
        if not args.dry_run:
            store.remove_leftovers(leftovers)
            for kind, version in versions:
                store.delete(kind, version)
            remove_piece_garbage(store, pieces)
    for entry in leftovers:
        print(f"{verb} leftover {entry}")
    if pieces:
        print(f"{verb} {len(pieces)} pieces and records of partial results no artifact uses")
    for kind, version in versions:
        print(f"{verb} {kind}:{version}")
    policy = (f"keeping the {args.keep} newest of each kind, the released ones and what they were built from"
              if args.keep is not None
              else "no --keep: every artifact kept")
    print(f"{verb} {len(leftovers)} leftovers of killed writers and {len(versions)} artifacts ({policy})")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from lexiflow.loaders import EXPORT_EXTRAS
    from lexiflow.storage.export import export

    catalog = read_catalog(args.store)
    manifest = pick(catalog, args.artifact)
    for path in export(catalog, manifest["kind"], manifest["version"], args.dest, EXPORT_EXTRAS):
        print(path)
    return 0


def add_parser(sub: Any) -> None:
    artifacts = sub.add_parser("artifacts", help="inspect the artifact store")
    art = artifacts.add_subparsers(dest="artifacts_command", required=True)
    ls = art.add_parser("list", help="list artifacts, oldest first")
    ls.add_argument("--kind", help="only this kind")
    ls.add_argument("--json", action="store_true",
                    help="JSON: kind, version, created, inputs, parameters, metrics, path per artifact")
    ls.set_defaults(func=cmd_list)
    show = art.add_parser("show", help="one artifact's manifest and lineage")
    show.add_argument("artifact", metavar="KIND[:VERSION|:TAG|@NAME]",
                      help="e.g. embeddings (the latest), embeddings:glove (the latest GloVe), embeddings:3f2a... or "
                           "embeddings@production (the released one)")
    show.set_defaults(func=cmd_show)
    verify = art.add_parser("verify", help="check every artifact's files against its manifest")
    verify.add_argument("--full", action="store_true", help="also compare SHA-256 checksums")
    verify.set_defaults(func=cmd_verify)
    exp = art.add_parser("export", help="copy an artifact into a folder in open formats (Parquet, word2vec, "
                                        "tokenizer.json, safetensors)")
    exp.add_argument("artifact", metavar="KIND[:VERSION|:TAG|@NAME]",
                     help="e.g. embeddings (the latest), tokenizer:bpe (the latest BPE), tokenizer:3f2a... or "
                          "embeddings@production")
    exp.add_argument("dest", metavar="DIR", help="destination folder (created if missing)")
    exp.set_defaults(func=cmd_export)
    rm = art.add_parser("rm", help="remove one artifact (refused when others were built from it or an alias names "
                                   "it, unless --force)")
    rm.add_argument("artifact", metavar="KIND:VERSION", help="e.g. corpus:3f2a...")
    rm.add_argument("--force", action="store_true",
                    help="remove it although artifacts were built from it or an alias names it (they stay; it is "
                         "rebuilt when needed)")
    rm.set_defaults(func=cmd_rm)
    gc = art.add_parser("gc", help="remove what killed writers left and, with --keep, old unreferenced artifacts",
                        description="Removes staging folders and temporary copies of killed writers (a live writer "
                                    "holds a lock and is never touched) and, with --keep N, every artifact that is "
                                    "neither among the N newest of its kind, nor released (an alias names it, or "
                                    "its rollback returns to it), nor an input (transitively) of one of those: "
                                    "the latest reports and the released versions keep their whole lineage.")
    gc.add_argument("--keep", type=int, metavar="N", help="keep the N newest artifacts of each kind (and their inputs)")
    gc.add_argument("--older-than", type=float, default=3600, metavar="SECONDS",
                    help="age after which leftovers no lock protects (object-store uploads, saved scratch state, "
                         "staging without a lock file) count as abandoned (default 3600)")
    gc.add_argument("--dry-run", action="store_true", help="only print what would be removed")
    gc.set_defaults(func=cmd_gc)
    for p in (ls, show, verify, exp, rm, gc):
        p.add_argument("--store", default=DEFAULT_STORE, help=f"artifact store (default {DEFAULT_STORE})")
