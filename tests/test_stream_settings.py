"""Issue 13 item 4: a chat/completion stream's write-once settings (``StreamSettings``: request id,
model, created, request digest, the request's compact options and stop strings, the prompt seed)
are stored once, apart from the per-chunk state (``derender_stream(settings_aside=True)``), and
read back on later chunks from a per-process cache keyed by (request id, settings digest), else
from the store. The replies are the same bytes as with the settings inside the state; the
per-chunk state stays small with 64 KiB of stop strings; settings that are missing or not the
ones the state was written with are the 409 "lost or expired", never misread; the stores write
them once with the stream's first checkpoint (one fenced step) and delete them with it."""
from __future__ import annotations

import asyncio
import json

import msgspec
import pytest

from tests.harness.kafka import REDIS_URL
from tests.parity import service
from worker.core import stream as core_stream
from worker.core.service import SettingsCache
from worker.state import MemoryStateStore, RedisSettings, RedisStateStore, StateWrite

_TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
#: 1,024 stop strings of 64 characters: 64 KiB of stop text, none of which occurs in the output
_STOPS = [f"{i:04d}" + "~" * 60 for i in range(1024)]


def _bodies(rid: str = "st", stop: list[str] | None = None, prompt: list[int] | None = None) -> list[bytes]:
    """A qwen3 chat stream (reasoning, an answer, a hermes call), 2-token chunks."""
    tok = service().runtime("qwen3").tokenizer
    ids = tok.encode("<think>\nlet me see</think>\n\nSure, calling it.\n<tool_call>\n"
                     '{"name": "f", "arguments": {"a": 1}}\n</tool_call>') + [151645]
    out = []
    for i in range(0, len(ids), 2):
        last = i + 2 >= len(ids)
        b: dict = {"model": "qwen3", "stream": True, "generate_chunk": {"request_id": rid, "choices": [
            {"index": 0, "token_ids": ids[i:i + 2], "finish_reason": "stop" if last else None}]}}
        if i == 0:
            b["prompt_token_ids"] = prompt or [151644, 872, 198]
            b["chat_request"] = {"model": "qwen3", "messages": [{"role": "user", "content": "hi"}], "tools": _TOOLS,
                                 **({"stop": stop} if stop else {})}
        out.append(json.dumps(b).encode())
    return out


def _run(svc, bodies, *, aside: bool, settings_from=None, created: int = 7):
    """Stream ``bodies``; returns (reply bodies, per-chunk state sizes, stored settings bytes, needs).
    ``settings_from``: a service per chunk (a fresh one: every later chunk misses the cache)."""
    state, stored, replies, sizes, needs = None, b"", [], [], 0
    for b in bodies:
        s = settings_from() if settings_from else svc
        res, new = s.derender_stream(b, state, created=created, settings_aside=aside)
        if res.needs_settings:
            needs += 1
            assert res.body == b"" and new is None
            res, new = s.derender_stream(b, state, created=created, settings_aside=aside, settings=stored)
        assert res.status == 200, res.body
        if res.settings:
            assert not stored  # written once: the first chunk
            stored = res.settings
        state = new
        replies.append(res.body)
        sizes.append(len(state))
    return replies, sizes, stored, needs


def test_settings_aside_gives_the_same_replies_and_a_small_state():
    svc = service()
    for stop in (None, _STOPS):
        bodies = _bodies(stop=stop)
        inline, in_sizes, none, _ = _run(svc, bodies, aside=False)
        assert none == b""
        aside, sizes, stored, needs = _run(svc, bodies, aside=True)
        assert aside == inline and needs == 0  # the cache had them: no chunk asked
        assert stored and max(sizes) < max(in_sizes)
        if stop:
            assert max(in_sizes) > 64 * 1024  # the settings inside: every chunk rewrote 64 KiB
            assert max(sizes) <= 4096, max(sizes)
            _, first = svc.derender_stream(bodies[0], None, created=7, settings_aside=True)
            st = core_stream.decode_state(svc.runtime("qwen3"), first)
            assert st.settings is None and st.settings_digest == core_stream.settings_digest(stored)


def test_a_cache_miss_reads_the_stored_settings():
    bodies = _bodies(stop=_STOPS[:8])
    want, _, _, _ = _run(service(), bodies, aside=False)
    # a new service (another worker process) for every chunk: every later chunk misses its cache
    cfgs = [service().runtime("qwen3").config]
    from worker.core.service import DerenderService
    got, _, stored, needs = _run(None, bodies, aside=True, settings_from=lambda: DerenderService(cfgs))
    assert got == want and needs == len(bodies) - 1 and stored


