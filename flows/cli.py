"""The `lexiflow` command line.

    lexiflow run [--store DIR] [--corpus SOURCE ...] [--config FILE] [--set key=value ...]
    lexiflow release KIND:VERSION [--as NAME] [--reason TEXT] [--store DIR]    (NAME: default production)
    lexiflow release --rollback KIND [--as NAME] [--reason TEXT] [--store DIR]
    lexiflow release --log KIND [--as NAME] [--json] [--store DIR]
    lexiflow artifacts list [--store DIR] [--kind KIND] [--json]
    lexiflow artifacts show KIND[:VERSION|:TAG|@NAME] [--store DIR]  (TAG: method, tokenizer kind, model, column)
    lexiflow artifacts verify [--store DIR] [--full]
    lexiflow generate --prompt TEXT [--lm VERSION|lm@NAME] [--strategy greedy|beam|sample] [--top-k K] [--top-p P]
    lexiflow tag INPUT [-o OUTPUT] [--tagger VERSION|tagger@NAME ...] [--method viterbi|greedy|beam]
    lexiflow translate [INPUT] [-o OUTPUT] [--model VERSION|seq2seq@NAME] [--beam N]
    lexiflow artifacts export KIND[:VERSION|:TAG|@NAME] DIR [--store DIR]
    lexiflow artifacts rm KIND:VERSION [--force] [--store DIR]
    lexiflow artifacts gc [--keep N] [--older-than SECONDS] [--dry-run] [--store DIR]
    lexiflow serve [--home DIR] [--port N] [--store DIR] [--corpus SOURCE ...] [--cron CRON] [--timezone TZ]
                   [--config FILE] [--set key=value ...] [--serving DIR] [--gpus 0,1] | --stop

Errors a user can fix print one line (`error: ...`) and exit with status 2.

Here: the parser, assembled from one module per command group (`flows/commands/`: run, artifacts, release,
tag/generate/translate, serve), and `main`. Each group's module imports its heavy modules (Prefect, the
pipeline, the models, polars) inside its commands, not at its top.
"""

from __future__ import annotations

import argparse
import os
import sys

from lexiflow.flows import prefect_env
from lexiflow.flows.commands import artifacts, inference, release, run, serve
from lexiflow.flows.commands.common import printable


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lexiflow", description="Batch NLP pipeline on Prefect.")
    sub = parser.add_subparsers(dest="command", required=True)
    for group in (run.add_parser, inference.add_parsers, release.add_parser, artifacts.add_parser, serve.add_parser):
        group(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    prefect_env.apply()  # quiet, offline Prefect unless the user configured otherwise; before Prefect is imported
    args = build_parser().parse_args(argv)
    from lexiflow.models.errors import LexiflowError
    from lexiflow.storage import StoreError

    try:
        status = args.func(args)
        sys.stdout.flush()  # a reader that went away shows here, not at exit
        return status
    except (LexiflowError, StoreError) as exc:
        # One line whatever the message holds (a name with a newline or an escape code, from a source not quoted)
        print("error: " + printable(str(exc)), file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader stopped early (`| head`): stop quietly, as other CLIs do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python flushes stdout again at exit
        return 141  # 128 + SIGPIPE, what a shell reports for a command a closed pipe stopped


def command() -> int:
    """The installed `lexiflow` command: `main` once the environment matches the checkout's lock."""
    from lexiflow.install_check import stale_install

    problem = stale_install()
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    return main()


if __name__ == "__main__":
    sys.exit(main())
