"""Responses stream state in a real Redis (``worker.state.pieces``, issue 14): per chunk one
fenced write of the small checkpoint plus the chunk's piece bytes at the recorded offset; a
redelivered chunk (a worker killed after the write, or between derender and write) never
appends twice and gives byte-identical events; the pieces share the checkpoint's TTL and go
with it."""
from __future__ import annotations

import asyncio
import json
import os
import uuid

import msgspec
import pytest
import redis

from tests.harness.responses import BY_ID, MODELS
from tests.parity_tools import compare_responses as cmp
from tests.parity_tools import responses_to_requests as r2r
from worker.config import load_config_file
from worker.core.service import DerenderService
from worker.state import RedisSettings, RedisStateStore, StoreConnectError, StoreReadError
from worker.state.pieces import MemoryPieceStore, RedisPieceStore

pytestmark = [pytest.mark.redis]

REDIS_URL = os.environ.get("REDIS_URL") or os.environ.get("DERENDER_REDIS_URL") or "redis://127.0.0.1:6379/0"


@pytest.fixture
def prefix():
    p = f"derender:test:{uuid.uuid4().hex[:10]}:"
    try:
        redis.Redis.from_url(REDIS_URL, socket_timeout=2).ping()
    except redis.exceptions.ConnectionError as e:
        pytest.skip(f"no Redis answers at {REDIS_URL}: {e}")
    yield p
    c = redis.Redis.from_url(REDIS_URL)
    keys = list(c.scan_iter(match=p + "*"))
    if keys:
        c.delete(*keys)


def _run_stream(svc: DerenderService, bodies: list[dict], prefix: str, crash_at: dict[int, str]) -> list[list]:
    """Drive one stream through Redis as a transport would: load the checkpoint, derender with
    a reader over the stored pieces, commit state + pieces in one fenced write. ``crash_at``:
    chunk -> ``after-commit`` (the chunk is redelivered after its write: fenced off, the reply
    replayed) or ``before-commit`` (derendered, never written: redone from the old checkpoint)."""
    sync = redis.Redis.from_url(REDIS_URL)
    out: list[list] = []

    async def go():
        store = RedisStateStore.from_settings(RedisSettings(url=REDIS_URL, prefix=prefix, ttl_s=60))
        pieces = RedisPieceStore(store)
        rid = bodies[0]["generate_chunk"]["request_id"]
        key = pieces.pieces_key(rid)

        def reader(start: int, end: int) -> bytes:
            return bytes(sync.getrange(key, start, end - 1)) if end > start else b""

        k = 0
        while k < len(bodies):
            stored = await store.get(rid)
            res = svc.derender_responses_stream(msgspec.json.encode(bodies[k]), stored.state if stored else None,
                                                reader, seq=k)
            assert res.status == 200, res.body
            if crash_at.get(k) == "before-commit":
                del crash_at[k]
                continue  # killed: nothing written; the chunk comes again
            ok = await pieces.commit(rid, res.state, k, res.log_len - len(res.log_append), res.log_append)
            assert ok
            if crash_at.get(k) == "after-commit":
                del crash_at[k]
                again = await pieces.commit(rid, res.state, k, res.log_len - len(res.log_append), res.log_append)
                assert not again  # fenced off: the redelivered chunk's reply comes from the replay window
            assert await store.client.strlen(key) == res.log_len
            if res.log_len:  # no piece written yet: no key
                assert 0 < await store.client.pttl(key) <= 60_000
            out.append(json.loads(res.body))
            if res.done:
                assert await pieces.delete(rid, k)
                assert not await store.client.exists(store.key(rid), key)
            k += 1
        await store.close()

    asyncio.run(go())
    return out


@pytest.mark.parametrize("cid", ["qwen3-logprobs", "qwen3-coder-reasoning-text-call", "qwen3-text-incomplete"])
def test_stream_through_redis_pieces_with_crashes(prefix, cid):
    svc = DerenderService(load_config_file(str(MODELS)))
    case = BY_ID[cid]
    bodies = r2r.stream_bodies(case)
    for b in bodies:
        b["generate_chunk"]["request_id"] = f"{prefix}{cid}"
    clean = _run_stream(svc, bodies, prefix, {})
    n = len(bodies)
    crashed = _run_stream(svc, bodies, prefix + "x:", {n // 3: "before-commit", n // 2: "after-commit",
                                                       n - 1: "before-commit"})
    assert crashed == clean  # byte-identical events, nothing appended twice
    ns = json.loads(svc.derender(msgspec.json.encode(r2r.nonstream_body(case)), "responses").body)
    assert cmp.norm_response(clean[-1][-1]["response"]) == cmp.norm_response(ns)


