"""``derender-worker bench drain``: the Kafka drain rate of one worker against ``derender-worker batch`` on the same bodies.

Pre-fills a fresh input topic (``--partitions`` partitions, the embedded broker unless
``--bootstrap-servers``) with ``--requests`` records (the ``bench`` bodies: 256-token Qwen3 chat
outputs with reasoning and a Hermes tool call, ``--distinct`` of them cycled), then starts one
``derender-worker run`` with ``--num-threads`` pool processes and reads every reply. The drain
rate is replies/s between the first and the last reply's Kafka timestamp (set by the worker's
producer when it sends), so the worker's start-up and the first fetch are not counted. Then it
writes the same bodies as a JSONL file and runs ``derender-worker batch --workers
--num-threads`` on it; the batch rate is the one its summary prints (derender time, without
start-up). Each is measured ``--repeats`` times (a fresh topic and worker per drain) and the
best run of each counts, as load from other jobs only ever slows a run down. Prints both rates
and the ratio drain / batch: what the Kafka transport costs beside the derender itself (1.0 =
none). On Linux each drain also prints the CPU microseconds per record of the worker's main
process, its pool processes, the embedded broker and this reader, from the first reply read to
the last (``/proc/PID/stat``): figures that other jobs on the machine disturb far less than the
rates, and the pool's share of them is the ratio a drain reaches when every core is busy.

``--code DIR`` runs the worker and the batch from another checkout of this project (its
``worker`` package, its demo models), the broker, the producer and the reader from this one: to
compare two releases on the same machine, interleave runs of each. Everything shares this
machine (the broker, this process and the worker compete for the same cores). Nothing is
asserted; figures go to docs/performance.md.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from worker.bench.core import DEMO, build_bodies
from worker.config import load_config_file
from worker.core.service import DerenderService
from worker.flags import add_bootstrap_servers_arg, startup_error
from worker.transport.broker import TansuBroker
from worker.transport.topics import ensure_topics

REPO = Path(__file__).resolve().parent.parent.parent

__all__ = ["add_args", "run_drain_bench", "run_suite"]


def add_args(ap: argparse.ArgumentParser) -> None:
    """Flags of ``bench drain``."""
    ap.add_argument("--requests", type=int, default=20_000, help="records pre-filled and drained")
    ap.add_argument("--tokens", type=int, default=256, help="output tokens per record (at least 64)")
    ap.add_argument("--distinct", type=int, default=64, help="distinct bodies cycled through")
    ap.add_argument("--partitions", type=int, default=4, help="partitions of the input topic")
    ap.add_argument("--num-threads", type=int, default=1,
                    help="pool processes of the worker (and --workers of the batch run)")
    add_bootstrap_servers_arg(ap, None, "use this broker (default: start the embedded one); fresh topics are created")
    ap.add_argument("--code", default=None,
                    help="checkout of this project whose worker and batch are run (default: this one)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds the drain may take at most")
    ap.add_argument("--repeats", type=int, default=3, help="drains and batch runs; the best of each counts")
    ap.add_argument("--max-in-flight", type=int, default=None,
                    help="the worker's --max-in-flight (default: its own default, 64): the drain's pipeline depth")


def _env(code: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DERENDER_")}
    env["PYTHONPATH"] = str(code)
    return env


async def _prefill(bootstrap: str, topic: str, bodies: list[bytes], n: int) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False, linger_ms=5)
    await producer.start()
    try:
        for i in range(n):
            await producer.send(topic, bodies[i % len(bodies)], key=f"r-{i}".encode())
        await producer.flush()
    finally:
        await producer.stop()


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (``/proc/PID/stat``); 0.0 when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def _descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (``/proc/PID/task/*/children``: the worker's fork server
    and, under it, the pool processes)."""
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/children") as f:
                    kids = [int(c) for c in f.read().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


def _cpu_sample(worker_pid: int, broker_pid: int | None) -> dict[str, float]:
    """CPU seconds so far of the worker's main process, its pool (every descendant), the broker
    (when started here) and this process (the reader)."""
    return {"main": _cpu_s(worker_pid), "pool": sum(_cpu_s(p) for p in _descendants(worker_pid)),
            "broker": _cpu_s(broker_pid) if broker_pid else 0.0, "reader": time.process_time()}


_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


async def _read_replies(bootstrap: str, topic: str, n: int, timeout: float, worker: subprocess.Popen,
                        broker_pid: int | None = None) -> tuple[list[int], dict[str, float]]:
    """The Kafka timestamps (ms) of the first reply of each of ``n`` keys, and the CPU seconds
    each process spent from the first reply read to the last (``_cpu_sample``; zeros off Linux).
    Raises ``RuntimeError`` when the worker exits or ``timeout`` seconds pass first."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False, metadata_max_age_ms=1000, fetch_max_wait_ms=100)
    await consumer.start()
    first: dict[bytes, int] = {}
    on_linux = os.path.exists(f"/proc/{worker.pid}/stat")
    cpu0: dict[str, float] | None = None
    n0 = 0
    try:
        deadline = time.monotonic() + timeout
        while len(first) < n:
            if worker.poll() is not None:
                raise RuntimeError(f"the worker exited with status {worker.returncode} after {len(first)} replies")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(first)}/{n} replies within {timeout:.0f}s")
            for recs in (await consumer.getmany(timeout_ms=200, max_records=5000)).values():
                for r in recs:
                    first.setdefault(r.key, r.timestamp)
            if cpu0 is None and first and on_linux:
                cpu0, n0 = _cpu_sample(worker.pid, broker_pid), len(first)
        cpu1 = _cpu_sample(worker.pid, broker_pid) if cpu0 is not None else None
    finally:
        await consumer.stop()
    used = {k: cpu1[k] - cpu0[k] for k in cpu1} if cpu0 is not None and cpu1 is not None else {}
    used["records"] = float(n - n0)
    return sorted(first.values()), used


def _batch(code: Path, src: Path, out: Path, workers: int) -> float:
    """records/s of ``derender-worker batch`` (its summary: derender time, without start-up)."""
    proc = subprocess.run([sys.executable, "-m", "worker.cli", "batch", str(src), "-o", str(out), "--config",
                           str(code / "worker" / "demo_data" / "models.json"), "--no-progress",
                           "--workers", str(workers)],
                          cwd=code, env=_env(code), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    m = re.search(r"batch: (\d+) records, (\d+) ok.*?; ([\d.]+) s \(([\d.]+) records/s\)", proc.stderr)
    if proc.returncode != 0 or not m:
        raise RuntimeError(f"batch exited {proc.returncode}: {proc.stderr[-1500:]}")
    return float(m.group(4))


def _drain(code: Path, bodies: list[bytes], args: argparse.Namespace, tmp: Path) -> tuple[float, float, dict]:
    """One drain: a fresh pre-filled topic and worker -> (records/s, seconds first to last reply,
    CPU microseconds per record of each process: ``_cpu_per_record``)."""
    u = uuid.uuid4().hex[:8]
    topics = {"in": f"drain-in-{u}", "reply": f"drain-rep-{u}", "dlq": f"drain-dlq-{u}"}
    broker = None if args.bootstrap_servers else TansuBroker()
    if broker is not None:
        broker.__enter__()
    worker = None
    log_path = tmp / f"worker-{u}.log"
    try:
        bootstrap = args.bootstrap_servers or broker.bootstrap_servers
        asyncio.run(ensure_topics(bootstrap, {topics["in"]: args.partitions, topics["reply"]: 1, topics["dlq"]: 1}))
        asyncio.run(_prefill(bootstrap, topics["in"], bodies, args.requests))
        with open(log_path, "wb") as logf:
            worker = subprocess.Popen(
                [sys.executable, "-m", "worker.cli", "run", "--config",
                 str(code / "worker" / "demo_data" / "models.json"), "--bootstrap-servers", bootstrap,
                 "--input-topic", topics["in"], "--reply-topic", topics["reply"],
                 "--dead-letter-topic", topics["dlq"], "--group-id", f"drain-{u}",
                 "--num-threads", str(args.num_threads), "--stream-state", "memory",
                 "--commit-interval-ms", "200", "--log-level", "WARNING"]
                + (["--max-in-flight", str(args.max_in_flight)] if args.max_in_flight else []),
                cwd=code, env=_env(code), stdout=logf, stderr=subprocess.STDOUT)
        try:
            stamps, cpu = asyncio.run(_read_replies(bootstrap, topics["reply"], args.requests, args.timeout, worker,
                                                    broker.proc.pid if broker is not None and broker.proc else None))
        except RuntimeError as e:
            raise RuntimeError(f"{e}; worker log: {log_path.read_text(errors='replace')[-800:]}") from e
    finally:
        if worker is not None:
            worker.terminate()
            try:
                worker.wait(timeout=40)
            except subprocess.TimeoutExpired:
                worker.kill()
        if broker is not None:
            broker.__exit__(None, None, None)
    span_s = (stamps[-1] - stamps[0]) / 1000
    return ((len(stamps) - 1) / span_s if span_s > 0 else float("nan")), span_s, _cpu_per_record(cpu)


def _cpu_per_record(cpu: dict[str, float]) -> dict[str, float]:
    """CPU seconds per process over ``records`` replies -> microseconds per record (empty when
    not measured)."""
    n = cpu.pop("records", 0.0)
    if not cpu or n <= 0:
        return {}
    return {k: round(v / n * 1e6, 1) for k, v in cpu.items()}


def run_drain_bench(args: argparse.Namespace) -> dict:
    """The measurement of the module docstring -> figures (``drain_per_s``, ``batch_per_s``:
    best of ``--repeats``; ``ratio``; every run's rates). Raises ``RuntimeError`` when the worker
    or the batch fails."""
    code = Path(args.code).resolve() if args.code else REPO
    service = DerenderService(load_config_file(DEMO / "models.json"))
    bodies = build_bodies(service, "qwen3", args.tokens, args.distinct)
    repeats = max(1, args.repeats)
    with tempfile.TemporaryDirectory(prefix="derender-drain-") as tmp:
        drains = [_drain(code, bodies, args, Path(tmp)) for _ in range(repeats)]
        src = Path(tmp) / "bodies.jsonl"
        with open(src, "wb") as f:
            for i in range(args.requests):
                f.write(bodies[i % len(bodies)] + b"\n")
        batches = [_batch(code, src, Path(tmp) / "out.jsonl", args.num_threads) for _ in range(repeats)]
    drain, span_s, _ = max(drains, key=lambda d: d[0])
    batch = max(batches)
    return {"code": str(code), "requests": args.requests, "partitions": args.partitions,
            "num_threads": args.num_threads, "max_in_flight": args.max_in_flight, "tokens": args.tokens, "repeats": repeats, "drain_s": round(span_s, 2),
            "drain_per_s": drain, "batch_per_s": batch, "ratio": drain / batch, "cores": os.cpu_count(),
            "drain_runs": [round(d) for d, _, _ in drains], "batch_runs": [round(b) for b in batches],
            "cpu_us_per_record": [c for _, _, c in drains]}


def run_suite(args: argparse.Namespace) -> int:
    """``bench drain``: measure and print; returns 0, or 2 (one line) when the broker, the worker
    or the batch run fails."""
    try:
        r = run_drain_bench(args)
    except (ValueError, OSError, RuntimeError) as e:
        return startup_error("derender-worker bench drain", str(e))
    print(f"derender bench drain: {r['requests']} records of {r['tokens']} output tokens pre-filled over "
          f"{r['partitions']} partitions; 1 worker x {r['num_threads']} pool process(es) vs batch "
          f"--workers {r['num_threads']}; --max-in-flight {r['max_in_flight'] or 'default'}; code {r['code']}; "
          f"{r['cores']} cores shared with the broker and this client")
    print(f"  kafka drain: {r['drain_per_s']:.0f} records/s ({r['drain_s']} s first to last reply; best of "
          f"{r['repeats']}: {', '.join(map(str, r['drain_runs']))})")
    print(f"  batch:       {r['batch_per_s']:.0f} records/s (derender time, without start-up; best of "
          f"{r['repeats']}: {', '.join(map(str, r['batch_runs']))})")
    print(f"  ratio drain / batch: {r['ratio']:.2f}")
    for i, c in enumerate(r["cpu_us_per_record"]):
        if c:
            total = sum(c.values())
            print(f"  drain {i + 1} CPU us/record: worker main {c['main']}, pool {c['pool']}, broker {c['broker']}, "
                  f"reader {c['reader']}; pool share {c['pool'] / total:.2f}" if total > 0 else "")
    return 0
