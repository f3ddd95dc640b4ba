"""Hostile records for the chaos suite's fuzz scenario: malformed and mutated values, deep nesting,
out-of-range numbers, 10 MB values and bad headers, each one a ``BadRecord`` that must be answered
(error reply) or dead-lettered without harming the valid records around it.

Deterministic for a given seed (``random.Random``)."""
from __future__ import annotations

import json
import random
import uuid
from dataclasses import dataclass

from tests.chaos.harness import CORR, SEQ, corpus_bodies

MB = 1024 * 1024


@dataclass
class BadRecord:
    """One hostile record: ``id`` (also its correlation id unless ``what`` removes it), key, value,
    headers, ``rid``: the request id inside the value when one is readable, ``what``: its kind."""

    id: str
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]
    rid: bytes | None
    what: str


def _set_path(obj, path: list, value) -> bool:
    cur = obj
    for p in path[:-1]:
        if isinstance(cur, dict) and p in cur:
            cur = cur[p]
        elif isinstance(cur, list) and isinstance(p, int) and p < len(cur):
            cur = cur[p]
        else:
            return False
    if isinstance(cur, dict) or (isinstance(cur, list) and isinstance(path[-1], int) and path[-1] < len(cur)):
        cur[path[-1]] = value
        return True
    return False


_NUMBERS = [-1, -2**31, 2**31, 2**63, 2**64, 2**64 + 1, -2**63 - 1, 10**30, 1e308, -1e308, 0.5, 10**400]
_CHAT_PATHS = [["prompt_token_ids", 0], ["prompt_tokens"], ["generate_response", "choices", 0, "token_ids", 0],
               ["generate_response", "choices", 0, "index"], ["chat_request", "n"], ["chat_request", "max_tokens"],
               ["chat_request", "top_logprobs"], ["chat_request", "logprobs"],
               ["generate_response", "choices", 0, "logprobs"], ["generate_response", "choices", 0, "finish_reason"],
               ["model"], ["chat_request", "messages"], ["chat_request", "tools"], ["generate_response", "request_id"]]
_ODD_VALUES = [None, "", "x" * 100_000, [], {}, [[[[[]]]]], True, "\udcff".encode("utf-8", "surrogatepass").decode("latin-1")]
_REPLY_TOPICS = [b".", b"..", b"", b"__consumer_offsets", b"__transaction_state", b"a" * 250, b"bad topic",
                 b"\xff\xfe", b"a/b", b"x" * 10_000]


def _deep(depth: int, kind: str) -> bytes:
    if kind == "obj":
        return b'{"a":' * depth + b"1" + b"}" * depth
    return b"[" * depth + b"]" * depth


