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


def _build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="derender-worker", description=__doc__.splitlines()[0])
    ap.add_argument("--log-level", default="INFO")
    sub = ap.add_subparsers(dest="cmd", required=True)

    from worker.transport import settings as transport_settings
    p = sub.add_parser("run", help="consume engine outputs from Kafka, publish OpenAI responses")
    add_model_args(p)
    transport_settings.add_run_args(p)

    from worker import batch
    p = sub.add_parser("batch", help="derender a generation log (JSONL, .gz ok) into a JSONL file")
    add_model_args(p)
    batch.add_batch_args(p)

    from worker import demo
    p = sub.add_parser("demo", help="embedded broker + worker on shipped Qwen3 examples")
    demo.add_demo_args(p)

    from worker import bench
    p = sub.add_parser("bench", help="single-core derender throughput on parsed chat outputs")
    bench.add_bench_args(p)

    p = sub.add_parser("broker", help="run the embedded Kafka-protocol broker (Tansu, in memory) for local use")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9092)

    sub.add_parser("schemas", help="regenerate schemas/*.schema.json from the msgspec Structs")
    return ap


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
    """Entry point of the ``derender-worker`` console script; returns the exit status."""
    ap = _build_parser()
    args = ap.parse_args(argv)
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
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
    ap.error(f"unknown command {args.cmd}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
