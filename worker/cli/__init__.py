"""Derender LLM engine output token ids into OpenAI responses: Kafka worker, batch mode, demo.

Subcommands: ``run`` (Kafka worker), ``batch`` (offline logs), ``demo`` (embedded broker end to
end), ``bench`` (throughput), ``broker`` (the embedded broker alone, for local runs), ``schemas``
(regenerate JSON Schemas).

Each subcommand lives in its own module of this package (``worker/cli/<command>.py``); this file
only wires arguments to them. ``python -m worker.cli`` is the console script.
"""
from __future__ import annotations

import argparse
import logging
import sys

from worker.buildinfo import version_line
from worker.cli import batch, bench, broker, demo, run, schemas
from worker.flags import (
    OneLineParser,
    add_log_args,
    apply_env,
    check_env,
    known_env,
    log_settings,
    noop_note,
    unknown_env,
)
from worker.logs import export_log_settings, setup_logging

__all__ = ["main", "parse_args"]

#: subcommand -> (help line, add its flags to a parser, run it: args -> exit status)
COMMANDS = {
    "run": (run.HELP, run.add_args, run.main),
    "batch": (batch.HELP, batch.add_args, batch.main_batch),
    "demo": (demo.HELP, demo.add_demo_args, demo.main_demo),
    "bench": (bench.HELP, bench.add_args, bench.main),
    "broker": (broker.HELP, broker.add_args, broker.main),
    "schemas": (schemas.HELP, schemas.add_args, schemas.main),
}


def _build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The top-level parser and each subcommand's parser (by name)."""
    ap = OneLineParser(prog="derender-worker", description=__doc__.splitlines()[0],
                       epilog="Every flag FOO-BAR of every subcommand also reads DERENDER_FOO_BAR; a flag wins.")
    add_log_args(ap, top=True)
    ap.add_argument("--version", action="version", version=version_line(),
                    help="print the version and the stream-state formats this release reads and writes, then exit")
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=OneLineParser, metavar="COMMAND",
                            help="one of:")
    subs: dict[str, argparse.ArgumentParser] = {}
    for name, (help_text, add, _) in COMMANDS.items():
        p = subs[name] = sub.add_parser(name, help=help_text)
        add(p)
    for p in subs.values():
        add_log_args(p)
        apply_env(p)
    return ap, subs


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, argparse.ArgumentParser]:
    """Parse a command line into ``(args, subcommand parser)``; exits 2 with one line naming the
    subcommand's usage on an unknown flag, a bad value, a malformed ``DERENDER_*`` variable, two
    spellings of one flag's variable set to different values, or a ``DERENDER_*`` variable that no
    flag reads and ``worker.flags.RESERVED_ENV`` does not list."""
    ap, subs = _build_parser()
    args, extra = ap.parse_known_args(argv)
    p = subs[args.cmd]
    if extra:
        p.error(f"unrecognized arguments: {' '.join(extra)}")
    stray = unknown_env(known_env(list(subs.values())))
    if stray:
        p.error(stray)
    check_env(p, args)
    return args, p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``derender-worker`` console script; returns the exit status (2 with
    one error line for every startup mistake)."""
    args, p = parse_args(argv)
    level, fmt = log_settings(p, args)
    setup_logging(level, fmt)
    export_log_settings(level, fmt)  # pool processes log in the same format
    note = noop_note(args)
    if note:
        logging.getLogger("worker.cli").info("%s", note)
    if getattr(args, "tokenizer_mode", None) == "custom":
        logging.getLogger("worker.cli").info(
            "--tokenizer-mode custom: no tokenizer plugin registry here; the --tokenizer files load as in auto mode")
    return COMMANDS[args.cmd][2](args)

if __name__ == "__main__":
    sys.exit(main())
