"""``derender-worker bench kafka`` (alias ``bench --kafka``): end-to-end throughput and latency through a real broker.

Starts the embedded broker (Tansu, in memory) unless ``--bootstrap-servers`` names one, creates
fresh topics (input with ``--partitions`` partitions), starts ``--workers`` ``derender-worker
run`` subprocesses in one consumer group (each with ``--num-threads`` pool processes), waits
until they answer, then publishes ``--requests`` records at ``--rate`` records/s (the same
bodies as the in-process ``bench``: 256-token Qwen3 chat outputs with reasoning and a Hermes
tool call) and reads the replies. Prints the achieved throughput (replies/s from the first send
to the last reply) and end-to-end latency percentiles (record send to reply receipt, both
clocks in this process), beside the in-process core figure on the same bodies.

Everything shares this machine: the broker, this producer/consumer and the workers compete for
the same cores, so on a small machine a second worker shows contention, not scaling. Nothing is
asserted; figures go to docs/performance.md.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import msgspec
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from worker.bench.core import bench_models, build_bodies, run_bench
from worker.config import ServedModelConfig
from worker.core.service import DerenderService
from worker.flags import add_bootstrap_servers_arg, startup_error
from worker.transport.broker import TansuBroker
from worker.transport.topics import ensure_topics

REPO = Path(__file__).resolve().parent.parent.parent


def add_args(ap: argparse.ArgumentParser) -> None:
    """Flags of ``bench kafka`` (model flags come from ``add_model_args``, the bodies' flags from
    ``worker.bench.core.add_args``)."""
    g = ap.add_argument_group("end to end through Kafka (bench kafka, or bench --kafka)")
    add_bootstrap_servers_arg(g, None, "use this broker (default: start the embedded one); fresh topics are created")
    g.add_argument("--workers", type=int, default=1, help="derender-worker run processes in the group")
    g.add_argument("--num-threads", type=int, default=1, help="pool processes per worker")
    g.add_argument("--partitions", type=int, default=4, help="partitions of the input topic")
    g.add_argument("--rate", type=float, default=200.0, help="offered load, records/s")
    g.add_argument("--requests", type=int, default=2000, help="records published")
    g.add_argument("--fetch-max-wait-ms", type=int, default=500, help="passed to the workers (as run's flag)")


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile ``q`` (0-100) of ascending ``sorted_values``; NaN when empty."""
    if not sorted_values:
        return float("nan")
    k = max(0, min(len(sorted_values) - 1, math.ceil(q / 100 * len(sorted_values)) - 1))
    return sorted_values[k]


