"""Golden stream-state blobs (issue 23 item 1): what a real Kafka worker writes to Redis for its
streams (a Qwen3 chat stream with reasoning and a hermes call, one whose call grows into the
stream's pieces, a completion stream, a Responses stream and, from release 638fca1 on, three
Anthropic Messages streams), mid-stream and ended.

``streams()``: the records (key, chunk bodies, headers, a fixed record timestamp, the chunk the
stream is cut at); ``run_phase``: a ``KafkaDerenderWorker`` (real broker, real Redis) answers
records and returns the raw Redis values of each stream's keys once its checkpoint reached a seq
(nothing is committed meanwhile: an hour's commit interval, ``--max-in-flight`` above the
records of a phase; a replay window of 4096 keeps every reply and a completed stream's tombstone
stays in the store, so the bytes are reproducible).

Generate (with the release whose blobs they are; ``tests/data/golden_state/README.md``)::

    python3 -m tests.harness.golden_state --out tests/data/golden_state/v6-638fca1
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import json
import time
import uuid
from pathlib import Path

import msgspec
from aiokafka import AIOKafkaProducer

from tests.harness.kafka import REDIS_URL, TOOLS, qwen3_stream
from tests.harness.kafka import collect as _collect
from tests.harness.kafka import names as _names
from tests.harness.kafka import settings as _settings

SEQ, KIND = "derender-seq", "derender-kind"
#: the record timestamp of every chunk (ms): every reply's ``created``
TS_MS = 1767225600000
#: the key suffixes a stream's values live at (``worker.state.redis_store``)
SUFFIXES = {"checkpoint": "", "settings": ":settings", "pieces": ":pieces"}
_WORDS = "the forecast for the coast says light rain then sun with a westerly breeze".split()


class V6Reply(msgspec.Struct, array_like=True):
    """e8f2be2's ``ReplayEntry`` (frozen here: the layout e8f2be2 reads)."""

    seq: int
    status: int
    end: bool
    kind: str | None
    value: bytes


class V6Checkpoint(msgspec.Struct, array_like=True):
    """e8f2be2's ``Checkpoint``."""

    v: int
    state: bytes | None
    replies: list[V6Reply]


v6_decoder = msgspec.msgpack.Decoder(V6Checkpoint)


def v6_read(value: bytes) -> V6Checkpoint:
    """Read a stored checkpoint value as e8f2be2 does (seq digits, then its ``Checkpoint``), and
    check the versions e8f2be2 requires of the state inside."""
    assert value[:20].isdigit()
    ck = v6_decoder.decode(value[20:])
    assert ck.v == 1
    if ck.state is not None:
        if ck.state[:5] == b"\xc1RSP2":
            assert msgspec.msgpack.decode(ck.state[5:])[0] == 1  # ResponsesStreamState.v
        elif ck.state[:5] == b"\xc1MSG2":
            assert msgspec.msgpack.decode(ck.state[5:])[0] == 1  # MessagesStreamState.v (638fca1)
        else:
            assert msgspec.msgpack.decode(ck.state)[0] == 6  # StreamState.v
    return ck


def streams(tok) -> list[dict]:
    """The golden streams: ``name``, ``rid``, ``kind`` (header value or None), ``chunks`` (bodies),
    ``cut`` (the first chunk of the second half)."""
    out = []
    _, chunks = qwen3_stream(tok, "golden-chat", "<think>\nThe user wants the weather in Oslo.\n</think>\n\n"
                             "Checking Oslo now.\n<tool_call>\n"
                             '{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}\n</tool_call>',
                             "Oslo")
    # cut inside the tool call's arguments: an open call in the state
    out.append({"name": "chat", "rid": "golden-chat", "kind": None, "chunks": chunks, "cut": len(chunks) - 8})
    arg = " ".join(_WORDS[i % len(_WORDS)] for i in range(240))
    _, chunks = qwen3_stream(tok, "golden-bigcall", "<think>\nA long note is needed.\n</think>\n\nHere it is.\n"
                             "<tool_call>\n" + json.dumps({"name": "get_weather", "arguments": {"city": "Oslo",
                                                                                               "unit": arg}})
                             + "\n</tool_call>", "Oslo")
    out.append({"name": "bigcall", "rid": "golden-bigcall", "kind": "chat-stream", "chunks": chunks,
                "cut": len(chunks) - 40})
    out.append(_completion(tok))
    out.append(_responses(tok))
    return out + messages_streams()


