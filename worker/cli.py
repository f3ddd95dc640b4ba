"""Derender LLM engine output token ids into OpenAI responses: Kafka worker, batch mode, demo.

Subcommands: ``run`` (Kafka worker), ``batch`` (offline logs), ``demo`` (embedded broker end to
end), ``bench`` (throughput), ``broker`` (the embedded broker alone, for local runs), ``schemas``
(regenerate JSON Schemas).

Each subcommand lives in its own module; this file only wires arguments to them.
"""
from __future__ import annotations

import argparse
import logging
import sys

from worker.config import add_model_args
from worker.flags import (
    OneLineParser,
    add_log_args,
    add_vllm_noop_args,
    apply_env,
    check_env,
    log_settings,
    noop_note,
)
from worker.logs import export_log_settings, setup_logging


def _build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The top-level parser and each subcommand's parser (by name)."""
    ap = OneLineParser(prog="derender-worker", description=__doc__.splitlines()[0],
                       epilog="Every flag FOO-BAR of every subcommand also reads DERENDER_FOO_BAR; a flag wins.")
    add_log_args(ap, top=True)
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=OneLineParser, metavar="COMMAND",
                            help="one of:")
    subs: dict[str, argparse.ArgumentParser] = {}

    from worker.transport import settings as transport_settings
    p = subs["run"] = sub.add_parser("run", help="consume engine outputs from Kafka, publish OpenAI responses")
    add_model_args(p, positional_model=True)
    transport_settings.add_run_args(p)
    add_vllm_noop_args(p)

    from worker import batch
    p = subs["batch"] = sub.add_parser("batch", help="derender generation logs (JSONL/.gz, OpenAI Batch, Parquet) into responses (local or Ray)")
    add_model_args(p)
    batch.add_batch_args(p)
    add_vllm_noop_args(p)

    from worker import demo
    p = subs["demo"] = sub.add_parser("demo", help="embedded broker + worker on shipped Qwen3 examples")
    demo.add_demo_args(p)

    from worker import bench
    p = subs["bench"] = sub.add_parser("bench", help="single-core derender throughput on parsed chat outputs")
    add_model_args(p)
    bench.add_bench_args(p)
    add_vllm_noop_args(p)

    p = subs["broker"] = sub.add_parser(
        "broker", help="run the embedded Kafka-protocol broker (Tansu, in memory) for local use")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9092)

    subs["schemas"] = sub.add_parser("schemas", help="regenerate schemas/*.schema.json from the msgspec Structs")
    for p in subs.values():
        add_log_args(p)
        apply_env(p)
    return ap, subs


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, argparse.ArgumentParser]:
    """Parse a command line into ``(args, subcommand parser)``; exits 2 with one line naming the
    subcommand's usage on an unknown flag, a bad value or a malformed ``DERENDER_*`` variable."""
    ap, subs = _build_parser()
    args, extra = ap.parse_known_args(argv)
    p = subs[args.cmd]
    if extra:
        p.error(f"unrecognized arguments: {' '.join(extra)}")
    check_env(p, args)
    return args, p


def main_broker(args: argparse.Namespace) -> int:
    """Run the embedded Tansu broker in the foreground until SIGINT/SIGTERM (in-memory storage,
    topics auto-created on first use). Returns 0, or 2 when it cannot start."""
    import signal
    import threading

    from worker.transport.broker import TansuBroker

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        with TansuBroker(port=args.port, host=args.host) as broker:
            print(f"Kafka-protocol broker (Tansu, in memory) on {broker.bootstrap_servers}; Ctrl-C stops it",
                  flush=True)
            while not stop.wait(0.5):
                if broker.proc is not None and broker.proc.poll() is not None:
                    print(f"broker exited with status {broker.proc.returncode} (log {broker.log_path})",
                          file=sys.stderr)
                    return 2
    except (FileNotFoundError, RuntimeError, TimeoutError, OSError) as e:
        print(f"derender-worker broker: cannot start Tansu: {e}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``derender-worker`` console script; returns the exit status (2 with
    one error line for every startup mistake)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:2] == ["bench", "core"]:  # the core-vs-tokenizer-floor bench has its own flags
        from worker.bench_core import main as bench_core_main
        return bench_core_main(argv[2:])
    if argv[:2] == ["bench", "stream"]:
        from worker.bench_stream import main as bench_stream_main
        return bench_stream_main(argv[2:])
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
    if args.cmd == "run":
        from worker.transport.run import main_run
        return main_run(args)
    if args.cmd == "batch":
        from worker.batch import main_batch
        return main_batch(args)
    if args.cmd == "demo":
        from worker.demo import main_demo
        return main_demo(args)
    if args.cmd == "bench":
        from worker.bench import main_bench
        return main_bench(args)
    if args.cmd == "broker":
        return main_broker(args)
    if args.cmd == "schemas":
        from schemas.__main__ import main as schemas_main
        return schemas_main(["--verbose"])
    p.error(f"unknown command {args.cmd}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