def make_bad(n: int, seed: int = 7, *, huge: int = 2, huge_bytes: int = 10 * MB, alt_topic: str = "") -> list[BadRecord]:
    """``n`` hostile records (``huge`` of them ``huge_bytes`` long), kinds in round robin."""
    rng = random.Random(seed)
    singles, streams = corpus_bodies()
    out: list[BadRecord] = []
    kinds = ["garbage", "empty", "scalar", "deep", "flip", "truncate", "number", "odd-field", "reply-topic",
             "seq-header", "kind-header", "no-ids", "stream-mutant", "big-corr", "alt-reply"]
    for i in range(n):
        bid = f"bad-{i}-{uuid.uuid4().hex[:6]}"
        what = kinds[i % len(kinds)]
        key: bytes | None = bid.encode()
        headers: list[tuple[str, bytes]] = [(CORR, bid.encode())]
        rid = None
        base = json.loads(json.dumps(rng.choice(singles)))
        if what == "garbage":
            value = rng.randbytes(rng.randint(1, 3000))
        elif what == "empty":
            value = rng.choice([None, b"", b"null", b"  "])
        elif what == "scalar":
            value = rng.choice([b"1", b'"x"', b"[]", b"[1,2]", b"true", b"1e999", b"-0", b"{}"])
        elif what == "deep":
            value = _deep(rng.choice([1000, 100_000]), rng.choice(["obj", "arr"]))
        elif what in ("flip", "truncate"):
            raw = bytearray(json.dumps(base).encode())
            if what == "flip":
                for _ in range(rng.randint(1, 8)):
                    raw[rng.randrange(len(raw))] = rng.randrange(256)
            else:
                del raw[rng.randrange(1, len(raw)):]
            value = bytes(raw)
        elif what in ("number", "odd-field"):
            paths = [p for p in _CHAT_PATHS if _set_path(json.loads(json.dumps(base)), p, 0)] or [["model"]]
            path = rng.choice(paths)
            _set_path(base, path, rng.choice(_NUMBERS) if what == "number" else rng.choice(_ODD_VALUES))
            value = json.dumps(base).encode()
            rid = _rid(base)
        elif what == "reply-topic":
            value = json.dumps(base).encode()
            headers.append(("reply-topic", rng.choice(_REPLY_TOPICS)))
        elif what == "seq-header":
            value = json.dumps(base).encode()
            headers.append((SEQ, rng.choice([b"18446744073709551616", b"9" * 1000, b"-1", b"1e3", b"",
                                             b"\xff", b"0x10", b"9223372036854775808", b" 1"])))
        elif what == "kind-header":
            value = json.dumps(base).encode()
            headers.append(("derender-kind", rng.choice([b"", b"\xff\xfe", b"x" * 5000, b"chat-stream", b"CHAT",
                                                         b"completion"])))
        elif what == "no-ids":
            value = json.dumps(base).encode() if rng.random() < 0.5 else rng.randbytes(50)
            headers = []
            key = rng.choice([None, bid.encode()])
            rid = _rid(base) if value.startswith(b"{") else None
        elif what == "stream-mutant":
            chunk = json.loads(json.dumps(rng.choice(rng.choice(streams))))
            chunk["generate_chunk"]["request_id"] = bid
            path = rng.choice([["generate_chunk", "choices", 0, "token_ids", 0], ["generate_chunk", "choices", 0, "index"],
                               ["prompt_token_ids", 0], ["generate_chunk", "usage"], ["model"]])
            _set_path(chunk, path, rng.choice(_NUMBERS + _ODD_VALUES[:5]))
            value = json.dumps(chunk).encode()
            headers = [(SEQ, rng.choice([b"0", b"0", b"1", b"3", b"18446744073709551615"]))]  # key = stream id
        elif what == "big-corr":
            value = json.dumps(base).encode()
            headers = [(CORR, bid.encode() + b"-" * rng.choice([10, 100_000])), ("x-junk", rng.randbytes(1000))]
        else:  # alt-reply: a legal reply topic elsewhere
            value = json.dumps(base).encode()
            headers.append(("reply-topic", alt_topic.encode()))
        out.append(BadRecord(bid, key, value, headers, rid.encode() if rid else None, what))
    for j in range(min(huge, n)):  # 10 MB values, with and without a reply-topic header
        r = out[(j * 7) % len(out)]
        r.value = (b'{"model": "qwen3", "x": "' + b"y" * huge_bytes + b'"}') if j % 2 else rng.randbytes(huge_bytes)
        r.headers = [(CORR, r.id.encode())] + ([("reply-topic", alt_topic.encode())] if j % 3 == 1 else [])
        r.key, r.what = r.id.encode(), f"huge-{len(r.value) // MB}MB"
    return out


def _rid(body: dict) -> str | None:
    gr = body.get("generate_response") if isinstance(body, dict) else None
    if isinstance(gr, dict) and isinstance(gr.get("request_id"), str):
        return gr["request_id"]
    grs = body.get("generate_responses") if isinstance(body, dict) else None
    if isinstance(grs, list) and grs and isinstance(grs[0], dict) and isinstance(grs[0].get("request_id"), str):
        return grs[0]["request_id"]
    return None
