"""Parts of the chaos suite: private Redis servers, the embedded broker, worker subprocesses, a
producer, a reply/dead-letter collector, the valid workload with its expected answers, and the
invariant ledger.

Everything runs for real: ``redis-server`` processes on free ports (``RedisServer``: no
persistence, AOF with ``appendfsync always``, or RDB snapshots, data in a temporary folder), the
embedded Tansu broker (``worker.transport.broker.TansuBroker`` on a fixed port so that it can be
restarted), and ``python -m worker.cli run`` subprocesses (``WorkerProc``) on the parity corpus'
Qwen3 models (``tests/chaos/models.json``: qwen3, qwen3-coder, qwen3-noparser; one tokenizer, so
workers start fast). The workload is the corpus cases of those models plus the demo examples. The
expected answer of every valid record is the in-process core's answer (``DerenderService.derender`` / ``derender_stream``) for the same
bytes: the worker must publish exactly those bytes.
"""
from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from worker.transport.broker import TansuBroker, free_port, wait_for_port

REPO = Path(__file__).resolve().parents[2]
MODELS_JSON = REPO / "tests" / "chaos" / "models.json"  # the corpus' Qwen3 models (fast worker start)
SEQ, END, STATUS, CORR = "derender-seq", "derender-stream-end", "derender-status", "correlation-id"
MAX_BYTES = 16 * 1024 * 1024  # client-side record size limit of the chaos producer/collector
#: every record is produced with this Kafka timestamp (CreateTime): the worker answers with it as
#: ``created`` (``records.record_created``), so the expected answers use it too
CREATED_S = 1_750_000_000
_SPAWNED: list[subprocess.Popen] = []  # every process the suite started (killed at exit)


def kill_spawned() -> None:
    """SIGKILL every process (and session) the suite started that is still running; registered
    with ``atexit`` so that an interrupted run leaves nothing behind."""
    for p in _SPAWNED:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                p.kill()


atexit.register(kill_spawned)