def test_missing_or_foreign_settings_are_the_409_lost_or_expired():
    from worker.core.service import DerenderService
    cfgs = [service().runtime("qwen3").config]
    bodies = _bodies()
    first = DerenderService(cfgs)
    res, state = first.derender_stream(bodies[0], None, created=7, settings_aside=True)
    other = DerenderService(cfgs).derender_stream(_bodies(prompt=[151644, 198])[0], None, created=7,
                                                  settings_aside=True)[0].settings
    assert other and other != res.settings
    for given in (b"", other, res.settings[:-1]):
        r, new = DerenderService(cfgs).derender_stream(bodies[1], state, settings_aside=True, settings=given)
        assert r.status == 409 and new is None, r.body
        assert "lost or expired" in json.loads(r.body)["error"]["message"]
    r, _ = DerenderService(cfgs).derender_stream(bodies[1], state, settings_aside=True, settings=res.settings)
    assert r.status == 200, r.body


def test_a_stream_restarted_under_the_same_id_never_uses_the_stale_entry():
    """Same request id, same request bytes: another ``created`` (or prompt) gives other settings
    bytes, hence another cache key; each stream gets its own replies."""
    svc = service()
    bodies = _bodies(rid="again")
    a, _, sa, _ = _run(svc, bodies, aside=True, created=100)
    b, _, sb, _ = _run(svc, bodies, aside=True, created=200)
    assert sa != sb
    assert a == _run(service(), bodies, aside=False, created=100)[0]
    assert b == _run(service(), bodies, aside=False, created=200)[0]
    assert a != b and all(b'"created":200' in r for r in b if r != b"[]")


def test_a_previous_release_state_is_the_409():
    svc = service()
    bodies = _bodies()
    _, state = svc.derender_stream(bodies[0], None, settings_aside=True)
    arr = msgspec.msgpack.decode(state)
    arr[0] = core_stream.STATE_VERSION - 1
    res, _ = svc.derender_stream(bodies[1], msgspec.msgpack.encode(arr), settings_aside=True)
    assert res.status == 409 and "lost or expired" in json.loads(res.body)["error"]["message"]


def test_settings_cache_is_bounded():
    c = SettingsCache(entries=3, max_bytes=100)
    for i in range(5):
        c.put(f"r{i}", b"d", core_stream.StreamSettings(request_id=f"r{i}"), 10)
    assert len(c) == 3 and c.get("r0", b"d") is None and c.get("r4", b"d").request_id == "r4"
    c.put("big", b"d", core_stream.StreamSettings(), 60)
    c.put("big2", b"d", core_stream.StreamSettings(), 60)  # 120 bytes > 100: the older goes
    assert c.get("big", b"d") is None and c.get("big2", b"d") is not None
    c.put("huge", b"d", core_stream.StreamSettings(), 101)  # larger than the budget: not kept
    assert c.get("huge", b"d") is None
    assert c.get("r4", b"x") is None  # another digest: another key


async def _store_scenario(store, rid: str) -> list:
    """Settings written with the first checkpoint only, kept by later writes, not written by a
    fenced-off one, reported missing (code 2) when a put lands on an absent checkpoint without
    them, deleted with the checkpoint."""
    seen = [await store.commit_codes([StateWrite(rid, b"s0", 0, settings=b"SET", settings_kept=True)]),
            await store.read_settings(rid)]
    seen.append(await store.commit_codes([StateWrite(rid, b"s1", 1, settings_kept=True, touch=True),
                                          StateWrite(rid, b"s1b", 1, settings=b"OTHER", settings_kept=True)]))
    seen.append(await store.read_settings(rid))
    seen.append(await store.commit_codes([StateWrite(rid, None, 1)]))
    seen.append(await store.read_settings(rid))
    # the store lost the stream (checkpoint and settings): a put without them says so
    seen.append(await store.commit_codes([StateWrite(rid, b"s2", 2, settings_kept=True)]))
    seen.append(await store.commit_codes([StateWrite(rid, b"s3", 3, settings=b"SET", settings_kept=True),
                                          StateWrite(rid, None, 3)]))
    return seen


WANT = [[1], b"SET", [1, 0], b"SET", [1], None, [2], [1, 1]]


def test_memory_store_settings():
    assert asyncio.run(_store_scenario(MemoryStateStore(), "m")) == WANT


@pytest.mark.redis
def test_redis_store_settings_one_fenced_write(redis_prefix):
    async def go():
        store = RedisStateStore.from_settings(RedisSettings(url=REDIS_URL, prefix=redis_prefix, ttl_s=60))
        try:
            seen = await _store_scenario(store, "r")
            await store.commit([StateWrite("t", b"s0", 0, settings=b"SET", settings_kept=True)])
            ttl = await store.client.pttl(store.key("t"))
            sttl = await store.client.pttl(store.key("t") + ":settings")
            await store.commit([StateWrite("t", None, 0)])
            left = await store.client.exists(store.key("t") + ":settings")
            return seen, ttl, sttl, left
        finally:
            await store.close()

    seen, ttl, sttl, left = asyncio.run(go())
    assert seen == WANT
    assert 0 < ttl <= 60_000 < sttl <= 75_000  # a quarter longer: refreshed every quarter TTL, they outlive it
    assert left == 0


