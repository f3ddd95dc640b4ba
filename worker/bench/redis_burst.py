"""``derender-worker bench stream --redis-burst N``: Redis commands per stream chunk when ``N``
streams of ``--burst-chunks`` (default 3) chunks are opened at once.

A private ``redis-server`` (on a free port, no persistence: ``INFO commandstats`` counts every
client of a server, so a shared Redis would count its other users too) and the embedded broker
(Tansu, in memory) are started; all records are produced first, chunk 0 of every stream, then
chunk 1 of every stream, ... (round-robin over 4 partitions: the streams are all open at once),
then one in-process ``KafkaDerenderWorker`` (``--stream-state redis``) answers them. The figure
is the difference of ``INFO commandstats`` taken before the worker starts and once every reply
is read back, every offset is committed and every ended stream's key is deleted (``DBSIZE`` 0).
Counting follows ``INFO commandstats``: each command a client sends is one call (``EVALSHA``
included) and so is each ``redis.call`` a script makes (the ``MGET``/``SET``/``DEL`` inside the
checkpoint script); the bench's own probes (``INFO``, ``DBSIZE``) are left out.

Errors: ``RuntimeError`` when ``redis-server`` is missing, or the replies/commits/deletes do not
all arrive within ``timeout_s``.
"""
from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field

import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from worker.state.formats import FORMATS_KEY
from worker.state.redis_store import DEFAULT_PREFIX, RedisSettings
from worker.transport.broker import TansuBroker
from worker.transport.consumer import KafkaDerenderWorker
from worker.transport.records import HDR_SEQ
from worker.transport.settings import WorkerSettings
from worker.transport.topics import ensure_topics

#: commands the bench sends itself (not the worker's)
_PROBES = ("info", "dbsize", "hlen")


@dataclass
class BurstResult:
    """Commands the worker sent for the burst: ``calls`` (command name -> calls, as
    ``INFO commandstats`` counts them), ``chunks`` answered, ``streams``, ``seconds`` (wall)."""

    streams: int
    chunks: int
    seconds: float
    calls: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        """All Redis commands (scripts' inner calls included)."""
        return sum(self.calls.values())

    @property
    def per_chunk(self) -> float:
        """Redis commands per stream chunk."""
        return self.total / max(1, self.chunks)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrivateRedis:
    """A ``redis-server`` of its own on a free port (no persistence), killed on exit; ``url``.
    Raises ``RuntimeError`` when ``redis-server`` is not installed or does not answer in 10 s."""

    def __init__(self) -> None:
        self.url = ""
        self._proc: subprocess.Popen | None = None
        self._dir = ""

    def __enter__(self) -> PrivateRedis:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        port = _free_port()
        self._dir = tempfile.mkdtemp(prefix="burst-redis-")
        self._proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                       "--appendonly", "no", "--dir", self._dir],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.url = f"redis://127.0.0.1:{port}/0"
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.5).close()
                return self
            except OSError:
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    self.__exit__(None, None, None)
                    raise RuntimeError(f"redis-server on port {port} did not start") from None
                time.sleep(0.05)

    def __exit__(self, *exc) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait(10)
            self._proc = None
        shutil.rmtree(self._dir, ignore_errors=True)


_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]


def stream_chunks(tok, rid: str, n_chunks: int, model: str = "qwen3", call: bool = False) -> list[bytes]:
    """``n_chunks`` 1-token chat stream chunk bodies of one request ``rid`` (the last one with EOS,
    finish_reason and usage; chunk 0 carries the chat request and the prompt). ``tok``: a
    ``tokenizers.Tokenizer`` with ``<|im_end|>``. ``call``: the output is one hermes tool call
    whose string argument runs to the end (its body spills to the stream's pieces)."""
    words = tok.encode(" ".join(["Sunny"] * n_chunks), add_special_tokens=False).ids
    head = tok.encode('<tool_call>\n{"name": "get_weather", "arguments": {"city": "',
                      add_special_tokens=False).ids if call else []
    ids = (head + words * n_chunks)[: n_chunks - 1] + [tok.token_to_id("<|im_end|>")]
    prompt = tok.encode("<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n").ids
    req = {"model": model, "messages": [{"role": "user", "content": "Weather?"}]}
    if call:
        req["tools"] = _TOOLS
    out = []
    for k, t in enumerate(ids):
        last = k == len(ids) - 1
        gc: dict = {"request_id": rid, "choices": [{"index": 0, "token_ids": [t],
                                                    "finish_reason": "stop" if last else None}]}
        if last:
            gc["usage"] = {"prompt_tokens": len(prompt), "completion_tokens": len(ids),
                           "total_tokens": len(prompt) + len(ids)}
        b: dict = {"model": model, "stream": True, "generate_chunk": gc}
        if k == 0:
            b.update(chat_request=req, prompt_token_ids=prompt, prompt_tokens=len(prompt))
        out.append(json.dumps(b).encode())
    return out


