"""The chaos scenarios. Each one starts its own embedded broker, its own Redis server(s) and
``derender-worker run`` subprocesses, injects one kind of fault, checks the invariants
(``harness.Ledger``) and returns its figures (printed by the caller, never asserted as speeds).

Sizes: ``SIZES["reduced"]`` (the pytest run, ``tests/test_chaos.py``) and ``SIZES["full"]``
(``python -m tests.chaos --full``, the figures in docs/delivery.md)."""
from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import threading
import time
import urllib.error
import urllib.request
import uuid
from typing import Any

from tests.chaos.fuzz import make_bad
from tests.chaos.harness import (
    CORR,
    CREATED_S,
    END,
    MODELS_JSON,
    SEQ,
    STATUS,
    Broker,
    Collector,
    Ledger,
    RedisServer,
    Single,
    Stream,
    WorkerProc,
    big_call_streams,
    corpus_bodies,
    create_topics,
    free_port,
    h,
    make_singles,
    make_streams,
    messages_streams,
    produce,
    responses_streams,
    rss_kb,
    service,
    session_pids,
    stream_records,
)
from tests.chaos.load import mixed_load

SIZES: dict[str, dict[str, int]] = {
    "reduced": dict(batch=600, streams=16, outage_singles=200, fuzz_bad=1500, fuzz_valid=500, fuzz_huge=2,
                    overload=4000, abandoned=600, partitions=4, stall_streams=120, backlog=3000, too_big=6),
    "full": dict(batch=10_000, streams=60, outage_singles=2000, fuzz_bad=30_000, fuzz_valid=10_000, fuzz_huge=10,
                 overload=100_000, abandoned=6000, partitions=8, stall_streams=240, backlog=20_000, too_big=40),
}
GAP_S = 3.0  # --stream-gap-timeout of the chaos workers
STATE_DEADLINE_S = 60.0  # --state-store-outage-deadline
BROKER_DEADLINE_S = 8.0  # --broker-outage-deadline
IDLE_S = {"reduced": 5.0, "full": 30.0}  # --stream-idle-timeout of the abandoned-streams scenario
# (longer than the backlog of a full-size burst: a stream's next chunk may wait that long in Kafka)


class Rig:
    """One scenario's world: broker, Redis (``persist``: none/aof/rdb, or None for memory state),
    topics, a collector over the reply, alternative reply and dead-letter topics, workers, and a
    sampler of the workers' RSS."""

    def __init__(self, name: str, *, persist: str | None = "none", partitions: int = 4):
        self.name = name
        self.t0 = time.monotonic()
        u = uuid.uuid4().hex[:6]
        self.inp, self.rep, self.dlq, self.alt, self.group = (f"{name}-in-{u}", f"{name}-rep-{u}",
                                                              f"{name}-dlq-{u}", f"{name}-alt-{u}", f"{name}-g-{u}")
        self.broker = Broker(port=free_port()).start()
        self.bs = self.broker.bootstrap_servers
        self.redis = RedisServer(persist).start() if persist is not None else None
        self.partitions = partitions
        asyncio.run(create_topics(self.bs, {self.inp: partitions, self.rep: 2, self.dlq: 1, self.alt: 1}))
        self.collector = Collector(self.bs, [self.rep, self.dlq, self.alt])
        self.workers: list[WorkerProc] = []
        self.phases: dict[str, float] = {}
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.5):
            for w in list(self.workers):
                if w.alive:
                    w.rss_kb()

    def args(self, extra: list[str] | None = None, *, metrics_port: int | None = None) -> list[str]:
        a = ["--config", str(MODELS_JSON), "--bootstrap-servers", self.bs, "--input-topic", self.inp,
             "--reply-topic", self.rep, "--dead-letter-topic", self.dlq, "--group-id", self.group,
             "--executor", "process", "--num-threads", "1", "--commit-interval-ms", "100",
             "--session-timeout-ms", "2000", "--heartbeat-interval-ms", "300", "--max-in-flight", "64",
             "--stream-gap-timeout", str(GAP_S), "--max-request-size", str(16 * 1024 * 1024),
             "--state-store-outage-deadline", str(STATE_DEADLINE_S),
             "--broker-outage-deadline", str(BROKER_DEADLINE_S), "--drain-timeout", "10"]
        if self.redis is not None:
            a += ["--redis-url", self.redis.url, "--redis-state-ttl", "300"]
        else:
            a += ["--stream-state", "memory"]
        if metrics_port is not None:
            a += ["--metrics-port", str(metrics_port)]
        return a + list(extra or [])

    def worker(self, extra: list[str] | None = None, **kw) -> WorkerProc:
        w = WorkerProc(f"{self.name}-w{len(self.workers)}", self.args(extra, **kw))
        self.workers.append(w)
        return w

    def wait_ready(self, ws: list[WorkerProc], timeout: float = 120.0) -> None:
        """Until every worker has an assignment and, when partitions allow, owns partitions."""
        deadline = time.monotonic() + timeout
        while True:
            for w in ws:
                assert w.alive, f"{w.name} exited ({w.p.returncode}) before it was ready:\n{w.text()}"
            if all(w.assigned() for w in ws) and (len(ws) > self.partitions or all(w.owns_partitions() for w in ws)):
                self.phase("ready")
                return
            assert time.monotonic() < deadline, "workers not ready:\n" + "\n".join(w.text(10) for w in ws)
            time.sleep(0.2)

    def phase(self, name: str) -> None:
        """Record the seconds since the rig started at this point (figures: ``t_<name>``)."""
        self.phases[f"t_{name}"] = round(time.monotonic() - self.t0, 1)

    def wait_answers(self, n: int, timeout: float) -> bool:
        """Until ``n`` records were collected, ``timeout`` seconds passed, or no worker is alive."""
        return self.collector.wait(lambda: self.collector.count() >= n or not any(w.alive for w in self.workers),
                                   timeout)

    def unexpected_exits(self) -> list[str]:
        return [f"{w.name}: exit {w.p.returncode}\n{w.text(15)}" for w in self.workers if not w.killed and not w.alive]

    def figures(self, **kw: Any) -> dict[str, Any]:
        peak = max((w.peak_kb for w in self.workers), default=0)
        return {"scenario": self.name, "wall_s": round(time.monotonic() - self.t0, 1),
                "workers": len(self.workers), "peak_rss_mb": round(peak / 1024, 1), **self.phases, **kw}

    def close(self) -> dict[str, int | None]:
        """Stop everything; returns each worker's exit status (SIGTERM drain = 0)."""
        self._stop.set()
        codes = {w.name: w.stop() for w in self.workers if not w.killed}
        for w in self.workers:  # killed ones: their sessions too (orphans are checked before)
            w.stop(timeout=0)
        self.collector.close()
        if self.redis is not None:
            self.redis.close()
        self.broker.stop()
        return codes