# ------------------------------------------------------------------------------- processes ----
def rss_kb(pid: int, field_name: str = "VmRSS") -> int:
    """``VmRSS`` (or ``VmHWM``: peak) of a process in KiB from ``/proc``; 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except OSError:
        return 0
    return 0


def descendants(pid: int) -> list[int]:
    """Pids of every live descendant of ``pid`` (from ``/proc/*/stat`` parent links)."""
    parent: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
            parent[int(d)] = int(stat[stat.rfind(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return out


def session_pids(sid: int) -> list[int]:
    """Pids of the live processes of session ``sid`` (a worker started with ``start_new_session``:
    its main process, its pool children, forkserver and resource tracker, orphaned or not)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            with contextlib.suppress(OSError, ProcessLookupError):
                if os.getsid(int(d)) == sid and _alive(int(d)):
                    out.append(int(d))
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        return stat[stat.rfind(")") + 2] != "Z"
    except OSError:
        return False


class RedisServer:
    """A private ``redis-server`` on a free port. ``persist``: ``none`` (no RDB, no AOF), ``aof``
    (append-only file, ``appendfsync always``: survives kill -9) or ``rdb`` (snapshot written on a
    graceful ``stop()``). Data and log live in ``workdir``; ``start()`` after ``kill()``/``stop()``
    restarts it on the same port with the same files."""

    def __init__(self, persist: str = "none", workdir: str | None = None):
        assert persist in ("none", "aof", "rdb"), persist
        self.persist = persist
        self.port = free_port()
        self.dir = workdir or tempfile.mkdtemp(prefix="chaos-redis-")
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        cmd = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir,
               "--logfile", "redis.log", "--protected-mode", "no",
               "--save", "" if self.persist != "rdb" else "3600 1",
               "--appendonly", "yes" if self.persist == "aof" else "no", "--appendfsync", "always"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        _SPAWNED.append(self.proc)
        wait_for_port("127.0.0.1", self.port, 10, self.proc)
        for _ in range(100):  # loading the AOF/RDB: LOADING errors until done
            try:
                if self.client().ping():
                    break
            except Exception:  # noqa: BLE001 - redis-py raises BusyLoadingError & co. while loading
                time.sleep(0.05)
        return self

    def client(self):
        import redis
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2)

    def kill(self) -> None:
        """SIGKILL: no snapshot, no clean AOF close (the AOF is fsynced per write)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        """SIGTERM: Redis writes its RDB snapshot (``rdb`` mode) and exits."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def flush(self) -> None:
        self.client().flushall()

    def keys(self) -> int:
        return int(self.client().dbsize())

    def close(self) -> None:
        self.kill()
        import shutil
        shutil.rmtree(self.dir, ignore_errors=True)


class Broker(TansuBroker):
    """The embedded Tansu broker on a fixed port: ``restart()`` loses every topic, record and offset
    (in-memory storage), exactly what the broker-restart scenario needs."""

    def start(self) -> Broker:
        super().start()
        _SPAWNED.append(self.proc)
        return self

    def restart(self, down_s: float = 0.5) -> None:
        self.stop()
        time.sleep(down_s)
        self.start()


class WorkerProc:
    """A ``python -m worker.cli run`` subprocess in its own session (so that the pool children of a
    kill -9'd main process can be found), stderr lines kept with their arrival time. ``tree``: the
    source tree whose ``worker`` package runs (default: this one; ``tests/chaos/releases.py``:
    another release's)."""

    def __init__(self, name: str, args: list[str], env: dict | None = None, tree: Path = REPO):
        self.name = name
        self.args = args
        self.lines: list[tuple[float, str]] = []
        self.killed = False
        self.peak_kb = 0
        self.exit_t: float | None = None
        cmd = [sys.executable, "-m", "worker.cli", "--log-level", "INFO", "run", *args]
        self.p = subprocess.Popen(cmd, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                  errors="replace", start_new_session=True,
                                  env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(tree),
                                       **(env or {})})
        self.sid = self.p.pid
        _SPAWNED.append(self.p)
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _read(self) -> None:
        for line in self.p.stderr:
            self.lines.append((time.monotonic(), line.rstrip()))
        self.p.wait()
        self.exit_t = time.monotonic()  # (about when it exited: its stderr closed)

    def drain_output(self, timeout: float = 10.0) -> None:
        """After the process exited: wait until its stderr has been read to the end."""
        self._t.join(timeout)

    def text(self, last: int = 40) -> str:
        return "\n".join(x for _, x in self.lines[-last:])

    def grep(self, pattern: str) -> list[str]:
        r = re.compile(pattern)
        return [x for _, x in self.lines if r.search(x)]

    def owns_partitions(self) -> bool:
        a = self.grep("assigned partitions:")
        return bool(a) and "[]" not in a[-1].split("assigned partitions:")[-1]

    def assigned(self) -> bool:
        return bool(self.grep("assigned partitions:"))

    @property
    def alive(self) -> bool:
        return self.p.poll() is None

    def rss_kb(self) -> tuple[int, int]:
        """(main process RSS, RSS of its descendants) in KiB, now; also tracks the peak sum."""
        main = rss_kb(self.p.pid)
        kids = sum(rss_kb(c) for c in descendants(self.p.pid))
        self.peak_kb = max(self.peak_kb, main + kids)
        return main, kids

    def kill9(self, whole_session: bool = False) -> None:
        """SIGKILL the main process only (as an OOM killer or ``kill -9 PID`` would), or its session."""
        self.killed = True
        if whole_session:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.sid, signal.SIGKILL)
        elif self.alive:
            os.kill(self.p.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.p.wait(10)

    def stop(self, timeout: float = 25.0) -> int | None:
        """SIGTERM (drain), then SIGKILL of the whole session; returns the exit status."""
        if self.alive:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout)
            except subprocess.TimeoutExpired:
                self.killed = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.sid, signal.SIGKILL)  # leftovers of the session (never lingering)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.p.wait(5)
        return self.p.returncode


# ------------------------------------------------------------------------------ workload ----
@cache
def service():
    """The in-process core over the corpus' served models (the expected answers)."""
    from worker.config import load_config_file
    from worker.core.service import DerenderService
    return DerenderService(load_config_file(MODELS_JSON))


@cache
def corpus_bodies() -> tuple[list[dict], list[list[dict]]]:
    """(non-streaming bodies, streams as lists of chunk bodies) of the parity corpus, plus the
    demo examples (non-streaming)."""
    from tests.parity import corpus
    from tests.parity_tools import to_requests
    singles, streams = [], []
    served = json.loads(MODELS_JSON.read_text())
    for case in corpus():
        if case["model"] not in served:
            continue
        b = to_requests.nonstream_body(case)
        if b is not None:
            singles.append(b)
        s = to_requests.stream_bodies(case)
        if s:
            streams.append(s)
    with open(REPO / "worker" / "demo_data" / "examples.jsonl", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                ex = json.loads(line)
                if ex["body"].get("model") in served:
                    singles.append(ex["body"])
    return singles, streams


@dataclass
class Single:
    """A valid non-streaming record and the core's answer for it; ``alt``: another release's
    answer (body, status) that is right too where that release may answer it (a rolling
    scenario: ``tests/chaos/replies.py``), None: none."""

    id: str
    value: bytes
    want: bytes
    status: int
    alt: tuple[bytes, int] | None = None

    def ok(self, value: bytes, status: bytes | None) -> bool:
        """Whether a reply (body, ``derender-status`` header) is this record's right answer."""
        return (value == self.want and status == str(self.status).encode()) or (
            self.alt is not None and value == self.alt[0] and status == str(self.alt[1]).encode())


@dataclass
class Stream:
    """A valid stream (key = request id = ``id``): chunk bodies and the core's reply per chunk;
    ``alt``: per chunk, another release's reply (body, status) that is right too (as
    ``Single.alt``), None: none."""

    id: str
    chunks: list[bytes]
    want: list[bytes]
    status: list[int]
    alt: list[tuple[bytes, int]] | None = None

    def ok(self, seq: int, value: bytes, status: bytes | None) -> bool:
        """Whether a reply (body, ``derender-status`` header) is chunk ``seq``'s right answer."""
        if not 0 <= seq < len(self.chunks):
            return False
        if value == self.want[seq] and status == str(self.status[seq]).encode():
            return True
        return self.alt is not None and value == self.alt[seq][0] and status == str(self.alt[seq][1]).encode()

    def head(self, n: int) -> Stream:
        """The stream's first ``n`` chunks (those published), with their answers."""
        return Stream(self.id, self.chunks[:n], self.want[:n], self.status[:n],
                      None if self.alt is None else self.alt[:n])


@cache
def _single_answers() -> list[tuple[bytes, bytes, int]]:
    singles, _ = corpus_bodies()
    out = []
    for b in singles:
        v = json.dumps(b).encode()
        r = service().derender(v, created=CREATED_S)
        out.append((v, r.body, int(r.status)))
    return out


def make_singles(n: int, tag: str, small: bool = False) -> list[Single]:
    """``n`` valid non-streaming records cycling over the corpus (``small``: bodies < 4 KB only)."""
    pool = [a for a in _single_answers() if not small or len(a[0]) < 4096]
    return [Single(f"{tag}-{i}-{uuid.uuid4().hex[:6]}", *pool[i % len(pool)]) for i in range(n)]


@cache
def responses_streams() -> list[list[dict]]:
    """The Responses reference cases (issue 14) of the served models as streams of chunk bodies
    (kind told by ``responses_request``; replies are JSON arrays of Responses events)."""
    from tests.parity_tools import responses_to_requests as r2r
    served = json.loads(MODELS_JSON.read_text())
    cases = r2r.load_cases(str(REPO / "tests" / "data" / "parity" / "responses_public.jsonl"), None)
    return [r2r.stream_bodies(c) for c in cases if r2r.served_name(c) in served]


@cache
def messages_streams() -> list[list[dict]]:
    """The Anthropic Messages reference cases (issue 26) of the served models as streams of chunk
    bodies (kind told by ``messages_request``; replies are JSON arrays of Messages events)."""
    from tests.parity_tools import messages_to_requests as m2r
    served = json.loads(MODELS_JSON.read_text())
    cases = m2r.load_cases(str(REPO / "tests" / "data" / "parity" / "messages_public.jsonl"), None)
    return [m2r.stream_bodies(c) for c in cases if m2r.served_name(c) in served]


def big_call_streams(words: int = 700) -> list[list[dict]]:
    """Streams whose one tool call carries a ``words``-word string argument (several KB: the
    open call's body spills to the stream's pieces, ``worker.core.stream``), 1-token chunks: a
    hermes JSON call (``qwen3``) and a Qwen3-Coder XML call (``qwen3-coder``)."""
    svc = service()
    tok = svc.runtime("qwen3").tokenizer
    arg = " ".join(f"the build log says step {i % 50} passed with no warning" for i in range(words // 9))
    tools = [{"type": "function", "function": {"name": "write_file", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}}}}]
    texts = {
        "qwen3": "<think>\nWrite it.\n</think>\n\nWriting.\n<tool_call>\n" + json.dumps(
            {"name": "write_file", "arguments": {"path": "log.txt", "content": arg}}) + "\n</tool_call>",
        "qwen3-coder": "Writing.\n<tool_call>\n<function=write_file>\n<parameter=path>\nlog.txt\n</parameter>\n"
                       "<parameter=content>\n" + arg + "\n</parameter>\n</function>\n</tool_call>",
    }
    out = []
    for model, text in texts.items():
        ids = tok.encode(text) + [tok.token_to_id("<|im_end|>")]
        prompt = tok.encode("<|im_start|>user\nwrite the log<|im_end|>\n<|im_start|>assistant\n")
        req = {"model": model, "messages": [{"role": "user", "content": "write the log"}], "tools": tools}
        bodies = []
        for k, t in enumerate(ids):
            last = k == len(ids) - 1
            gc = {"request_id": "big", "choices": [{"index": 0, "token_ids": [t],
                                                     "finish_reason": "stop" if last else None}]}
            b = {"model": model, "stream": True, "generate_chunk": gc}
            if k == 0:
                b.update(chat_request=req, prompt_token_ids=prompt, prompt_tokens=len(prompt))
            bodies.append(b)
        out.append(bodies)
    return out


def make_streams(n: int, tag: str, source: list[list[dict]] | None = None) -> list[Stream]:
    """``n`` valid streams cycling over the corpus' streams (or ``source``), each with its own
    request id (so its own key and state), with the core's reply for every chunk; a stream is cut
    after the chunk that ends it (an error reply, or the request complete)."""
    streams = source if source is not None else corpus_bodies()[1]
    svc = service()
    out = []
    for i in range(n):
        rid = f"{tag}-{i}-{uuid.uuid4().hex[:6]}"
        chunks, want, status = [], [], []
        state = None
        for seq, body in enumerate(streams[i % len(streams)]):
            b = dict(body, generate_chunk=dict(body["generate_chunk"], request_id=rid))
            v = json.dumps(b).encode()
            res, state = svc.derender_stream(v, state, seq=seq, created=CREATED_S)
            chunks.append(v)
            want.append(res.body)
            status.append(int(res.status))
            if res.status != 200 or getattr(res, "done", False):
                break  # the stream ended here (later chunks would get the worker's "already ended" 409)
        out.append(Stream(rid, chunks, want, status))
    return out


# ------------------------------------------------------------------------- kafka clients ----
async def produce(bs: str, topic: str, records: list[tuple], *, pace: float = 0.0,
                  on_progress=None) -> list[tuple[int, int]]:
    """Publish ``records`` = ``(key, value, headers)`` (optionally ``partition`` 4th) and return
    each one's ``(partition, offset)``. ``pace``: seconds to sleep per 100 records;
    ``on_progress(i)`` is called after each 100 (kill points)."""
    from aiokafka import AIOKafkaProducer
    p = AIOKafkaProducer(bootstrap_servers=bs, enable_idempotence=False, linger_ms=20,
                         max_request_size=MAX_BYTES, max_batch_size=1024 * 1024, request_timeout_ms=60000)
    await p.start()
    futs = []
    try:
        for i, r in enumerate(records):
            futs.append(await p.send(topic, r[1], key=r[0], headers=r[2], partition=r[3] if len(r) > 3 else None,
                                     timestamp_ms=CREATED_S * 1000))
            if (i + 1) % 100 == 0:
                if on_progress is not None:
                    on_progress(i + 1)
                if pace:
                    await asyncio.sleep(pace)
        metas = await asyncio.gather(*futs)
    finally:
        await p.stop()
    return [(m.partition, m.offset) for m in metas]


class Collector:
    """Reads ``topics`` from the beginning (no consumer group) in a background thread; keeps
    every record with its arrival time (``time.monotonic()``)."""

    def __init__(self, bs: str, topics: list[str]):
        self.bs, self.topics = bs, topics
        self.records: list[tuple[float, Any]] = []
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self._t = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._t.start()

    async def _run(self) -> None:
        from aiokafka import AIOKafkaConsumer
        try:
            c = AIOKafkaConsumer(*self.topics, bootstrap_servers=self.bs, auto_offset_reset="earliest",
                                 enable_auto_commit=False, max_partition_fetch_bytes=MAX_BYTES,
                                 fetch_max_bytes=4 * MAX_BYTES, metadata_max_age_ms=1000)
            await c.start()
            try:
                while not self._stop.is_set():
                    for _, ms in (await c.getmany(timeout_ms=200, max_records=5000)).items():
                        now = time.monotonic()
                        self.records.extend((now, m) for m in ms)
            finally:
                await c.stop()
        except Exception as e:  # noqa: BLE001 - reported by the scenario (collector_error)
            self.error = e

    def count(self, topic: str | None = None) -> int:
        return sum(1 for _, r in self.records if topic is None or r.topic == topic)

    def wait(self, pred, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred():
                return True
            time.sleep(0.2)
        return pred()

    def close(self) -> None:
        self._stop.set()
        self._t.join(15)


async def create_topics(bs: str, topics: dict[str, int]) -> None:
    from worker.transport.topics import ensure_topics
    await ensure_topics(bs, topics)


def h(rec) -> dict[str, bytes]:
    return dict(rec.headers or ())


# ----------------------------------------------------------------------------- invariants ----
@dataclass
class Ledger:
    """What was published and what must come back; ``check()`` asserts the suite's invariants.

    * every valid single: at least one reply (correlation id = its id), every copy byte-identical
      to the core's answer with its status;
    * every valid stream: for each seq a reply, every copy byte-identical to the core's reply for
      that chunk (or, where ``lost_ok``, a correct prefix ended by one 409 saying the state was lost);
    * every bad record: answered (a reply with its correlation id or key) or dead-lettered (a dead
      letter naming its partition/offset);
    * duplicates only byte-identical (value and status)."""

    singles: list[Single] = field(default_factory=list)
    streams: list[Stream] = field(default_factory=list)
    #: hostile records: (id, key, request id in the value, what, correlation-id header)
    bad: list[tuple[str, bytes | None, bytes | None, str, bytes | None]] = field(default_factory=list)
    bad_pos: dict[str, tuple[int, int]] = field(default_factory=dict)
    lost_ok: bool = False

    def single_records(self) -> list[tuple]:
        return [(s.id.encode(), s.value, [(CORR, s.id.encode())]) for s in self.singles]

    def check(self, records: list, dlq_topic: str) -> dict[str, Any]:
        """Raises ``AssertionError`` listing (up to 10) violations; returns the counts."""
        by_corr: dict[bytes, list] = defaultdict(list)
        dlq_pos: dict[tuple[int, int], list] = defaultdict(list)
        for r in records:
            if r.topic == dlq_topic:
                hh = h(r)
                with contextlib.suppress(KeyError, ValueError):
                    dlq_pos[(int(hh["x-original-partition"]), int(hh["x-original-offset"]))].append(r)
            else:
                c = h(r).get(CORR)
                if c is not None:
                    by_corr[c].append(r)
        bad: list[str] = []
        dups = 0
        for s in self.singles:
            got = by_corr.get(s.id.encode(), [])
            if not got:
                bad.append(f"single {s.id}: no reply")
                continue
            dups += len(got) - 1
            for r in got:
                if not s.ok(r.value, h(r).get(STATUS)):
                    bad.append(f"single {s.id}: reply differs from the core's answer "
                               f"(status {h(r).get(STATUS)}, {r.value[:160]!r} vs {s.want[:160]!r})")
                    break
        lost = 0
        for st in self.streams:
            per: dict[int, list] = defaultdict(list)
            for r in by_corr.get(st.id.encode(), []):
                with contextlib.suppress(KeyError, ValueError):
                    per[int(h(r)[SEQ])].append(r)
            verdict = self._check_stream(st, per)
            if verdict == "lost":
                lost += 1
            elif verdict:
                bad.append(verdict)
            dups += sum(len(v) - 1 for v in per.values())
        answered_bad = dlq_bad = 0
        for bid, key, rid, what, corr in self.bad:
            # a reply carries the correlation-id header, else the key, else the body's request id
            addr = corr if corr is not None else key if key is not None else rid
            cands = by_corr.get(addr, []) if addr is not None else []
            pos = self.bad_pos.get(bid)
            dl = dlq_pos.get(pos, []) if pos else []
            if cands:
                answered_bad += 1
            elif dl:
                dlq_bad += 1
            else:
                bad.append(f"bad record {bid} ({what}) at {pos}: neither answered nor dead-lettered")
            for group in (cands, dl):
                if len({(r.value, h(r).get(STATUS)) for r in group}) > 1:
                    bad.append(f"bad record {bid} ({what}): non-identical duplicates")
        assert not bad, f"{len(bad)} invariant violation(s):\n" + "\n".join(bad[:10])
        return {"singles": len(self.singles), "streams": len(self.streams), "streams_lost_409": lost,
                "bad": len(self.bad), "bad_answered": answered_bad, "bad_dead_lettered": dlq_bad,
                "duplicates": dups, "replies": sum(1 for r in records if r.topic != dlq_topic),
                "dead_letters": sum(1 for r in records if r.topic == dlq_topic)}

    def _check_stream(self, st: Stream, per: dict[int, list]) -> str | None:
        """None (complete and correct), "lost" (ended by the lost-state 409, as ``lost_ok``
        allows) or what is wrong with stream ``st`` (``per``: seq -> its replies).

        The contract for a chunk whose owner and state are both lost (docs/delivery.md, "Delivery
        guarantees"): the lost owner may have published the core's 200 for it before it died,
        uncommitted; the new owner, finding no state, ends the stream with the 409 "lost or
        expired" (on the highest chunk it held) and answers later chunks with the ended-stream
        409. So with ``lost_ok``, and only for a stream that has that 409, a seq may carry exactly
        the core's 200 and a 409 that ends the stream; any other difference between copies is a
        violation."""
        n = len(st.chunks)

        def ok200(seq: int, r) -> bool:
            return st.ok(seq, r.value, h(r).get(STATUS))

        def end409(r) -> bool:
            return h(r).get(STATUS) == b"409" and h(r).get(END) == b"1"

        lost_at = sorted(q for q, recs in per.items()
                         if any(end409(r) and re.search(rb"lost|expired", r.value) for r in recs))
        for seq, recs in per.items():
            if len({(r.value, h(r).get(STATUS), h(r).get(END)) for r in recs}) > 1:
                if not (self.lost_ok and lost_at and all(ok200(seq, r) or end409(r) for r in recs)):
                    return f"stream {st.id} seq {seq}: non-identical duplicates"
        for seq in range(n):
            recs = per.get(seq) or []
            if any(ok200(seq, r) for r in recs):
                continue
            if self.lost_ok and lost_at:
                # the lost-state 409 ends the stream at the highest chunk it held (>= this one), or
                # before it (the lost owner had answered further); later chunks: 409s (or the
                # lost owner's correct 200s)
                q = next((q for q in lost_at if q >= seq), lost_at[0])
                for later in range(min(seq, q + 1), n):
                    lr = per.get(later)
                    if lr and not all(ok200(later, x) or end409(x) for x in lr):
                        return f"stream {st.id}: seq {later} after the lost-state 409 not a 409"
                return "lost"
            r = recs[0] if recs else None
            if r is None:
                return f"stream {st.id}: no reply for seq {seq} (got {sorted(per)[:8]}...)"
            return (f"stream {st.id} seq {seq}: reply differs from the core's (status {h(r).get(STATUS)}: "
                    f"{r.value[:200]!r} vs {st.want[seq][:200]!r})")
        return None


def stream_records(streams: list[Stream], *, extra_headers: list | None = None) -> list[list[tuple]]:
    """Chunk records by round: round k holds chunk k of every stream that has one."""
    width = max((len(s.chunks) for s in streams), default=0)
    return [[(s.id.encode(), s.chunks[k], [(SEQ, str(k).encode()), *(extra_headers or [])])
             for s in streams if k < len(s.chunks)] for k in range(width)]
