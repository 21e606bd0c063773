"""`lexiflow serve`: one box (Prefect server, work pools, deployments, workers), or `--stop` to stop it."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from lexiflow.flows import config, prefect_env
from lexiflow.flows.commands.common import DEFAULT_STORE


def _absolute(location: str) -> str:
    """A local path made absolute, since deployed runs work in the code folder, not here; a URL (s3://...)
    or a built-in corpus as given."""
    from fsspec.utils import get_protocol

    if location.startswith("builtin:") or "://" in location or get_protocol(location) != "file":
        return location
    return os.path.abspath(location)


def cmd_serve(args: argparse.Namespace) -> int:
    from lexiflow.deployments import serve

    home = Path(args.home) if args.home else prefect_env.default_home()
    if args.stop:
        lines = serve.stop(home)
        print("\n".join(lines) if lines else f"nothing to stop (no {serve.SERVE_STATE} in {home})")
        return 1 if any(line.endswith("still running!") for line in lines) else 0
    from lexiflow.deployments.definitions import deploy_config

    tree = config.parameter_tree(args.config, args.set)
    store = args.store or tree.get("store")
    settings = deploy_config(
        tree, store=store and _absolute(str(store)), rebuild_cron=args.cron, timezone=args.timezone,
        serving=_absolute(args.serving) if args.serving else None if "://" not in str(store or "") else str(
            home / "serving"),  # an object store's exports go in the server's home
        sources=[_absolute(s) for s in args.corpus or tree.get("corpus", {}).get("sources") or []] or None)
    try:
        state = serve.start(home, settings, port=args.port, gpus=args.gpus.split(",") if args.gpus else None)
    except serve.ServeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for warning in state.get("warnings", []):
        print(f"warning: {warning}", file=sys.stderr)
    print(f"Prefect UI: {state['ui_url']}   (PREFECT_API_URL={state['api_url']})")
    print(f"Store: {settings.store}\nDeployments: {', '.join(state['deployments'])}")
    print(f"Schedule: corpus-rebuild at cron '{settings.rebuild_cron}' in time zone {settings.timezone} "
          f"(--cron, --timezone)")
    if settings.parameters:
        print(f"Parameters of pipeline and corpus-rebuild (--config, --set): {json.dumps(settings.parameters)}")
    print(f"serve-release exports to: {settings.serving} (--serving)")
    for proc in state["processes"]:
        print(f"  {proc['name']:<12} pid {proc['pid']:<8} log {proc['log']}")
    print("Stop everything with: lexiflow serve --stop" + (f" --home {args.home}" if args.home else ""))
    return 0


def add_parser(sub: Any) -> None:
    srv = sub.add_parser("serve", help="one box: Prefect server, work pools, deployments, CPU and GPU workers",
                         description="Start a Prefect server on 127.0.0.1, create the cpu and gpu work pools, deploy, "
                                     "and start a CPU worker and a GPU worker per GPU; --stop stops exactly those.")
    srv.add_argument("--stop", action="store_true", help="stop what `lexiflow serve` started (by PID)")
    srv.add_argument("--home", help="PREFECT_HOME: database, logs, state file (default $PREFECT_HOME or .prefect)")
    srv.add_argument("--port", type=int, help="server port on 127.0.0.1 (default: a free one)")
    srv.add_argument("--store", help=f"artifact store the workers share (default {DEFAULT_STORE})")
    srv.add_argument("--corpus", nargs="+", metavar="SOURCE", help="corpus-rebuild sources (default: the config's "
                                                                   "corpus.sources, else builtin:enwiki)")
    srv.add_argument("--cron", help="corpus-rebuild schedule (default weekly: '0 3 * * 1')")
    srv.add_argument("--timezone", help="IANA time zone of --cron (default UTC), e.g. Europe/Berlin")
    srv.add_argument("--gpus", help="GPU ids, one GPU worker each with CUDA_VISIBLE_DEVICES set (default 0)")
    srv.add_argument("--serving", metavar="DIR", help="serve-release's export folder (default: `serving` beside a "
                                                      "local store, else in --home)")
    config.add_configuration(srv)
    srv.set_defaults(func=cmd_serve)
