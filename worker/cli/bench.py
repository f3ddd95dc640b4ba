"""``derender-worker bench [SUITE]``: the benchmarks of ``worker.bench`` (``core``, ``kafka``,
``batch``, ``stream``, ``parsers``, ``responses``, ``drain``, ``logprobs``). Bare ``bench`` is ``bench core``; ``bench --kafka`` is
``bench kafka``. The flags of ``core``/``kafka`` (model flags, ``--tokens``, ``--rate``, ...) may
come before or after the suite name; the other suites take their own flags after it."""
from __future__ import annotations

import argparse

from worker.bench import batch, core, drain, kafka, logprobs, parsers, responses, stream
from worker.config import add_model_args
from worker.flags import add_vllm_noop_args

HELP = "benchmarks: core (default), kafka, batch, stream, parsers, responses, drain, logprobs"

_SUITES = {"core": core, "kafka": kafka, "batch": batch, "stream": stream, "parsers": parsers,
           "responses": responses, "drain": drain, "logprobs": logprobs}
_HELP = {"core": "single-core derender throughput on parsed chat outputs (the default)",
         "kafka": "end-to-end throughput and latency through a broker and worker subprocesses",
         "batch": "batch records/s and peak RSS on generated logs",
         "stream": "per-chunk streaming latency and state size (--redis: through Redis)",
         "parsers": "parse throughput of every parser family",
         "responses": "the Responses API paths next to chat: per record and per stream chunk",
         "drain": "Kafka drain of a pre-filled topic by one worker vs batch on the same bodies (ratio)",
         "logprobs": "batch --workers 1 CPU per record with logprobs against the JSON I/O floor of the same bytes"}

__all__ = ["HELP", "add_args", "main"]


def _core_and_kafka_args(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    core.add_args(p)
    kafka.add_args(p)


def add_args(p: argparse.ArgumentParser) -> None:
    """Flags of ``bench`` (those of ``core`` and ``kafka``, ``--kafka``) and its suites."""
    _core_and_kafka_args(p)
    p.add_argument("--kafka", action="store_true", help="same as `bench kafka`")
    add_vllm_noop_args(p)
    suites = p.add_subparsers(dest="suite", metavar="SUITE", parser_class=type(p),
                              help="default core; SUITE --help lists its flags")
    for name, mod in _SUITES.items():
        sp = suites.add_parser(name, help=_HELP[name], description=_HELP[name])
        if mod in (core, kafka):
            _core_and_kafka_args(sp)
            for a in sp._actions:  # a flag not repeated after the suite name keeps bench's value
                a.default = argparse.SUPPRESS
        else:
            mod.add_args(sp)


def main(args: argparse.Namespace) -> int:
    """Run the chosen suite; its exit status."""
    name = args.suite or ("kafka" if args.kafka else "core")
    return _SUITES[name].run_suite(args)