async def _stream_keys(r) -> int:
    """Keys left in the private Redis but the workers' state-format advertisements
    (``worker.state.formats``: they live while a worker runs)."""
    return await r.dbsize() - (1 if await r.hlen(DEFAULT_PREFIX + FORMATS_KEY) else 0)


async def _calls(r: aioredis.Redis) -> dict[str, int]:
    stats = await r.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}


async def run_burst(bootstrap: str, redis_url: str, models: list, tok, streams: int, chunks: int = 3,
                    partitions: int = 4, timeout_s: float = 600.0, call: bool = False) -> BurstResult:
    """Open ``streams`` streams of ``chunks`` chunks at once through one worker over the broker
    ``bootstrap`` and the Redis ``redis_url`` (which nobody else uses: module docstring); the
    commands it cost. ``models``: served models (``qwen3`` used); ``tok``: its tokenizer; ``call``:
    streams of one long tool call (``stream_chunks``)."""
    u = uuid.uuid4().hex[:8]
    inp, reply, dlq, group = f"burst-in-{u}", f"burst-rep-{u}", f"burst-dlq-{u}", f"burst-{u}"
    await ensure_topics(bootstrap, {inp: partitions, reply: partitions, dlq: 1})
    bodies = [stream_chunks(tok, f"b{u}-{i}", chunks, call=call) for i in range(streams)]
    prod = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False, linger_ms=20)
    await prod.start()
    try:
        futs = [await prod.send(inp, bodies[i][k], key=f"b{u}-{i}".encode(), partition=i % partitions,
                                headers=[(HDR_SEQ, str(k).encode())])
                for k in range(chunks) for i in range(streams)]
        await asyncio.gather(*futs)
    finally:
        await prod.stop()
    r = aioredis.Redis.from_url(redis_url)
    settings = WorkerSettings(bootstrap_servers=bootstrap, input_topic=inp, reply_topic=reply,
                              dead_letter_topic=dlq, group_id=group, executor="thread", num_workers=2,
                              commit_interval_ms=100, session_timeout_ms=6000, heartbeat_interval_ms=500,
                              drain_timeout_s=20.0, redis=RedisSettings(url=redis_url, ttl_s=600))
    total = streams * chunks
    tps = [TopicPartition(inp, p) for p in range(partitions)]
    try:
        before = await _calls(r)
        t0 = time.monotonic()
        c = AIOKafkaConsumer(reply, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                             enable_auto_commit=False)
        await c.start()
        try:
            async with KafkaDerenderWorker(settings, models):
                got = 0
                deadline = t0 + timeout_s
                while got < total and time.monotonic() < deadline:
                    got += sum(len(ms) for ms in (await c.getmany(timeout_ms=200)).values())
                ends = {tp: chunks * len(range(tp.partition, streams, partitions)) for tp in tps}  # (fresh topic)
                watcher = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
                await watcher.start()
                try:
                    while time.monotonic() < deadline:
                        # None: a partition no stream landed on is never committed
                        done = all([(await watcher.committed(tp) or 0) == ends[tp] for tp in tps])
                        if done and got >= total and await _stream_keys(r) == 0:
                            break
                        await asyncio.sleep(0.2)
                    else:
                        left = {tp.partition: (await watcher.committed(tp), ends[tp]) for tp in tps}
                        raise RuntimeError(f"burst not finished in {timeout_s:g}s: {got}/{total} replies, "
                                           f"{await _stream_keys(r)} keys left, (committed, end) offsets {left}")
                finally:
                    await watcher.stop()
                seconds = time.monotonic() - t0
                after = await _calls(r)
        finally:
            await c.stop()
    finally:
        await r.aclose()
    calls = {k: n - before.get(k, 0) for k, n in after.items() if k not in _PROBES and n - before.get(k, 0)}
    return BurstResult(streams, total, seconds, calls)


def print_burst(res: BurstResult) -> None:
    """One block: commands per chunk and per command."""
    print(f"\nRedis burst: {res.streams:,} streams x {res.chunks // max(1, res.streams)} chunks opened at once, "
          f"{res.chunks:,} chunks in {res.seconds:.1f}s")
    print(f"  Redis commands: {res.total:,} = {res.per_chunk:.3f} per chunk (INFO commandstats: "
          f"EVALSHA and each redis.call inside it counted)")
    print("  " + ", ".join(f"{k.upper()} {n:,}" for k, n in sorted(res.calls.items(), key=lambda kv: -kv[1])))


def run_burst_pass(models: list, tok, streams: int, chunks: int, call: bool = False) -> BurstResult:
    """The ``--redis-burst`` pass: a private redis-server and the embedded broker, then
    ``run_burst``; prints and returns the result."""
    with PrivateRedis() as red, TansuBroker() as broker:
        res = asyncio.run(run_burst(broker.bootstrap_servers, red.url, models, tok, streams, chunks, call=call))
    print_burst(res)
    return res