def test_the_transport_sends_its_held_settings_or_reads_them_on_a_pool_miss():
    """``streams.submit_chunk`` against pool "processes" that never share a cache (a new service
    per call): small settings go with every chunk (no miss), large ones (64 KiB of stop strings)
    only when the process asks (``needs_settings``: one more call); a new owner that does not hold
    them reads them from the store. Replies equal the one-value run."""
    from types import SimpleNamespace

    from worker.core.service import DerenderService
    from worker.transport.jobs import derender_stream_job
    from worker.transport.outage import OutageClock
    from worker.transport.stream_registry import LiveStream
    from worker.transport.streams import SETTINGS_SEND_MAX, submit_chunk

    cfgs = [service().runtime("qwen3").config]
    calls: list[bool] = []

    async def submit(value, state, seq, kind, created, pieces=None, settings=None):
        calls.append(settings is not None)
        return derender_stream_job(DerenderService(cfgs), value, state, seq, kind, created, pieces, settings)

    ctx = SimpleNamespace(submit=submit)
    outage = OutageClock("test store", "state-store", 0.0)

    async def go(bodies, owner_change_at: int):
        store = MemoryStateStore()
        s = LiveStream("st")
        replies = []
        for seq, b in enumerate(bodies):
            if seq == owner_change_at:  # a new owner: the checkpoint from the store, no settings held
                s = LiveStream("st", state=s.state, next_seq=seq)
            out = await submit_chunk(ctx, store, outage, s, SimpleNamespace(value=b, timestamp=7000), seq, None)
            assert out.status == 200, out.body
            if out.settings:
                s.settings = out.settings
                assert await store.commit([StateWrite("st", out.state, seq, settings=out.settings,
                                                      settings_kept=True)]) == [True]
            s.state = out.state
            replies.append(out.body)
        return replies, s

    for stop, big in ((None, False), (_STOPS, True)):
        bodies = _bodies(stop=stop)
        want = _run(service(), bodies, aside=False, created=7)[0]
        calls.clear()
        got, s = asyncio.run(go(bodies, owner_change_at=3))
        assert got == want
        assert (len(s.settings) > SETTINGS_SEND_MAX) == big
        # chunk 0: one call; later chunks: small settings ride along (one call each), large ones
        # are asked for (a miss, then the call with them); the new owner read them from the store
        want_calls = [False] + ([False, True] * (len(bodies) - 1) if big else
                                [True, True, False, True] + [True] * (len(bodies) - 4))
        assert calls == want_calls, calls


def test_a_store_that_lost_the_stream_gets_its_settings_again_with_the_next_write():
    """The owner keeps a stream in memory while the store loses everything (restart without
    persistence, FLUSHALL): its next checkpoint write lands on an absent key without the settings
    (sent once already), the store says so (code 2), and the write after carries them again, so
    a later owner can still continue the stream."""
    from types import SimpleNamespace

    from worker.transport.checkpoints import CheckpointWrite, CheckpointWriter
    from worker.transport.outage import OutageClock
    from worker.transport.stream_registry import LiveStream
    from worker.transport.streams import settings_write

    async def go():
        store = MemoryStateStore()
        done: list[int] = []
        writer = CheckpointWriter(store, OutageClock("test store", "state-store", 0.0),
                                  on_done=lambda st, off: done.append(off), on_abandon=lambda st, off: None,
                                  on_fatal=lambda e: None, stats=SimpleNamespace(state_writes=0))
        task = asyncio.create_task(writer.run())
        part = SimpleNamespace(failed=False)
        s = LiveStream("lost", settings=b"SETTINGS")
        sent = []
        for seq in range(4):
            if seq == 2:  # the store loses everything
                store.data.clear()
                store.settings.clear()
            sv, kept, touch = settings_write(store, s)
            sent.append(sv)
            s.pending_writes += 1
            writer.add(CheckpointWrite(part, "lost", seq, b"ck%d" % seq, [seq], s, touch=touch, settings=sv,
                                       settings_kept=kept))
            while len(done) <= seq:
                await asyncio.sleep(0.001)
        task.cancel()
        return sent, await store.read_settings("lost")

    sent, stored = asyncio.run(go())
    assert sent == [b"SETTINGS", b"", b"", b"SETTINGS"]
    assert stored == b"SETTINGS"