def test_memory_piece_store_fencing():
    async def go():
        s = MemoryPieceStore()
        assert await s.commit("a", b"s0", 0, 0, b"abc")
        assert not await s.commit("a", b"s0", 0, 0, b"abc")  # same seq: fenced
        assert await s.commit("a", b"s1", 1, 3, b"de")
        assert await s.commit("a", b"s2", 2, 3, b"DE")  # a rewrite at the recorded offset
        assert await s.read("a", 0, 5) == b"abcDE"
        with pytest.raises(StoreReadError):
            await s.read("a", 0, 9)
        assert not await s.delete("a", 1) and await s.delete("a", 2)
        assert s.pieces == {} and s.checkpoints == {}
    asyncio.run(go())


def test_redis_piece_store_unreachable_is_typed():
    async def go():
        store = RedisStateStore.from_settings(RedisSettings(url="redis://127.0.0.1:1/0", timeout_s=0.5))
        with pytest.raises(StoreConnectError):
            await RedisPieceStore(store).commit("a", b"s", 0, 0, b"x")
        await store.close()
    asyncio.run(go())


_CORRUPT = {
    "not utf-8": lambda log: b"\xff" * len(log),
    "other bytes": lambda log: b"Z" * len(log),
    "zero bytes": lambda log: b"\0" * len(log),
    "empty records": lambda log: b"\n" * len(log),
    "records of no kind": lambda log: b"i{}\n" * (len(log) // 4) + b"\n" * (len(log) % 4),
    "short": lambda log: log[:-1],
}


@pytest.mark.parametrize("how", list(_CORRUPT))
@pytest.mark.parametrize("cid", ["qwen3-logprobs", "qwen3-coder-reasoning-text-call", "qwen3-text-incomplete"])
def test_corrupted_log_is_the_lost_409_never_a_500_or_an_empty_answer(cid, how):
    """A Responses stream's piece log overwritten in the store (garbage of the recorded length:
    no record tag, no record end, empty or undecodable records) or truncated: the chunk that
    reads it is the 409 "lost or expired", never an internal-error 500 and never a 200 that
    read the garbage as no records (an empty text / arguments / item list)."""
    svc = DerenderService(load_config_file(str(MODELS)))
    bodies = r2r.stream_bodies(BY_ID[cid])
    state, log, statuses = None, bytearray(), []
    for k, b in enumerate(bodies):
        bad = _CORRUPT[how](bytes(log))
        res = svc.derender_responses_stream(msgspec.json.encode(b), state, lambda a, z, bad=bad: bad[a:z], seq=k)
        statuses.append(res.status)
        if res.status != 200:
            err = json.loads(res.body)["error"]
            assert err["type"] == "ConflictError" and "lost or expired" in err["message"], err
            break
        log[res.log_len - len(res.log_append):] = res.log_append
        state = res.state
    assert statuses[-1] == 409 and set(statuses[:-1]) <= {200}, statuses


_LOG_LIES = {
    "log_len negative": lambda s: setattr(s, "log_len", -5),
    "log_len huge": lambda s: setattr(s, "log_len", 2**62),
    "pend_at past the log": lambda s: setattr(s, "pend_at", s.log_len + 1),
    "open item before the log": lambda s: setattr(s.open, "log_start", -7),
    "open item past the log": lambda s: setattr(s.open, "log_start", s.log_len + 9),
}


@pytest.mark.parametrize("lie", list(_LOG_LIES))
def test_a_state_lying_about_its_log_is_refused(lie):
    """A stored Responses state whose piece-log numbers lie (negative, past Redis's largest
    string, offsets outside the recorded length) is refused as unreadable (400) when decoded:
    not a 500 from ``len() < 0`` and never a read at those offsets."""
    from worker.core.responses.derender import decode_state, encode_state
    svc = DerenderService(load_config_file(str(MODELS)))
    bodies = r2r.stream_bodies(BY_ID["qwen3-logprobs"])
    rt = svc.runtime(bodies[0]["model"])
    state, log, k = None, bytearray(), 0
    while True:  # up to a chunk after which an item is open with some log behind it
        res = svc.derender_responses_stream(msgspec.json.encode(bodies[k]), state, lambda a, z: bytes(log[a:z]), seq=k)
        assert res.status == 200
        log[res.log_len - len(res.log_append):] = res.log_append
        state, k = res.state, k + 1
        st = decode_state(rt, state)
        if st.open is not None and st.log_len > 0:
            break
    _LOG_LIES[lie](st)
    res = svc.derender_responses_stream(msgspec.json.encode(bodies[k]), encode_state(st),
                                        lambda a, z: bytes(log[max(a, 0):max(z, 0)]), seq=k)
    assert res.status == 400, res.body
    assert "unreadable" in json.loads(res.body)["error"]["message"]
