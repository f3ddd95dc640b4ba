"""Kafka helpers shared by the Kafka test modules: served model and tokenizer of the test config,
real derender bodies, worker settings for tests, fresh names, producing, collecting replies and
reading committed offsets through a real broker (``kafka_bootstrap``)."""
from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from tokenizers import Tokenizer

from worker.transport.settings import WorkerSettings

__all__ = ["qwen3", "tokenizer", "chat_body", "completion_body", "make_stream", "settings", "names", "produce",
           "collect", "committed_and_end", "headers", "hang_reply_topics", "REDIS_URL"]

#: the Redis of the stream tests (``redis_prefix`` fixture in ``tests/conftest.py``)
REDIS_URL = os.environ.get("REDIS_URL") or os.environ.get("DERENDER_REDIS_URL") or "redis://127.0.0.1:6379/0"
CITIES = ["Paris", "Oslo", "Lima", "Kyoto", "Accra", "Quito", "Perth", "Riga", "Bern", "Cairo"]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}}}}}]


def qwen3(models):
    """The ``qwen3`` served model of ``models`` (else the first)."""
    return next((m for m in models if m.name == "qwen3"), models[0])


def tokenizer(models):
    """The raw ``tokenizers.Tokenizer`` of the ``qwen3`` served model (to build real ids)."""
    return Tokenizer.from_file(str(Path(qwen3(models).tokenizer) / "tokenizer.json"))


def chat_body(tok, model: str, rid: str | None, text: str, ids: list[int] | None = None) -> bytes:
    """A ``DerenderChatRequest`` whose output is ``text`` + ``<|im_end|>`` (real Qwen3 ids)."""
    eos = tok.token_to_id("<|im_end|>")
    prompt = tok.encode("<|im_start|>user\nSay something<|im_end|>\n<|im_start|>assistant\n").ids
    if ids is None:
        ids = tok.encode(text).ids + [eos]
    gr = {"choices": [{"index": 0, "token_ids": ids, "finish_reason": "stop", "stop_reason": None,
                       "logprobs": None}]}
    if rid is not None:
        gr["request_id"] = rid
    return json.dumps({"model": model, "generate_response": gr, "prompt_tokens": len(prompt),
                       "prompt_token_ids": prompt,
                       "chat_request": {"model": model, "messages": [{"role": "user", "content": "Say something"}]},
                       }).encode()


def completion_body(tok, model: str, rid: str, text: str) -> bytes:
    """A ``DerenderCompletionRequest`` with one engine response whose output is ``text``."""
    prompt = tok.encode("Once upon a time").ids
    return json.dumps({"model": model, "generate_responses": [
        {"request_id": rid, "choices": [{"index": 0, "token_ids": tok.encode(text).ids, "finish_reason": "length"}]}],
        "prompt_tokens": [len(prompt)], "prompt_token_ids": [prompt],
        "completion_request": {"model": model, "prompt": "Once upon a time", "max_tokens": 16}}).encode()


def settings(bs: str, kind: str, **kw) -> WorkerSettings:
    """Worker settings for tests: thread pool, fast commits, short group timeouts on Tansu (its
    join takes about half the session timeout; real Kafka needs >= 6 s)."""
    base = dict(bootstrap_servers=bs, executor="thread", num_workers=2, commit_interval_ms=100,
                session_timeout_ms=2000 if kind == "tansu" else 6000, heartbeat_interval_ms=500,
                drain_timeout_s=20.0)
    base.update(kw)
    return WorkerSettings(**base)


def names() -> SimpleNamespace:
    """Fresh topic and group names for one test: ``inp``, ``reply``, ``reply2``, ``dlq``, ``group``."""
    u = uuid.uuid4().hex[:8]
    return SimpleNamespace(inp=f"in-{u}", reply=f"rep-{u}", reply2=f"rep2-{u}", dlq=f"dlq-{u}", group=f"g-{u}")


async def produce(bs: str, topic: str, records: list[tuple]) -> None:
    """records: (key, value, headers[, partition])."""
    p = AIOKafkaProducer(bootstrap_servers=bs, enable_idempotence=False)
    await p.start()
    try:
        for r in records:
            key, value, headers = r[:3]
            part = r[3] if len(r) > 3 else None
            await p.send_and_wait(topic, value, key=key, headers=headers, partition=part)
    finally:
        await p.stop()


