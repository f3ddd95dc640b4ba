"""Benchmarks behind ``derender-worker bench SUITE``; each prints figures and asserts nothing
(speed targets and figures live in docs/performance.md, never in timed unit tests).

| suite | module | measures |
|---|---|---|
| ``core`` (bare ``bench``) | ``worker.bench.core`` | single-core derender throughput on parsed chat outputs |
| ``kafka`` (``bench --kafka``) | ``worker.bench.kafka`` | end-to-end throughput and latency through a broker and worker subprocesses |
| ``batch`` | ``worker.bench.batch`` | batch records/s (1 process, 2 processes, local Ray) and peak RSS |
| ``stream`` | ``worker.bench.stream`` | per-chunk streaming latency and state size (optionally through Redis) |
| ``parsers`` | ``worker.bench.parsers`` | parse throughput of every parser family |
| ``responses`` | ``worker.bench.responses`` | the Responses API paths next to chat (per record, per chunk) |
| ``drain`` | ``worker.bench.drain`` | records/s draining a pre-filled topic through one worker vs ``batch`` on the same bodies, and their ratio |
| ``logprobs`` | ``worker.bench.logprobs`` | ``batch --workers 1`` CPU per record with logprobs (chat, completion, Responses) against the JSON I/O floor of the same bytes |

Each suite module has ``add_args(parser)`` (its flags) and ``run_suite(args) -> int`` (exit
status); ``batch``, ``stream`` and ``parsers`` also run as ``python -m worker.bench.<suite>``
(and, for old command lines, ``python -m worker.bench_<suite>``). The command line wiring is
``worker.cli.bench``.
"""

SUITES = ("core", "kafka", "batch", "stream", "parsers", "responses", "drain", "logprobs")
