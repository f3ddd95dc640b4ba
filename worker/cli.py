"""Derender LLM engine output token ids into OpenAI responses: Kafka worker, batch mode, demo.

Subcommands: ``run`` (Kafka worker), ``batch`` (offline logs), ``demo`` (embedded broker end to
end), ``bench`` (throughput), ``schemas`` (regenerate JSON Schemas).

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

    from worker.transport import kafka_worker
    p = sub.add_parser("run", help="consume engine outputs from Kafka, publish OpenAI responses")
    add_model_args(p)
    kafka_worker.add_run_args(p)

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

    sub.add_parser("schemas", help="regenerate schemas/*.schema.json from the msgspec Structs")
    return ap


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``derender-worker`` console script; returns the exit status."""
    ap = _build_parser()
    args = ap.parse_args(argv)
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if args.cmd == "run":
        from worker.transport.kafka_worker import main_run
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
    if args.cmd == "schemas":
        from schemas.__main__ import main as schemas_main
        return schemas_main([])
    ap.error(f"unknown command {args.cmd}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