#: the Messages streams (638fca1 on): name, Messages reference case (tests/harness/messages.py,
#: served models of ``MODELS``), ``derender-kind`` header, cut. ``messages``: thinking, text, a
#: hermes ``tool_use``, cut inside its input; ``messages-ws`` (by body shape, no header):
#: ``qwen3_coder`` holding the ``"\n\n"`` after ``</think>`` (``StackState.lead_ws``);
#: ``messages-text``: the same stream cut after text was emitted (``StackState.text_seen``)
MESSAGES = (("messages", "qwen3-thinking-tool-use", "messages-stream", 34),
            ("messages-ws", "qwen3-coder-thinking-answer", None, 10),
            ("messages-text", "qwen3-coder-thinking-answer", "messages-stream", 12))
#: the served models of every golden stream (qwen3 as tests/data/models.json, and qwen3-coder)
MODELS = Path(__file__).resolve().parent.parent / "data" / "golden_state" / "models.json"


def messages_streams() -> list[dict]:
    """The Messages golden streams (``MESSAGES``): the reference case's chunk bodies with the
    stream's own request id."""
    from tests.harness.messages import BY_ID
    from tests.parity_tools import messages_to_requests as m2r
    out = []
    for name, case, kind, cut in MESSAGES:
        rid = "golden-" + name
        chunks = []
        for b in m2r.stream_bodies(BY_ID[case]):
            b["generate_chunk"]["request_id"] = rid
            chunks.append(json.dumps(b).encode())
        out.append({"name": name, "rid": rid, "kind": kind, "chunks": chunks, "cut": cut})
    return out