def _start_workers(bootstrap: str, cfg_path: str, topics: dict[str, str], group: str, workers: int,
                   num_threads: int, logdir: Path, fetch_max_wait_ms: int = 500) -> list[tuple[subprocess.Popen, Path]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DERENDER_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    procs = []
    for i in range(workers):
        log_path = logdir / f"worker-{i}.log"
        with open(log_path, "wb") as logf:
            p = subprocess.Popen(
                [sys.executable, "-m", "worker.cli", "run", "--config", cfg_path, "--bootstrap-servers", bootstrap,
                 "--input-topic", topics["in"], "--reply-topic", topics["reply"], "--dead-letter-topic", topics["dlq"],
                 "--group-id", group, "--num-threads", str(num_threads), "--stream-state", "memory",
                 "--session-timeout-ms", "6000", "--heartbeat-interval-ms", "1000", "--commit-interval-ms", "200",
                 "--fetch-max-wait-ms", str(fetch_max_wait_ms), "--log-level", "WARNING"],
                cwd=REPO, env=env, stdout=logf, stderr=subprocess.STDOUT)
        procs.append((p, log_path))
    return procs


async def _run_load(bootstrap: str, topics: dict[str, str], bodies: list[bytes], rate: float, n: int,
                    warmup: int, timeout: float) -> dict:
    """Warm up (``warmup`` records answered), then publish ``n`` records at ``rate``/s and collect
    their replies. Returns ``{"latencies": [s...], "seconds": first send -> last reply, "lost": int}``."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False, linger_ms=1)
    consumer = AIOKafkaConsumer(topics["reply"], bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False, metadata_max_age_ms=1000, fetch_max_wait_ms=10)
    await producer.start()
    await consumer.start()
    sent: dict[bytes, float] = {}
    got: dict[bytes, float] = {}

    async def receive(want: set[bytes], deadline: float) -> None:
        while want - got.keys() and time.monotonic() < deadline:
            for recs in (await consumer.getmany(timeout_ms=100)).values():
                now = time.monotonic()
                for r in recs:
                    if r.key is not None and r.key not in got:
                        got[r.key] = now

    try:
        warm = set()
        for i in range(warmup):
            k = f"warm-{i}".encode()
            warm.add(k)
            await producer.send(topics["in"], bodies[i % len(bodies)], key=k)
        await producer.flush()
        await receive(warm, time.monotonic() + timeout)
        if warm - got.keys():
            raise RuntimeError(f"workers answered {len(warm & got.keys())}/{len(warm)} warm-up records in {timeout}s")
        keys = [f"r-{i}".encode() for i in range(n)]
        recv = asyncio.create_task(receive(set(keys), time.monotonic() + timeout + n / rate))
        t0 = time.monotonic()
        for i, k in enumerate(keys):
            due = t0 + i / rate
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            sent[k] = time.monotonic()
            await producer.send(topics["in"], bodies[i % len(bodies)], key=k)
        await producer.flush()
        await recv
    finally:
        await producer.stop()
        await consumer.stop()
    lat = sorted(got[k] - sent[k] for k in sent if k in got)
    last = max((got[k] for k in sent if k in got), default=t0)
    return {"latencies": lat, "seconds": last - min(sent.values()), "lost": len(sent) - len(lat)}


def run_kafka_bench(models: list[ServedModelConfig], model: str, args: argparse.Namespace) -> dict:
    """The end-to-end measurement (module docstring). Returns the figures as a dict; raises
    ``RuntimeError`` when the workers do not start or answer."""
    service = DerenderService(models)
    service.preload()
    bodies = build_bodies(service, model, args.tokens, args.distinct)
    core = run_bench(service, model, args.tokens, args.distinct, min(args.seconds, 2.0), 1)
    u = uuid.uuid4().hex[:8]
    topics = {"in": f"bench-in-{u}", "reply": f"bench-rep-{u}", "dlq": f"bench-dlq-{u}"}
    with tempfile.TemporaryDirectory(prefix="derender-bench-") as tmp:
        cfg = Path(tmp) / "models.json"
        cfg.write_text(json.dumps({m.name: {k: v for k, v in msgspec.to_builtins(m).items() if k != "name"}
                                   for m in models}))
        broker = None if args.bootstrap_servers else TansuBroker()
        if broker is not None:
            broker.__enter__()
        procs: list[tuple[subprocess.Popen, Path]] = []
        try:
            bootstrap = args.bootstrap_servers or broker.bootstrap_servers
            asyncio.run(ensure_topics(bootstrap, {topics["in"]: args.partitions, topics["reply"]: 1,
                                                  topics["dlq"]: 1}))
            procs = _start_workers(bootstrap, str(cfg), topics, f"bench-{u}", args.workers, args.num_threads,
                                   Path(tmp), args.fetch_max_wait_ms)
            try:
                r = asyncio.run(_run_load(bootstrap, topics, bodies, args.rate, args.requests,
                                          warmup=4 * args.partitions, timeout=120.0))
            except RuntimeError as e:
                tails = "; ".join(p.read_text(errors="replace")[-400:] for _, p in procs)
                raise RuntimeError(f"{e}; worker logs: {tails}") from e
        finally:
            for p, _ in procs:
                p.terminate()
            for p, _ in procs:
                try:
                    p.wait(timeout=40)
                except subprocess.TimeoutExpired:
                    p.kill()
            if broker is not None:
                broker.__exit__(None, None, None)
    lat = r["latencies"]
    return {"workers": args.workers, "num_threads": args.num_threads, "partitions": args.partitions,
            "fetch_max_wait_ms": args.fetch_max_wait_ms,
            "offered_rate": args.rate, "requests": args.requests, "replies": len(lat), "lost": r["lost"],
            "throughput": len(lat) / r["seconds"] if r["seconds"] > 0 else float("nan"),
            "p50_ms": 1000 * percentile(lat, 50), "p99_ms": 1000 * percentile(lat, 99),
            "mean_ms": 1000 * statistics.fmean(lat) if lat else float("nan"),
            "core_responses_per_s": core["responses_per_s"], "cores": os.cpu_count()}


def print_kafka_bench(model: str, tokens: int, r: dict) -> None:
    """Print the figures of ``run_kafka_bench``."""
    print(f"derender bench --kafka: model={model} output_tokens={tokens}, {r['workers']} worker(s) x "
          f"{r['num_threads']} pool process(es), {r['partitions']} partitions, fetch-max-wait {r['fetch_max_wait_ms']} ms, "
          f"{r['cores']} cores shared with the broker and this client")
    print(f"  offered {r['offered_rate']:.0f} records/s x {r['requests']}: {r['replies']} replies "
          f"({r['lost']} missing), throughput {r['throughput']:.0f} replies/s")
    print(f"  end-to-end latency (send -> reply received): p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, "
          f"mean {r['mean_ms']:.1f} ms")
    print(f"  in-process core on the same bodies: {r['core_responses_per_s']:.0f} responses/s (1 process)")


def run_suite(args: argparse.Namespace) -> int:
    """``bench kafka``: measure and print; returns 0, or 2 (one line) on a configuration error or
    when the broker or the workers do not start or answer."""
    try:
        models, name = bench_models(args)
        r = run_kafka_bench(models, name, args)
    except (ValueError, OSError, RuntimeError, TimeoutError) as e:
        return startup_error("derender-worker bench", str(e))
    print_kafka_bench(name, args.tokens, r)
    return 0
