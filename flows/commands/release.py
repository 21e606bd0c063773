"""`lexiflow release`: move an alias to a version, roll it back, or print its release log."""

from __future__ import annotations

import argparse
from typing import Any

from lexiflow.flows.commands.common import (
    DEFAULT_STORE,
    announcer_of,
    pick,
    printable,
    read_catalog,
    strict_json,
)


def cmd_release(args: argparse.Namespace) -> int:
    """Move an alias to a version (`KIND:VERSION`, or `KIND:TAG`/`KIND@OTHER` for the version they name), or
    back one release (`--rollback KIND`), and print the move; or print a kind's release log (`--log KIND`)."""
    from lexiflow.models.errors import ParameterError
    from lexiflow.storage import StoreError
    from lexiflow.storage.catalog import DEFAULT_ALIAS, validate_alias

    catalog = read_catalog(args.store)
    action = "--rollback" if args.rollback else "--log" if args.log else None
    if action and (":" in args.artifact or "@" in args.artifact):
        raise ParameterError(f"{action} {args.artifact}: give the kind alone (e.g. {action} embeddings), with --as "
                             "NAME for one alias")
    alias = None if args.log and args.alias is None else validate_alias(DEFAULT_ALIAS if args.alias is None
                                                                        else args.alias)
    if args.log:
        entries = catalog.release_log(args.artifact, alias)
        if alias is not None and not entries:
            raise StoreError(f"no alias {alias!r} for {args.artifact} in {catalog.store.url}: nothing released under "
                             "it (`lexiflow artifacts list` shows the aliases there)")
        if args.json:
            print(strict_json(entries))
        for e in [] if args.json else entries:
            print(f"{e['kind']}@{e['alias']} #{e['seq']} {e['at'][:19]} {e['action']:<8} {e['from'] or '(none)'} -> "
                  f"{e['to']}" + (f"  reason: {printable(e['reason'])}" if e["reason"] else "")
                  + (f"  flow run: {printable(e['flow_run'])}" if e["flow_run"] else ""))
        return 0
    if args.rollback:
        entry = catalog.rollback(args.artifact, alias, reason=args.reason, announce=announcer_of(catalog))
    else:
        if ":" not in args.artifact and "@" not in args.artifact:
            raise ParameterError(f"{args.artifact}: give KIND:VERSION to release (`lexiflow artifacts list` shows "
                                 "them), or --rollback KIND")
        manifest = pick(catalog, args.artifact)
        entry = catalog.release(manifest["kind"], manifest["version"], alias, reason=args.reason,
                                announce=announcer_of(catalog))
    if entry.get("unchanged"):
        print(f"{entry['kind']}@{entry['alias']} already names {entry['to']}: nothing moved"
              + (", the reason is not recorded" if args.reason else ""))
        return 0
    print(f"{entry['kind']}@{entry['alias']}: {entry['from'] or '(none)'} -> {entry['to']}"
          + (" (rollback)" if entry["action"] == "rollback" else ""))
    return 0


def add_parser(sub: Any) -> None:
    rel = sub.add_parser("release", help="name a version for downstream jobs (an alias: KIND@NAME), or roll it back",
                         description="Point the alias KIND@NAME (default production) at a version, or with --rollback "
                                     "back at the version it named before; every move is appended to the alias's "
                                     "release log in the store (--log prints it). Downstream jobs read KIND@NAME.")
    rel.add_argument("artifact", metavar="KIND:VERSION | KIND",
                     help="the version to release, e.g. embeddings:3f2a... (also KIND:TAG or KIND@OTHER); with "
                          "--rollback or --log the kind alone")
    rel.add_argument("--as", dest="alias", metavar="NAME", help="the alias to move (default production; --log: "
                                                                "every alias of the kind)")
    mode = rel.add_mutually_exclusive_group()
    mode.add_argument("--rollback", action="store_true", help="move the alias back one release")
    mode.add_argument("--log", action="store_true", help="print the kind's release log (every move, oldest first)")
    rel.add_argument("--json", action="store_true", help="--log as JSON: kind, alias, seq, action, from, to, at, "
                                                         "reason, flow_run per move")
    rel.add_argument("--reason", default="", metavar="TEXT", help="why, for the release log")
    rel.add_argument("--store", default=DEFAULT_STORE, help=f"artifact store (default {DEFAULT_STORE})")
    rel.set_defaults(func=cmd_release)