def _finish(rig: Rig, ledger: Ledger, expected: int, timeout: float, **figs) -> dict[str, Any]:
    t = time.monotonic()

    def passes() -> bool:
        try:
            ledger.check([r for _, r in list(rig.collector.records)], rig.dlq)
            return True
        except AssertionError:
            return not any(w.alive for w in rig.workers)

    # A count alone is not enough: duplicates after a kill reach ``expected`` before the last
    # chunks are answered (CI: kill9-pieces, the final chunk of two streams). Lost streams end
    # with one 409 for their held chunks: fewer replies than chunks, so no count for them.
    if not ledger.lost_ok:
        rig.wait_answers(expected, timeout)
    rig.collector.wait(passes, max(0.0, timeout - (time.monotonic() - t)))
    rig.collector.wait(lambda: False, 1.0)  # settle: late duplicates
    drain_s = time.monotonic() - t
    exits = rig.unexpected_exits()
    counts = ledger.check([r for _, r in rig.collector.records], rig.dlq)
    assert not exits, "worker(s) exited:\n" + "\n".join(exits)
    assert rig.collector.error is None, f"collector failed: {rig.collector.error!r}"
    return rig.figures(**counts, drain_s=round(drain_s, 1), **figs)


def _orphans_after_kill(w: WorkerProc, wait_s: float = 8.0) -> int:
    """Processes of a kill -9'd worker's session still alive after ``wait_s`` seconds."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and session_pids(w.sid):
        time.sleep(0.2)
    return len(session_pids(w.sid))


# -------------------------------------------------------------------------------- scenarios ----
def kill9_batch(size: str = "reduced") -> dict[str, Any]:
    """Two workers; kill -9 of one worker's main process at 40% of the non-streaming records; a
    replacement joins. Every record answered correctly, duplicates identical, no orphan left."""
    sz = SIZES[size]
    rig = Rig("kill9-batch", partitions=sz["partitions"])
    try:
        a, b = rig.worker(), rig.worker()
        rig.wait_ready([a, b])
        ledger = Ledger(singles=make_singles(sz["batch"], "kb"))
        recs = ledger.single_records()
        killed = {}

        def at(i: int) -> None:
            if i >= len(recs) * 0.4 and not killed:
                killed["at"] = i
                a.kill9()

        rig.phase("produce")
        asyncio.run(produce(rig.bs, rig.inp, recs, pace=0.02, on_progress=at))
        rig.phase("produced")
        if not killed:
            a.kill9()
        orphans = _orphans_after_kill(a)
        c = rig.worker()
        rig.wait_ready([b, c])
        figs = _finish(rig, ledger, len(recs), 180, orphans=orphans)
        assert orphans == 0, f"{orphans} process(es) of the kill -9'd worker still alive: {figs}"
        return figs
    finally:
        rig.close()


def kill9_stream(size: str = "reduced") -> dict[str, Any]:
    """Streams over two workers, chat / completion, Responses API (issue 14) and Anthropic Messages
    (issue 26) ones; kill -9 of one mid-stream (after 40% of the chunks): every stream completes on
    the survivor with byte-identical duplicates only."""
    sz = SIZES[size]
    rig = Rig("kill9-stream", partitions=sz["partitions"])
    try:
        a, b = rig.worker(), rig.worker()
        rig.wait_ready([a, b])
        ledger = Ledger(streams=make_streams(sz["streams"], "ks")
                        + make_streams(max(4, sz["streams"] // 2), "kr", source=responses_streams())
                        + make_streams(max(4, sz["streams"] // 2), "km", source=messages_streams()))
        recs = [r for rnd in stream_records(ledger.streams) for r in rnd]
        total = len(recs)

        def at(i: int) -> None:
            if i >= total * 0.4 and a.alive:
                a.kill9()

        asyncio.run(produce(rig.bs, rig.inp, recs, pace=0.05, on_progress=at))
        figs = _finish(rig, ledger, total, 180, chunks=total)
        return {**figs, "orphans": _orphans_after_kill(a, 0)}
    finally:
        rig.close()


def kill9_pieces(size: str = "reduced") -> dict[str, Any]:
    """Streams whose tool call grows to several KB (a hermes JSON and a Qwen3-Coder XML call:
    their bodies spill to the streams' append-only pieces, ``{key}:pieces``) over two workers;
    kill -9 of one mid-call (after 40% of the chunks). The checkpoint and a chunk's piece bytes
    are one fenced write (one EVALSHA: ``worker.state.redis_store``), so no kill lands between
    the append and the checkpoint; a redelivered chunk rewrites its bytes at the offset the
    stored state records. The survivor reads the killed worker's pieces from Redis to close the
    calls: every stream completes with byte-identical replies (a piece appended twice or lost
    would change the call's arguments), duplicates identical."""
    sz = SIZES[size]
    rig = Rig("kill9-pieces", partitions=sz["partitions"])
    try:
        a, b = rig.worker(), rig.worker()
        rig.wait_ready([a, b])
        ledger = Ledger(streams=make_streams(max(4, sz["streams"] // 2), "kp", source=big_call_streams()))
        recs = [r for rnd in stream_records(ledger.streams) for r in rnd]
        total = len(recs)
        killed = {}

        def at(i: int) -> None:
            if i >= total * 0.4 and a.alive:
                killed["at"] = i
                a.kill9()

        asyncio.run(produce(rig.bs, rig.inp, recs, pace=0.02, on_progress=at))
        figs = _finish(rig, ledger, total, 240, chunks=total, killed_at=killed.get("at"))
        return {**figs, "orphans": _orphans_after_kill(a, 0)}
    finally:
        rig.close()


def redis_outage(size: str = "reduced", persist: str = "aof", outage_s: float = 6.0,
                 lose_worker: bool = False, flush: bool = False, name: str = "redis-outage") -> dict[str, Any]:
    """Streams in flight, then Redis goes away for ``outage_s`` seconds (kill -9; ``persist``
    aof/rdb: restarted with its data, ``rdb`` stopped gracefully so it snapshots; none: restarted
    empty) or, with ``flush``, loses its data without going away. Non-streaming records are
    published during the outage and must be answered during it; no worker exits; streams complete
    (with persistence) or end with a 409 saying the state was lost (without, when their owner
    changed: ``lose_worker`` kill -9s one worker meanwhile)."""
    sz = SIZES[size]
    rig = Rig(name, persist=persist, partitions=sz["partitions"])
    try:
        ws = [rig.worker(), rig.worker()]
        rig.wait_ready(ws)
        ledger = Ledger(streams=make_streams(sz["streams"], "ro"), lost_ok=(persist == "none" or flush))
        rounds = stream_records(ledger.streams)
        total = sum(map(len, rounds))
        half = len(rounds) // 2
        asyncio.run(produce(rig.bs, rig.inp, [r for rnd in rounds[:max(1, half // 2)] for r in rnd]))
        rig.wait_answers(sum(map(len, rounds[:max(1, half // 2)])), 60)
        singles = make_singles(sz["outage_singles"], "out", small=True)  # (before: it takes seconds)
        ledger.singles = singles
        outage_recs = ledger.single_records() + [r for rnd in rounds[max(1, half // 2):half] for r in rnd]
        # the outage
        t_out = time.monotonic()
        if flush:
            rig.redis.flush()
        elif persist == "rdb":
            rig.redis.stop()
        else:
            rig.redis.kill()
        asyncio.run(produce(rig.bs, rig.inp, outage_recs))
        rig.phase("outage_produced")
        if lose_worker:
            ws[0].kill9()
            ws.append(rig.worker())
        ids = {s.id.encode() for s in singles}

        def answered_singles() -> list[float]:
            return [t - t_out for t, r in list(rig.collector.records) if dict(r.headers or ()).get("correlation-id") in ids]

        rig.collector.wait(lambda: len(answered_singles()) >= len(ids), max(0.0, outage_s - (time.monotonic() - t_out)))
        during = sum(1 for t in answered_singles() if t <= outage_s)
        time.sleep(max(0.0, outage_s - (time.monotonic() - t_out)))
        if not flush:
            rig.redis.start()
        t_back = time.monotonic() - t_out
        asyncio.run(produce(rig.bs, rig.inp, [r for rnd in rounds[half:] for r in rnd]))
        figs = _finish(rig, ledger, total + len(singles), 180, chunks=total, outage_s=round(t_back, 1),
                       singles_answered_during_outage=during)
        if not flush and not lose_worker:  # (a killed worker's partitions wait for the rebalance)
            assert during == len(singles), (f"only {during}/{len(singles)} non-streaming records answered "
                                            f"during the {outage_s:g}s Redis outage")
        return figs
    finally:
        rig.close()


def broker_restart(size: str = "reduced") -> dict[str, Any]:
    """The embedded broker restarts (loses every topic, record and offset) under load: each worker
    must notice, report it, and exit with one clear line within ``--broker-outage-deadline``
    (plus slack) instead of spinning; figures: seconds to exit, error lines logged meanwhile."""
    sz = SIZES[size]
    rig = Rig("broker-restart", partitions=sz["partitions"])
    try:
        ws = [rig.worker(), rig.worker()]
        rig.wait_ready(ws)
        ledger = Ledger(singles=make_singles(200, "br", small=True))
        asyncio.run(produce(rig.bs, rig.inp, ledger.single_records()))
        rig.wait_answers(200, 60)
        n_before = [len(w.lines) for w in ws]
        t = time.monotonic()
        rig.broker.restart()
        deadline = t + BROKER_DEADLINE_S + 40
        while time.monotonic() < deadline and any(w.alive for w in ws):
            time.sleep(0.2)
        took = time.monotonic() - t
        for w in ws:
            if not w.alive:
                w.drain_output()
        lines = [[x for _, x in w.lines[n0:]] for w, n0 in zip(ws, n_before, strict=True)]
        alive = [w.name for w in ws if w.alive]
        assert not alive, f"still running {took:.0f}s after the broker lost its topics: {alive}\n" + ws[0].text()
        for w, ls in zip(ws, lines, strict=True):
            assert w.p.returncode == 2, f"{w.name} exit {w.p.returncode}, expected 2\n{w.text()}"
            clear = [x for x in ls if " ERROR " in x and re.search(r"Kafka broker .*(gone|lost|unreachable).*giving up", x)]
            assert clear, f"{w.name}: no clear error line\n{w.text()}"
        errors = sum(1 for ls in lines for x in ls if " ERROR " in x or " WARNING " in x)
        for w in ws:
            w.killed = True  # exited on purpose
        return rig.figures(exit_s=round(took, 1), warn_error_lines=errors)
    finally:
        rig.close()


def fuzz(size: str = "reduced") -> dict[str, Any]:
    """Hostile records (``tests.chaos.fuzz``) interleaved with valid ones over two workers: every
    hostile record answered or dead-lettered, every valid one answered correctly, no worker exit."""
    sz = SIZES[size]
    rig = Rig("fuzz", partitions=sz["partitions"])
    try:
        ws = [rig.worker(), rig.worker()]
        rig.wait_ready(ws)
        bad = make_bad(sz["fuzz_bad"], huge=sz["fuzz_huge"], alt_topic=rig.alt)
        ledger = Ledger(singles=make_singles(sz["fuzz_valid"], "fz"))
        ledger.bad = [(b.id, b.key, b.rid, b.what, dict(b.headers).get(CORR)) for b in bad]
        good = ledger.single_records()
        recs, kinds = [], []
        gi = 0
        step = max(1, len(bad) // max(1, len(good)))
        for i, b in enumerate(bad):
            recs.append((b.key, b.value, b.headers))
            kinds.append(b.id)
            if i % step == 0 and gi < len(good):
                recs.append(good[gi])
                kinds.append(None)
                gi += 1
        recs += good[gi:]
        kinds += [None] * (len(good) - gi)
        t = time.monotonic()
        pos = asyncio.run(produce(rig.bs, rig.inp, recs))
        ledger.bad_pos = {k: p for k, p in zip(kinds, pos, strict=True) if k is not None}
        figs = _finish(rig, ledger, len(recs), 600, produce_s=round(time.monotonic() - t, 1),
                       huge_values=sz["fuzz_huge"])
        return figs
    finally:
        rig.close()


def overload(size: str = "reduced") -> dict[str, Any]:
    """``SIZES[size]["overload"]`` small valid records published at once to two workers: all
    answered correctly; figures: drain rate, peak RSS."""
    sz = SIZES[size]
    rig = Rig("overload", partitions=sz["partitions"])
    try:
        ws = [rig.worker(), rig.worker()]
        rig.wait_ready(ws)
        ledger = Ledger(singles=make_singles(sz["overload"], "ov", small=True))
        t = time.monotonic()
        asyncio.run(produce(rig.bs, rig.inp, ledger.single_records()))
        produced = time.monotonic() - t
        rig.wait_answers(sz["overload"], 900)
        took = time.monotonic() - t
        figs = _finish(rig, ledger, sz["overload"], 60, produce_s=round(produced, 1))
        return {**figs, "answered_in_s": round(took, 1), "msg_per_s": round(sz["overload"] / took)}
    finally:
        rig.close()


def _gauge(port: int, name: str = "derender_live_streams") -> float | None:
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=3).read().decode()
    except OSError:
        return None
    m = re.search(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else None


def _abandon_round(rig, port: int, w, n: int, tag: str, idle: float) -> int:
    """One round of ``n`` streams that send their first chunk(s) (two at most) and stop, to the
    worker ``w``: every chunk answered, then the idle timeout evicts them (the live-streams gauge
    on ``port`` back to 0). Returns the worker's RSS (KiB) a second after."""
    streams = make_streams(n, tag)
    for s in streams:
        s.chunks = s.chunks[:2 if len(s.chunks) > 2 else 1]
    recs = [r for rnd in stream_records(streams) for r in rnd]
    n0 = rig.collector.count()
    asyncio.run(produce(rig.bs, rig.inp, recs))
    rig.wait_answers(n0 + len(recs), 300)
    deadline = time.monotonic() + idle + 30
    while time.monotonic() < deadline and _gauge(port) != 0:
        time.sleep(0.5)
    time.sleep(1.0)
    return rss_kb(w.p.pid)


def abandoned_streams(size: str = "reduced", state: str = "redis") -> dict[str, Any]:
    """``SIZES[size]["abandoned"]`` streams that send their first chunk(s) and never finish, to one
    worker (``state``: redis or memory): every chunk answered; the live-streams gauge returns to 0
    after the idle timeout and the worker's RSS grows by at most 5 MB over a round (the smaller of
    two measured rounds: a leak grows every round, the allocator's steps once); a later chunk of
    an evicted stream continues from Redis, or (memory mode) gets the 409 "lost or expired".

    Warm-up: 20 complete streams, then one round of as many abandoned streams, evicted, before
    the start RSS is taken. The first burst leaves a one-time step (figure ``rss_first_round_mb``,
    full size +4.8 to +6.3 MB): CPython's small-object allocator keeps each 1 MiB arena that still
    holds one long-lived object (asyncio, aiokafka, interpreter caches) allocated during the burst
    (4-5 such arenas, holding ~40 KB of live objects), and the next bursts reuse those arenas.
    Measured at full size with redis over three rounds: +4.8, +0.7, +0.4 MB; two rounds: +5.6,
    +0.3 MB (memory state: +6.3, +0.0 MB). The assertion is on the round after the warm-up one."""
    sz = SIZES[size]
    idle = IDLE_S[size]
    rig = Rig(f"abandoned-{state}", persist="none" if state == "redis" else None, partitions=sz["partitions"])
    try:
        port = free_port()
        w = rig.worker(["--stream-idle-timeout", str(idle)], metrics_port=port)
        rig.wait_ready([w])
        warm = make_streams(20, "warm")  # warm-up: allocations that stay (caches, pool, imports)
        asyncio.run(produce(rig.bs, rig.inp, [r for rnd in stream_records(warm) for r in rnd]))
        rig.wait_answers(sum(len(s.chunks) for s in warm), 60)
        time.sleep(idle + 3)
        rss_warm = rss_kb(w.p.pid)
        rss0 = _abandon_round(rig, port, w, sz["abandoned"], "ab0", idle)  # the warm-up round (docstring)
        streams = make_streams(sz["abandoned"], "ab")
        later = []  # (stream id, chunk 2 record, the core's reply to it) of some long streams
        for s in streams:  # the first two chunks only (or one when the stream ends at chunk 1)
            keep = 2 if len(s.chunks) > 2 else 1
            if keep == 2 and len(later) < 20:
                later.append((s.id, (s.id.encode(), s.chunks[2], [(SEQ, b"2")]), s.want[2]))
            s.chunks, s.want, s.status = s.chunks[:keep], s.want[:keep], s.status[:keep]
        ledger = Ledger(streams=streams)
        recs = [r for rnd in stream_records(streams) for r in rnd]
        already = rig.collector.count()
        asyncio.run(produce(rig.bs, rig.inp, recs))
        rig.wait_answers(already + len(recs), 300)
        live_peak = _gauge(port)
        rss_peak = rss_kb(w.p.pid)
        deadline = time.monotonic() + idle + 30
        while time.monotonic() < deadline and _gauge(port) != 0:
            time.sleep(0.5)
        live_end = _gauge(port)
        time.sleep(1.0)
        rss1 = rss_kb(w.p.pid)
        figs = _finish(rig, ledger, already + len(recs), 30)
        # a chunk after eviction: continues from Redis (its TTL is longer), or one clear 409 (memory:
        # the in-process store's entry went with the eviction, MemoryStateStore.forget)
        n0 = rig.collector.count()
        asyncio.run(produce(rig.bs, rig.inp, [r for _, r, _ in later]))
        rig.wait_answers(n0 + len(later), 60)
        got = {h(r).get("correlation-id"): r for _, r in rig.collector.records[n0:]}
        for sid, _, want in later:
            r = got.get(sid.encode())
            assert r is not None, f"no reply to chunk 2 of evicted stream {sid}"
            if state == "redis":
                assert r.value == want, f"{sid}: chunk 2 after eviction differs: {r.value[:200]!r}"
            else:
                assert h(r).get("derender-status") == b"409" and re.search(rb"lost or expired", r.value), r.value[:300]
        figs.update(live_streams_peak=live_peak, live_streams_end=live_end, rss_start_mb=round(rss0 / 1024, 1),
                    rss_first_round_mb=round((rss0 - rss_warm) / 1024, 1),
                    rss_peak_mb=round(rss_peak / 1024, 1), rss_end_mb=round(rss1 / 1024, 1),
                    after_eviction="continued from Redis" if state == "redis" else "409 state lost or expired")
        assert live_end == 0, f"live-streams gauge {live_end} after the idle timeout: {figs}"
        # A leak grows the RSS on EVERY round; the allocator's one-time steps (docstring) land on
        # one round only: the figure is the smaller growth of two measured rounds.
        rss2a = rss_kb(w.p.pid)
        rss2 = _abandon_round(rig, port, w, sz["abandoned"], "ab2", idle)
        growth = [round((rss1 - rss0) / 1024, 1), round((rss2 - rss2a) / 1024, 1)]
        figs.update(rss_growth_per_round_mb=growth)
        assert _gauge(port) == 0, f"live-streams gauge after the second round's idle timeout: {figs}"
        assert min(growth) <= 5, f"RSS grew by {growth} MB over two rounds of abandoned streams: {figs}"
        return figs
    finally:
        rig.close()


def redis_stall(size: str = "reduced", how: str = "pause", stall_s: float = 8.0) -> dict[str, Any]:
    """Mixed load (40 live streams over 4 partitions, non-streaming records at a steady rate, two
    workers, the default ``--max-in-flight``), then Redis stalls for ``stall_s`` seconds (``how``:
    ``pause`` = ``CLIENT PAUSE``, ``kill`` = kill -9 and restart with its AOF): in every second of
    the stall the non-streaming records answered are >= 50% of the pre-stall rate (the
    per-second timeline is a figure); afterwards every record is answered correctly (streams
    complete: Redis kept its data), no worker exits."""
    sz = SIZES[size]
    rig = Rig(f"redis-stall-{how}", persist="aof", partitions=4)
    try:
        ws = [rig.worker(), rig.worker()]
        rig.wait_ready(ws)
        pre_s, post_s = 6.0, 6.0
        seconds = pre_s + stall_s + post_s
        rate = 30.0 if size == "reduced" else 60.0
        streams = [st for st in make_streams(sz["stall_streams"], "st") if len(st.chunks) >= 4]
        singles = make_singles(int(rate * seconds) + 1, "ss", small=True)
        marks: dict[str, float] = {}
        load = threading.Thread(target=lambda: asyncio.run(mixed_load(
            rig.bs, rig.inp, streams, singles, live=40, seconds=seconds, singles_per_s=rate, chunk_every_s=0.5,
            marks=marks)), daemon=True)
        load.start()
        time.sleep(pre_s)
        t_stall = time.time()  # (wall clock: compared with the replies' Kafka timestamps)
        rig.phase("stall")
        if how == "pause":
            rig.redis.client().execute_command("CLIENT", "PAUSE", int(stall_s * 1000))
            time.sleep(stall_s)
        else:
            rig.redis.kill()
            time.sleep(stall_s)
            rig.redis.start()
        rig.phase("stall_end")
        load.join(seconds + 60)
        assert not load.is_alive(), "the load generator did not finish"
        sent = singles[:int(marks["sent_singles"])]
        published = []  # a stream cut by the end of the load: only its published chunks are expected
        for st in streams:
            n = marks["chunks"].get(st.id, 0)
            if n:
                published.append(Stream(st.id, st.chunks[:n], st.want[:n], st.status[:n]))
        ledger = Ledger(singles=sent, streams=published)
        expected = len(sent) + sum(len(st.chunks) for st in published)
        figs = _finish(rig, ledger, expected, 180, chunks=sum(len(st.chunks) for st in published))
        ids = {s.id.encode() for s in sent}
        # when the worker produced each reply (its Kafka timestamp, set by the worker's producer), not
        # when the collector read it: a collector starved of CPU for a moment must not move replies
        # from one second to the next
        times = [r.timestamp / 1000 - t_stall for _, r in list(rig.collector.records) if h(r).get(CORR) in ids]
        pre = sum(1 for t in times if -(pre_s - 2.0) <= t < 0) / (pre_s - 2.0)  # (after a 2 s warm-up)
        timeline = [sum(1 for t in times if k <= t < k + 1) for k in range(int(stall_s))]
        figs.update(how=how, stall_s=stall_s, singles_per_s_offered=rate, singles_per_s_before=round(pre, 1),
                    singles_per_s_during=timeline)
        low = [(k, n) for k, n in enumerate(timeline) if n < 0.5 * pre]
        assert not low, (f"non-streaming replies fell below 50% of the pre-stall rate ({pre:.1f}/s) in "
                         f"second(s) {low} of the {stall_s:g}s Redis {how}: {figs}")
        return figs
    finally:
        rig.close()


def _livez(port: int) -> tuple[int, str]:
    """``(status, body)`` of a worker's ``/livez`` (0 when it does not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/livez", timeout=1) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return 0, ""


def broker_restart_backlog(size: str = "reduced", then: str = "deadline") -> dict[str, Any]:
    """A backlog in flight (non-streaming records and streams, two workers), then the embedded
    broker restarts empty (every topic, record and offset lost), or (``then`` = ``frozen``) stops
    answering (SIGSTOP: every client call hangs). ``then``: ``deadline``: each
    worker must give up and exit 2 within ``--broker-outage-deadline`` + ``--drain-timeout``
    (+ the watchdog's check period) whatever the state of its commits, ``/livez`` answering 503
    from the give-up on; ``sigterm``: SIGTERM 2 s after the restart must end each worker within
    ``--drain-timeout`` + 5 s; ``frozen``: SIGTERM 2 s after the freeze must too (the drain, the
    final commit and closing the clients all wait on a broker that never answers)."""
    sz = SIZES[size]
    drain_s = 10.0  # the Rig's --drain-timeout
    rig = Rig(f"broker-{then}" if then == "frozen" else f"broker-backlog-{then}", partitions=sz["partitions"])
    try:
        ports = [free_port(), free_port()]
        ws = [rig.worker(metrics_port=p) for p in ports]
        rig.wait_ready(ws)
        ledger = Ledger(singles=make_singles(sz["backlog"], "bb"),
                        streams=make_streams(sz["streams"], "bs"))
        recs = ledger.single_records() + [r for rnd in stream_records(ledger.streams) for r in rnd]
        asyncio.run(produce(rig.bs, rig.inp, recs))
        rig.wait_answers(len(recs) // 10, 120)  # in flight: a tenth answered
        answered_before = rig.collector.count()
        t = time.monotonic()
        if then == "frozen":
            os.kill(rig.broker.proc.pid, signal.SIGSTOP)
        else:
            rig.broker.restart()
        rig.phase("broker_restarted")
        live: list[list[tuple[float, int, str]]] = [[] for _ in ws]  # (s since restart, status, body)
        if then in ("sigterm", "frozen"):
            time.sleep(2.0)
            t_sig = time.monotonic()
            for w in ws:
                w.p.send_signal(signal.SIGTERM)
            limit, start = drain_s + 5.0, t_sig
        else:
            limit, start = BROKER_DEADLINE_S + drain_s + 2.0, t  # (+ the watchdog's 0.8 s check period)
        while time.monotonic() < start + limit + 30 and any(w.alive for w in ws):
            for i, (w, port) in enumerate(zip(ws, ports, strict=True)):
                if w.alive:
                    code, body = _livez(port)
                    if code:
                        live[i].append((time.monotonic() - t, code, body.strip()))
            time.sleep(0.2)
        took = [round((w.exit_t or time.monotonic()) - start, 1) for w in ws]
        if then == "frozen":
            os.kill(rig.broker.proc.pid, signal.SIGCONT)
        for w in ws:
            w.drain_output()
            w.killed = True  # exited on purpose (or killed by close() below: then the assertion fails)
        alive = [w.name for w in ws if w.alive]
        assert not alive, f"still running {limit + 30:.0f}s after the {then}: {alive}\n" + ws[0].text()
        figs = rig.figures(then=then, exit_s=took, exit_status=[w.p.returncode for w in ws], limit_s=limit,
                           answered_before_restart=answered_before)
        for w, secs in zip(ws, took, strict=True):
            assert secs <= limit, f"{w.name} took {secs}s to exit after the {then} (limit {limit}s): {figs}\n{w.text()}"
        if then == "deadline":
            for i, w in enumerate(ws):
                assert w.p.returncode == 2, f"{w.name} exit {w.p.returncode}, expected 2: {figs}\n{w.text()}"
                gave = [x for _, x in w.lines if re.search(r"Kafka broker .*giving up", x)]
                assert gave, f"{w.name}: no give-up line\n{w.text()}"
                t_gave = next(tt for tt, x in w.lines if re.search(r"Kafka broker .*giving up", x)) - t
                after = [(round(s, 1), c) for s, c, _ in live[i] if s > t_gave + 0.5]
                assert all(c == 503 for _, c in after), f"{w.name}: /livez after giving up: {after}"
                figs[f"livez_503_after_give_up_{i}"] = len(after)
                figs[f"livez_{i}"] = [(round(s, 1), c) for s, c, _ in live[i]][-12:] + [round(t_gave, 1)]
        else:
            for w in ws:
                assert w.p.returncode is not None, w.name
        return figs
    finally:
        rig.close()


#: ``--max-request-size`` of the reply-too-big scenario: above every corpus reply (<= ~10 KB)
TOO_BIG_LIMIT = 16 * 1024
_TOO_BIG = rb"reply of (\d+) bytes exceeds the limit of 16384 bytes \(--max-request-size\)"
_BIG_WORDS = 3500  # " word" tokens: a reply of ~18 KB, within the models' max_model_len (4096)


def _too_big_records(n_singles: int, n_streams: int, tag: str) -> tuple[list[Single], list[tuple[Stream, int]]]:
    """Valid records whose replies exceed ``TOO_BIG_LIMIT``: ``n_singles`` chat records of
    ``_BIG_WORDS`` output tokens (``Single.want``: the core's too-big 200 body), and
    ``n_streams`` corpus streams whose chunk 2 carries ``_BIG_WORDS`` tokens -> (stream, 2)."""
    svc = service()
    word = svc.runtime("qwen3").tokenizer.encode(" word")
    base = next(b for b in corpus_bodies()[0] if b.get("model") == "qwen3" and "generate_response" in b
                and "logprobs" not in b.get("chat_request", {}))
    singles = []
    for i in range(n_singles):
        sid = f"{tag}-s{i}-{uuid.uuid4().hex[:6]}"
        gr = dict(base["generate_response"], request_id=sid,
                  choices=[{"index": 0, "token_ids": word * _BIG_WORDS, "finish_reason": "length"}])
        v = json.dumps(dict(base, generate_response=gr)).encode()
        r = svc.derender(v, created=CREATED_S)
        assert r.status == 200 and len(r.body) > TOO_BIG_LIMIT + 1024, (r.status, len(r.body))
        singles.append(Single(sid, v, r.body, 200))
    streams: list[tuple[Stream, int]] = []
    k = 2
    for st in make_streams(4 * n_streams, f"{tag}-t"):  # the corpus streams whose chunk k can be too big
        if len(streams) == n_streams:
            break
        if len(st.chunks) <= k + 1 or any(x != 200 for x in st.status[:k + 1]):
            continue
        b = json.loads(st.chunks[k])
        ch = dict(b["generate_chunk"]["choices"][0], token_ids=word * _BIG_WORDS)
        ch.pop("logprobs", None)
        b["generate_chunk"] = dict(b["generate_chunk"], choices=[ch])
        st.chunks[k] = json.dumps(b).encode()
        state = None
        for seq in range(k + 1):
            res, state = svc.derender_stream(st.chunks[seq], state, seq=seq, created=CREATED_S)
        if res.status != 200 or len(res.body) <= TOO_BIG_LIMIT + 1024:
            continue  # (e.g. a request whose max_tokens cuts the output short)
        st.want[k] = b""  # (a 413 is checked instead)
        streams.append((st, k))
    assert len(streams) == n_streams, f"{len(streams)} of {n_streams} too-big streams"
    return singles, streams


def _check_too_big(records: list, dlq: str, singles: list[Single], streams: list[tuple[Stream, int]],
                   pos: dict[str, tuple[int, int]]) -> dict[str, int]:
    """A too-big single: every reply the same 413 ``PayloadTooLargeError`` naming its size and
    the limit, and a ``reply-too-large`` dead letter of its record. A too-big stream chunk k:
    chunks before it the core's 200s, chunk k that 413 ending the stream (``derender-stream-end``)
    and dead-lettered, later chunks the ended-stream 409; every copy of a seq identical. No
    other dead letter. Raises ``AssertionError``; returns counts."""
    by_corr: dict[bytes, list] = {}
    dl_reason: dict[tuple[int, int], set] = {}
    for r in records:
        hh = h(r)
        if r.topic == dlq:
            dl_reason.setdefault((int(hh["x-original-partition"]), int(hh["x-original-offset"])), set()).add(
                hh.get("x-dlq-reason", b""))
        elif hh.get(CORR) is not None:
            by_corr.setdefault(hh[CORR], []).append(r)

    def is413(r, end: bool) -> bool:
        body = json.loads(r.value)
        err = body.get("error", {}) if isinstance(body, dict) else {}
        m = re.fullmatch(_TOO_BIG, err.get("message", "").encode())
        return (h(r).get(STATUS) == b"413" and err.get("type") == "PayloadTooLargeError" and m is not None
                and int(m.group(1)) > TOO_BIG_LIMIT and (h(r).get(END) == b"1") == end)

    def dead_lettered(key: str) -> bool:
        reasons = dl_reason.pop(pos[key], set())
        return bool(reasons) and all(re.fullmatch(b"reply-too-large: " + _TOO_BIG, x) for x in reasons)

    bad = []
    for s in singles:
        got = by_corr.get(s.id.encode(), [])
        if not got or not all(is413(r, False) for r in got) or len({r.value for r in got}) > 1:
            bad.append(f"too-big single {s.id}: {[(h(r).get(STATUS), r.value[:160]) for r in got][:2]}")
        if not dead_lettered(s.id):
            bad.append(f"too-big single {s.id}: no reply-too-large dead letter")
    for st, k in streams:
        per: dict[int, list] = {}
        for r in by_corr.get(st.id.encode(), []):
            per.setdefault(int(h(r)[SEQ]), []).append(r)
        for seq in range(len(st.chunks)):
            got = per.get(seq, [])
            if seq < k:
                ok = bool(got) and all(r.value == st.want[seq] and h(r).get(STATUS) == b"200" for r in got)
            elif seq == k:
                ok = bool(got) and all(is413(r, True) for r in got)
            else:
                ok = bool(got) and all(h(r).get(STATUS) == b"409" and b"already ended" in r.value for r in got)
            if not ok or len({(r.value, h(r).get(STATUS), h(r).get(END)) for r in got}) > 1:
                bad.append(f"too-big stream {st.id} seq {seq} (413 at {k}): "
                           f"{[(h(r).get(STATUS), r.value[:160]) for r in got][:2]}")
        if not dead_lettered(f"{st.id}#{k}"):
            bad.append(f"too-big stream {st.id}: no reply-too-large dead letter for chunk {k}")
    if dl_reason:
        bad.append(f"{len(dl_reason)} other dead letter(s): {list(dl_reason.items())[:3]}")
    assert not bad, f"{len(bad)} violation(s):\n" + "\n".join(bad[:10])
    return {"too_big_singles": len(singles), "too_big_streams": len(streams)}


def reply_too_big(size: str = "reduced") -> dict[str, Any]:
    """Replies larger than ``--max-request-size`` (16 KB here) among valid traffic over two
    workers, one kill -9'd once 40% of the records are answered (the survivor takes its partitions):
    a too-big single request gets a small 413 reply to its address and its record is
    dead-lettered in full; a stream whose chunk 2 is too big ends there with that 413 (later
    chunks: the ended-stream 409); duplicates identical, every other record answered exactly
    (``harness.Ledger``) and nothing else dead-lettered (issue 17, fault 2)."""
    sz = SIZES[size]
    rig = Rig("reply-too-big", partitions=sz["partitions"])
    try:
        extra = ["--max-request-size", str(TOO_BIG_LIMIT), "--dead-letter-max-bytes", str(8 * 1024)]
        a, b = rig.worker(extra), rig.worker(extra)
        rig.wait_ready([a, b])
        big_singles, big_streams = _too_big_records(sz["too_big"], max(2, sz["too_big"] // 2), "tb")
        ledger = Ledger(singles=make_singles(sz["outage_singles"], "tbs"), streams=make_streams(sz["streams"], "tbt"))
        singles = ledger.single_records() + [(s.id.encode(), s.value, [(CORR, s.id.encode())]) for s in big_singles]
        random.Random(17).shuffle(singles)  # the too-big ones spread out
        rounds = stream_records(ledger.streams + [st for st, _ in big_streams])
        recs, step = [], max(1, len(singles) // max(1, len(rounds)))
        for i, rnd in enumerate(rounds):  # chunk rounds interleaved with the singles
            recs += singles[i * step:(i + 1) * step] + rnd
        recs += singles[len(rounds) * step:]
        where = asyncio.run(produce(rig.bs, rig.inp, recs, pace=0.02))
        rig.wait_answers(int(len(recs) * 0.4), 120)
        a.kill9()  # mid-run: its answered but uncommitted records come again from the survivor
        rig.phase("killed")
        seq_of = {id(r): dict(r[2]).get(SEQ) for r in recs}
        pos = {(r[0].decode() + (f"#{seq_of[id(r)].decode()}" if seq_of[id(r)] is not None else "")): p
               for r, p in zip(recs, where, strict=True)}

        def passes() -> bool:  # (a count would be reached early: the kill adds duplicates)
            got = [r for _, r in list(rig.collector.records)]
            try:
                ledger.check(got, rig.dlq)
                _check_too_big(got, rig.dlq, big_singles, big_streams, pos)
                return True
            except AssertionError:
                return not any(w.alive for w in rig.workers)

        rig.collector.wait(passes, 180)
        figs = _finish(rig, ledger, 0, 0, records=len(recs))
        figs.update(_check_too_big([r for _, r in rig.collector.records], rig.dlq, big_singles, big_streams, pos))
        return figs
    finally:
        rig.close()


SCENARIOS = {
    "kill9-batch": kill9_batch,
    "kill9-stream": kill9_stream,
    "kill9-pieces": kill9_pieces,
    "redis-outage-aof": lambda size="reduced": redis_outage(size, "aof", name="redis-outage-aof"),
    "redis-restart-rdb": lambda size="reduced": redis_outage(size, "rdb", name="redis-restart-rdb"),
    "redis-restart-empty": lambda size="reduced": redis_outage(size, "none", lose_worker=True,
                                                               name="redis-restart-empty"),
    "redis-flush": lambda size="reduced": redis_outage(size, "none", flush=True, lose_worker=True, outage_s=2.0,
                                                       name="redis-flush"),
    "broker-restart": broker_restart,
    "fuzz": fuzz,
    "overload": overload,
    "abandoned-redis": lambda size="reduced": abandoned_streams(size, "redis"),
    "abandoned-memory": lambda size="reduced": abandoned_streams(size, "memory"),
    "redis-stall-pause": lambda size="reduced": redis_stall(size, "pause"),
    "redis-stall-kill": lambda size="reduced": redis_stall(size, "kill"),
    "broker-backlog-deadline": lambda size="reduced": broker_restart_backlog(size, "deadline"),
    "broker-backlog-sigterm": lambda size="reduced": broker_restart_backlog(size, "sigterm"),
    "broker-frozen-sigterm": lambda size="reduced": broker_restart_backlog(size, "frozen"),
    "reply-too-big": reply_too_big,
}