def _completion(tok) -> dict:
    rid = "golden-completion"
    ids = tok.encode(" there lived a fox who liked the rain. The end.", add_special_tokens=False).ids
    ids.append(tok.token_to_id("<|endoftext|>"))
    prompt = tok.encode("Once upon a time", add_special_tokens=False).ids
    req = {"model": "qwen3", "prompt": "Once upon a time", "max_tokens": 64, "stream": True,
           "stream_options": {"include_usage": True}}
    chunks = []
    for k in range(0, len(ids), 2):
        last = k + 2 >= len(ids)
        gc = {"request_id": rid, "choices": [{"index": 0, "token_ids": ids[k:k + 2],
                                              "finish_reason": "stop" if last else None}]}
        if last:
            gc["usage"] = {"prompt_tokens": len(prompt), "completion_tokens": len(ids),
                           "total_tokens": len(prompt) + len(ids)}
        b = {"model": "qwen3", "stream": True, "generate_chunk": gc}
        if k == 0:
            b.update(completion_request=req, prompt_token_ids=prompt, prompt_tokens=len(prompt))
        chunks.append(json.dumps(b).encode())
    return {"name": "completion", "rid": rid, "kind": "completion-stream", "chunks": chunks, "cut": len(chunks) // 2}


def _responses(tok) -> dict:
    rid = "golden-responses"
    text = ("<think>\nThe user asks about Oslo; the tool answers that.\n</think>\n\nLet me check.\n<tool_call>\n"
            '{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>')
    ids = tok.encode(text, add_special_tokens=False).ids + [tok.token_to_id("<|im_end|>")]
    prompt = tok.encode("<|im_start|>user\nWeather in Oslo?<|im_end|>\n<|im_start|>assistant\n").ids
    tools = [{"type": "function", "name": t["function"]["name"], "parameters": t["function"]["parameters"]}
             for t in TOOLS]
    req = {"model": "qwen3", "input": "Weather in Oslo?", "tools": tools, "stream": True}
    chunks = []
    for k in range(0, len(ids), 3):
        last = k + 3 >= len(ids)
        gc = {"request_id": rid, "choices": [{"index": 0, "token_ids": ids[k:k + 3],
                                              "finish_reason": "stop" if last else None}]}
        if last:
            gc["usage"] = {"prompt_tokens": len(prompt), "completion_tokens": len(ids),
                           "total_tokens": len(prompt) + len(ids)}
        chunks.append(json.dumps({"model": "qwen3", "stream": True, "generate_chunk": gc, "responses_request": req,
                                  "prompt_token_ids": prompt, "prompt_tokens": len(prompt)}).encode())
    return {"name": "responses", "rid": rid, "kind": "responses-stream", "chunks": chunks, "cut": len(chunks) // 2}


def records(stream: dict, start: int, end: int) -> list[tuple]:
    """``(key, value, headers)`` of chunks ``[start, end)`` of ``stream``."""
    out = []
    for k in range(start, end):
        h = [(SEQ, str(k).encode())] + ([(KIND, stream["kind"].encode())] if stream["kind"] else [])
        out.append((stream["rid"].encode(), stream["chunks"][k], h))
    return out


async def produce(bs: str, topic: str, recs: list[tuple]) -> None:
    """Produce ``recs`` in order, each with the record timestamp ``TS_MS``."""
    p = AIOKafkaProducer(bootstrap_servers=bs, enable_idempotence=False)
    await p.start()
    try:
        for key, value, headers in recs:
            await p.send_and_wait(topic, value, key=key, headers=headers, timestamp_ms=TS_MS)
    finally:
        await p.stop()


def read_values(client, prefix: str, rid: str) -> dict[str, bytes]:
    """The raw values of a stream's keys (``SUFFIXES``; absent ones left out), read with ``client``
    (a sync ``redis.Redis``)."""
    key = f"{prefix}{{{rid}}}"
    out = {}
    for name, suf in SUFFIXES.items():
        v = client.get(key + suf)
        if v is not None:
            out[name] = bytes(v)
    return out


async def run_phase(bs: str, broker_kind: str, models, prefix: str, sts: list[dict], part: str,
                    names=None, timeout: float = 40.0) -> tuple[dict, list]:
    """Run one worker (Redis store at ``prefix``) over ``part`` (``first``: chunks ``[0, cut)``;
    ``rest``: ``[cut, n)``) of every stream; return ``({name: read_values}, replies)`` read
    once each stream's checkpoint holds its last seq of the part (``rest``: the tombstone)."""
    import redis

    from worker.state import RedisSettings
    from worker.transport.consumer import KafkaDerenderWorker
    from worker.transport.topics import ensure_topics

    n = names or _names()
    rs = RedisSettings(url=REDIS_URL, prefix=prefix, ttl_s=600)
    settings = _settings(bs, broker_kind, input_topic=n.inp, reply_topic=n.reply, dead_letter_topic=n.dlq,
                         group_id=n.group, redis=rs, commit_interval_ms=3_600_000,
                         stream_replay_window=4096, max_in_flight=512)
    recs, want = [], {}
    for s in sts:
        lo, hi = (0, s["cut"]) if part == "first" else (s["cut"], len(s["chunks"]))
        recs += records(s, lo, hi)
        want[s["name"]] = hi - 1
    sync = redis.Redis.from_url(REDIS_URL)
    out: dict = {}
    await ensure_topics(bs, {n.inp: 1, n.reply: 1, n.dlq: 1})
    async with KafkaDerenderWorker(settings, models) as w:
        await w.wait_assigned(30)
        await produce(bs, n.inp, recs)
        got = await _collect(bs, [n.reply, n.dlq], len(recs), timeout=timeout)
        deadline = time.monotonic() + timeout
        while len(out) < len(sts):
            for st in sts:
                vals = read_values(sync, prefix, st["rid"])
                ck = vals.get("checkpoint")
                if ck is not None and int(ck[:20]) == want[st["name"]]:
                    out[st["name"]] = vals
            if time.monotonic() > deadline:
                raise TimeoutError(f"streams {sorted(set(want) - set(out))}: no checkpoint at their last seq "
                                   f"({len(got[n.reply])} replies)")
            await asyncio.sleep(0.005)
    sync.close()
    return out, got[n.reply] + got[n.dlq]


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def main() -> None:
    """Write the golden blobs of the checked-out release to ``--out``."""
    from tokenizers import Tokenizer

    from worker.config import load_config_file
    from worker.transport.broker import bootstrap_for_tests

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default=str(MODELS), help="served models (default: %(default)s)")
    args = ap.parse_args()
    data = Path(__file__).resolve().parent.parent / "data"
    models = load_config_file(args.models)
    tok = Tokenizer.from_file(str(data / "tokenizers" / "qwen3" / "tokenizer.json"))
    sts = streams(tok)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    prefix = f"derender:golden:{uuid.uuid4().hex[:8]}:"
    with bootstrap_for_tests(with_kind=True) as (bs, kind):
        mid, _ = asyncio.run(run_phase(bs, kind, models, prefix, sts, "first"))
        end, _ = asyncio.run(run_phase(bs, kind, models, prefix, sts, "rest"))
    import redis
    sync = redis.Redis.from_url(REDIS_URL)
    keys = list(sync.scan_iter(match=prefix + "*"))
    if keys:
        sync.delete(*keys)
    for s in sts:
        for name, v in mid[s["name"]].items():
            (out / f"{s['name']}.mid.{name}").write_bytes(v)
        (out / f"{s['name']}.end.checkpoint").write_bytes(end[s["name"]]["checkpoint"])
    (out / "streams.json").write_text(json.dumps(
        [{"name": s["name"], "rid": s["rid"], "kind": s["kind"], "cut": s["cut"], "timestamp_ms": TS_MS,
          "chunks": [_b64(c) for c in s["chunks"]]} for s in sts], indent=1) + "\n")


def load_streams(path: Path) -> list[dict]:
    """``streams.json`` of a golden directory, chunk bodies decoded."""
    sts = json.loads(path.read_text())
    for s in sts:
        s["chunks"] = [base64.b64decode(c) for c in s["chunks"]]
    return sts


if __name__ == "__main__":
    main()