async def collect(bs: str, topics: list[str], n: int, timeout: float = 30.0, settle: float = 0.0,
                  until=None) -> dict:
    """Read ``topics`` from the beginning (no group) until ``n`` records arrived (or, with
    ``until``, until ``until(got)`` is true: e.g. every key answered, when redelivery may add
    duplicates), then ``settle`` seconds more (to catch extras). Returns topic -> list of
    ConsumerRecord."""
    c = AIOKafkaConsumer(*topics, bootstrap_servers=bs, auto_offset_reset="earliest", enable_auto_commit=False)
    await c.start()
    got: dict[str, list] = {t: [] for t in topics}
    try:
        deadline = time.monotonic() + timeout
        def done() -> bool:
            return until(got) if until is not None else sum(map(len, got.values())) >= n

        while not done() and time.monotonic() < deadline:
            for tp, ms in (await c.getmany(timeout_ms=200)).items():
                got[tp.topic].extend(ms)
        end = time.monotonic() + settle
        while time.monotonic() < end:
            for tp, ms in (await c.getmany(timeout_ms=100)).items():
                got[tp.topic].extend(ms)
    finally:
        await c.stop()
    return got


async def committed_and_end(bs: str, group: str, topic: str, partitions: int) -> tuple[dict, dict]:
    """``(committed offsets, end offsets)`` of ``topic``'s ``partitions`` for consumer ``group``
    (partition -> offset; committed None when nothing was committed)."""
    tps = [TopicPartition(topic, i) for i in range(partitions)]
    c = AIOKafkaConsumer(bootstrap_servers=bs, group_id=group, enable_auto_commit=False)
    await c.start()
    try:
        committed = {tp.partition: await c.committed(tp) for tp in tps}
        end = {tp.partition: off for tp, off in (await c.end_offsets(tps)).items()}
    finally:
        await c.stop()
    return committed, end


def hang_reply_topics(worker, hangs) -> list[str]:
    """Make ``worker``'s producer wait forever on the partitions of every topic for which
    ``hangs(topic)`` is true (a reply topic whose metadata never arrives); other topics are
    looked up as before. Returns the list the hanging names are appended to, in call order."""
    real, waits = worker._producer.partitions_for, []

    async def partitions_for(topic):
        if hangs(topic):
            waits.append(topic)
            await asyncio.sleep(3600)
        return await real(topic)

    worker._producer.partitions_for = partitions_for
    return waits


def headers(rec) -> dict[str, bytes]:
    """A consumed record's headers as a dict."""
    return dict(rec.headers or ())


def make_stream(tok, rid: str, i: int) -> tuple[bytes, list[bytes]]:
    """(non-streaming body, 1-token chunk bodies) of one parsed Qwen3 answer: reasoning, content,
    one hermes tool call, EOS. Chunk 0 carries chat_request and the prompt."""
    city = CITIES[i % len(CITIES)]
    text = (f"<think>\nRequest {i}: the user wants the weather in {city}. I will call the tool.\n</think>\n\n"
            f"Checking {city} now.\n<tool_call>\n"
            f'{{"name": "get_weather", "arguments": {{"city": "{city}", "unit": "celsius"}}}}\n</tool_call>')
    return qwen3_stream(tok, rid, text, city)


def qwen3_stream(tok, rid: str, text: str, city: str, tool_choice=None) -> tuple[bytes, list[bytes]]:
    """(non-streaming body, 1-token chunk bodies) of the Qwen3 answer ``text`` (then EOS) to
    "Weather in ``city``?" with the weather tool (and ``tool_choice`` when given); chunk 0
    carries chat_request and the prompt, the last one the finish reason and usage."""
    ids = tok.encode(text, add_special_tokens=False).ids + [tok.token_to_id("<|im_end|>")]
    prompt = tok.encode(f"<|im_start|>user\nWeather in {city}?<|im_end|>\n<|im_start|>assistant\n").ids
    req = {"model": "qwen3", "messages": [{"role": "user", "content": f"Weather in {city}?"}], "tools": TOOLS}
    if tool_choice is not None:
        req["tool_choice"] = tool_choice
    full = {"model": "qwen3", "generate_response": {"request_id": rid, "choices": [
        {"index": 0, "token_ids": ids, "finish_reason": "stop", "stop_reason": None}]},
        "prompt_tokens": len(prompt), "prompt_token_ids": prompt, "chat_request": req}
    chunks = []
    for k, t in enumerate(ids):
        last = k == len(ids) - 1
        gc = {"request_id": rid, "choices": [{"index": 0, "token_ids": [t], "finish_reason": "stop" if last else None}]}
        if last:
            gc["usage"] = {"prompt_tokens": len(prompt), "completion_tokens": len(ids),
                           "total_tokens": len(prompt) + len(ids)}
        b = {"model": "qwen3", "stream": True, "generate_chunk": gc}
        if k == 0:
            b.update(chat_request=req, prompt_token_ids=prompt, prompt_tokens=len(prompt))
        chunks.append(json.dumps(b).encode())
    return json.dumps(full).encode(), chunks
