"""Issue 23 item 1: stored-state formats (``worker.state.formats``) and keys of an unexpected type
or shape.

* the write-selection rule (``select_write``): auto writes a format the previous release reads
  (it advertises nothing), ``--state-format`` a newer one only while every advertised member
  reads it;
* a test-only format 7 (another checkpoint envelope e8f2be2 cannot decode, settings wrapped)
  registered beside format 6: stored values of both are read, the checkpoint writer writes the
  selected one, advertisements in a real Redis move the choice;
* real Redis: every key kind of another Redis type or a foreign value is that stream's
  ``UnreadableState`` / a fenced write's code 3 / a typed read error, never an error of the batch;
  through a real Kafka worker each such stream gets one 409 that ends it, and the worker goes on.
"""
from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from types import SimpleNamespace

import msgspec
import pytest
import redis
from redis.exceptions import ResponseError

from tests.harness.golden_state import v6_decoder, v6_read
from tests.harness.kafka import REDIS_URL, make_stream
from tests.harness.kafka import collect as _collect
from tests.harness.kafka import names as _names
from tests.harness.kafka import produce as _produce
from tests.harness.kafka import settings as _settings
from tests.harness.kafka import tokenizer as _tokenizer
from worker.state import (
    RedisSettings,
    RedisStateStore,
    StateWrite,
    StoredState,
    StoreReadError,
    UnreadableState,
    formats,
)
from worker.transport.checkpoints import (
    CheckpointWrite,
    CheckpointWriter,
    UnreadableCheckpoint,
    decode_stored,
)
from worker.transport.outage import OutageClock

GOLDEN = Path(__file__).resolve().parent / "data" / "golden_state" / "v6"
CHAT_MID = (GOLDEN / "chat.mid.checkpoint").read_bytes()
CHAT_SETTINGS = (GOLDEN / "chat.mid.settings").read_bytes()


# ------------------------------------------------------------------------ selection rule ---
def test_select_write_rules():
    sel = formats.select_write
    # this release: one format
    assert formats.FORMATS.keys() == {6} and formats.CURRENT == 6 and formats.PREVIOUS_READS == {6}
    assert sel(None, []) == 6 and sel(6, [frozenset({6})]) == 6
    r67 = frozenset({6, 7})
    # a release reading 6 and 7 whose predecessor reads 6: auto stays on 6 whatever is advertised
    assert sel(None, [], reads=r67) == 6
    assert sel(None, [r67, r67], reads=r67) == 6
    # --state-format 7 (the second roll): 7 while every advertised member reads it, else 6
    assert sel(7, [r67, r67], reads=r67) == 7
    assert sel(7, [r67, frozenset({6})], reads=r67) == 6
    assert sel(6, [r67], reads=r67) == 6
    # the next release (its predecessor reads 6 and 7): auto writes 7 unless a member reads only 6
    assert sel(None, [r67], reads=r67, previous_reads=r67) == 7
    assert sel(None, [r67, frozenset({6})], reads=r67, previous_reads=r67) == 6
    # a member reading none of ours: our oldest
    assert sel(None, [frozenset({9})], reads=r67, previous_reads=r67) == 6
    assert formats.parse_state_format("auto") is None and formats.parse_state_format(None) is None
    assert formats.parse_state_format("6") == 6
    for bad in ("7", "x", "-1"):
        with pytest.raises(ValueError):
            formats.parse_state_format(bad)


def test_state_format_flag_reaches_the_store():
    import argparse

    from worker.state import add_redis_args, settings_from_args
    ap = argparse.ArgumentParser()
    add_redis_args(ap)
    assert settings_from_args(ap.parse_args([])).state_format is None
    rs = settings_from_args(ap.parse_args(["--state-format", "6"]))
    assert rs.state_format == 6
    store = RedisStateStore.from_settings(rs)
    assert store.formats.requested == 6 and store.formats.write == 6
    with pytest.raises(ValueError):
        settings_from_args(ap.parse_args(["--state-format", "5"]))


# ------------------------------------------------------------- a test-only next format ---
def _ck7_out(cur: bytes) -> bytes:
    v, state, replies = msgspec.msgpack.decode(cur)
    assert v == 1
    return msgspec.msgpack.encode([2, {"state": state, "replies": replies}])


def _ck7_in(b: bytes) -> bytes:
    _, m = msgspec.msgpack.decode(b)
    return msgspec.msgpack.encode([1, m["state"], m["replies"]])


def _probe7(b: bytes) -> str | None:
    try:
        v = msgspec.msgpack.decode(b)
    except msgspec.DecodeError as e:
        return str(e)
    return None if isinstance(v, list) and len(v) == 2 and v[0] == 2 and isinstance(v[1], dict) else "not 7"


def _probe_settings7(b: bytes) -> str | None:
    try:
        v = msgspec.msgpack.decode(b)
    except msgspec.DecodeError as e:
        return str(e)
    return None if isinstance(v, list) and len(v) == 2 and v[0] == 7 else "not 7"


@pytest.fixture
def format7(monkeypatch):
    """Register format 7 beside 6 (this release's code still works in 6)."""
    f7 = formats.StateFormat(7, _probe7, _probe_settings7, checkpoint_in=_ck7_in, checkpoint_out=_ck7_out,
                             settings_in=lambda b: msgspec.msgpack.decode(b)[1],
                             settings_out=lambda b: msgspec.msgpack.encode([7, b]))
    monkeypatch.setitem(formats.FORMATS, 7, f7)
    return f7


def test_format7_values_are_read_and_converted(format7):
    cur = CHAT_MID[20:]
    v7 = formats.checkpoint_out(cur, 7)
    assert formats.probe_checkpoint(v7) == 7 and formats.probe_checkpoint(cur) == 6
    assert formats.checkpoint_in(v7) == cur
    assert decode_stored(v7) == decode_stored(cur)
    with pytest.raises(msgspec.ValidationError):  # what e8f2be2 would make of it: hence the selection rule
        v6_decoder.decode(v7)
    s7 = formats.settings_out(CHAT_SETTINGS, 7)
    assert s7 != CHAT_SETTINGS and formats.settings_in(s7) == CHAT_SETTINGS
    assert formats.settings_in(CHAT_SETTINGS) == CHAT_SETTINGS
    with pytest.raises(UnreadableCheckpoint, match="checkpoint version 3"):
        decode_stored(msgspec.msgpack.encode([3, None, []]))


async def _write_one(store, rid: str, seq: int) -> None:
    """One checkpoint (the golden chat one) and its settings through a ``CheckpointWriter``."""
    done: list[int] = []
    writer = CheckpointWriter(store, OutageClock("test store", "state-store", 0.0),
                              on_done=lambda st, off: done.append(off), on_abandon=lambda st, off: None,
                              on_fatal=lambda e: None, stats=SimpleNamespace(state_writes=0))
    task = asyncio.create_task(writer.run())
    writer.add(CheckpointWrite(SimpleNamespace(failed=False), rid, seq, CHAT_MID[20:], [seq], None,
                               settings=CHAT_SETTINGS, settings_kept=True))
    while not done:
        await asyncio.sleep(0.002)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


@pytest.mark.redis
def test_writes_follow_the_selection_and_the_advertisements(format7, redis_prefix):
    sync = redis.Redis.from_url(REDIS_URL)

    async def go():
        auto = RedisStateStore.from_settings(RedisSettings(url=REDIS_URL, prefix=redis_prefix))
        explicit = RedisStateStore.from_settings(RedisSettings(url=REDIS_URL, prefix=redis_prefix, state_format=7))
        try:
            # auto: the previous release (advertising nothing) reads 6 only
            assert await auto.formats.refresh(auto) == 6
            await _write_one(auto, "a", 0)
            # --state-format 7, but a live member reads 6 only (an older worker, or a rollback)
            now = int(time.time() * 1000)
            await explicit.advertise_formats("old-worker", frozenset({6}), 6, now + 30_000)
            await explicit.advertise_formats("gone-worker", frozenset({6}), 6, now - 1)  # expired
            assert await explicit.formats.refresh(explicit) == 6
            assert set(explicit.formats.members) == {"old-worker", auto.formats.member, explicit.formats.member}
            assert b"gone-worker" not in sync.hkeys(explicit.formats_key())  # expired: removed
            await _write_one(explicit, "b", 0)
            # the older member leaves: 7
            await explicit.withdraw_formats("old-worker")
            assert await explicit.formats.refresh(explicit) == 7
            await _write_one(explicit, "c", 0)
            got = await auto.get_many(["a", "b", "c"])
            # a worker of this release reads both formats back as the same checkpoint and settings
            for rid in "abc":
                assert decode_stored(got[rid].state) == decode_stored(CHAT_MID[20:])
                assert formats.settings_in(await auto.read_settings(rid)) == CHAT_SETTINGS
            return got
        finally:
            for st in (auto, explicit):
                await st.withdraw_formats(st.formats.member)
                await st.close()

    got = asyncio.run(go())
    key = f"{redis_prefix}{{%s}}"
    assert sync.get(key % "a") == b"%020d" % 0 + CHAT_MID[20:]  # format 6: e8f2be2's bytes
    v6_read(sync.get(key % "b"))
    assert sync.get((key % "b") + ":settings") == CHAT_SETTINGS
    assert formats.probe_checkpoint(got["c"].state) == 7  # format 7: e8f2be2 could not read it
    with pytest.raises(msgspec.ValidationError):
        v6_decoder.decode(got["c"].state)
    assert formats.settings_in(sync.get((key % "c") + ":settings")) == CHAT_SETTINGS != sync.get((key % "c") + ":settings")
    assert not sync.exists(redis_prefix + formats.FORMATS_KEY)  # every advertisement withdrawn


# ------------------------------------------------------ keys of an unexpected type or shape ---
def _bad_keys(sync, prefix: str) -> dict[str, str]:
    """Checkpoint keys of another type or shape (request id -> what); returns them."""
    k = f"{prefix}{{%s}}"
    sync.rpush(k % "list", b"x")
    sync.sadd(k % "set", b"x")
    sync.zadd(k % "zset", {b"x": 1})
    sync.hset(k % "hash-no-q", mapping={b"x": b"1"})
    sync.hset(k % "hash-bad-q", mapping={b"s": b"st", b"q": b"nope"})
    sync.set(k % "garbage", b"\x93\x01\xc0\x90 not digits")
    sync.set(k % "short", b"12")
    return {"list": "list", "set": "set", "zset": "zset", "hash-no-q": "hash", "hash-bad-q": "hash",
            "garbage": "seq digits", "short": "seq digits"}


@pytest.mark.redis
def test_store_keys_of_another_type_are_per_stream_and_never_raise(redis_prefix):
    sync = redis.Redis.from_url(REDIS_URL)
    bad = _bad_keys(sync, redis_prefix)
    k = f"{redis_prefix}{{%s}}"
    sync.hset(k % "legacy", mapping={b"s": b"old", b"q": b"4"})
    sync.rpush((k % "ok") + ":pieces", b"x")  # its pieces key is a list
    sync.hset((k % "ok2") + ":settings", mapping={b"x": b"1"})  # its settings key is a hash
    sync.set(redis_prefix + formats.FORMATS_KEY, b"a string")

    async def go():
        store = RedisStateStore.from_settings(RedisSettings(url=REDIS_URL, prefix=redis_prefix))
        try:
            assert await store.commit_codes([StateWrite("ok", b"s0", 0, 0, b"abc", touch=True),
                                             StateWrite("ok2", b"s0", 0, -1, b"", settings=b"SET", settings_kept=True)]
                                            ) == [1, 1]
            got = await store.get_many([*bad, "legacy", "ok", "absent"])
            for rid, what in bad.items():
                assert isinstance(got[rid], UnreadableState) and what in got[rid].reason, (rid, got[rid])
            assert got["legacy"] == StoredState(b"old", 4) and got["ok"] == StoredState(b"s0", 0)
            assert got["absent"] is None
            # fenced writes and deletes on them: code 3 (not written), the others in the same EVALSHA applied
            writes = [StateWrite(rid, b"new", 9) for rid in bad] + [StateWrite(rid, None, 9) for rid in bad]
            writes += [StateWrite("ok", b"s1", 1, 3, b"de"), StateWrite("legacy", b"s5", 5)]
            assert await store.commit_codes(writes) == [3] * (2 * len(bad)) + [1, 1]
            with pytest.raises(StoreReadError):  # its pieces: a list (typed: the stream's 409 "lost")
                await store.read_pieces("ok", 0, 5)
            assert await store.read_settings("ok2") == b"SET"  # (the first write replaced the hash)
            sync.delete((k % "ok2") + ":settings")
            sync.hset((k % "ok2") + ":settings", mapping={b"x": b"1"})
            with pytest.raises(StoreReadError):
                await store.read_settings("ok2")
            with pytest.raises(ResponseError):  # the advertisements key of another type: the selector keeps its choice
                await store.formats.refresh(store)
            assert store.formats.write == 6
            assert (await store.get_many(["ok", "legacy"])) == {"ok": StoredState(b"s1", 1),
                                                                "legacy": StoredState(b"s5", 5)}
        finally:
            await store.close()

    asyncio.run(go())
    for rid in bad:  # left as they were (their TTL, or an operator, removes them)
        assert sync.exists(k % rid)


@pytest.mark.kafka
@pytest.mark.redis
def test_unreadable_stored_state_is_one_409_and_the_worker_goes_on(kafka_bootstrap, kafka_broker_kind,
                                                                  qwen3_models, redis_prefix):
    """Streams met at chunk 3 whose checkpoint key is of another type, a foreign value or another
    release's version: each gets one 409 that ends it ("unreadable type or version"), its later
    chunks the ended-stream 409; a golden stream whose settings key is a hash, one whose pieces
    key is a list: the same 409 naming that key; a stored seq beyond ``SEQ_MAX``: the same 409
    (not every chunk skipped as answered); a state of the right versions with damaged bytes: the
    core's one 400 "unreadable" that ends it. A stream after them on the same partition is
    answered in full, the worker never stops."""
    from tests.harness.golden_state import load_streams
    from worker.transport.consumer import KafkaDerenderWorker
    from worker.transport.topics import ensure_topics
    sync = redis.Redis.from_url(REDIS_URL)
    bad = _bad_keys(sync, redis_prefix)
    k = f"{redis_prefix}{{%s}}"
    v3 = msgspec.msgpack.encode([1, msgspec.msgpack.encode([3, None, b"", None, {}, 0, False, 0]), []])
    sync.set(k % "v3", b"%020d" % 2 + v3)
    bad["v3"] = "state version 3"
    sync.set(k % "envelope2", b"%020d" % 2 + msgspec.msgpack.encode([2, {"state": None}]))
    bad["envelope2"] = "checkpoint version 2"
    # a seq beyond SEQ_MAX (2**63 - 2): no chunk can be newer, so without the bound every chunk
    # would be skipped as an answered duplicate (no reply at all)
    sync.set(k % "hugeseq", b"9" * 20 + CHAT_MID[20:])  # (a readable checkpoint)
    bad["hugeseq"] = "beyond"
    sync.set(k % "hugeseq-garbage", b"9" * 20 + b"garbage")
    bad["hugeseq-garbage"] = "beyond"
    # the right versions around a damaged state (the probe passes: the core's decode refuses it)
    sync.set(k % "state6-garbage", b"%020d" % 2 + msgspec.msgpack.encode([1, msgspec.msgpack.encode([6, "x"]), []]))
    sync.set(k % "responses-garbage", b"%020d" % 2 + msgspec.msgpack.encode([1, b"\xc1RSP2" + msgspec.msgpack.encode([1, 2]), []]))
    damaged = ["state6-garbage", "responses-garbage"]
    golden = {s["name"]: s for s in load_streams(GOLDEN / "streams.json")}
    for name, kind in (("chat", "settings"), ("bigcall", "pieces")):
        g = golden[name]
        sync.set(k % g["rid"], (GOLDEN / f"{name}.mid.checkpoint").read_bytes(), px=600_000)
        other = "pieces" if kind == "settings" else "settings"
        if (GOLDEN / f"{name}.mid.{other}").exists():
            sync.set((k % g["rid"]) + f":{other}", (GOLDEN / f"{name}.mid.{other}").read_bytes(), px=600_000)
        sync.rpush((k % g["rid"]) + f":{kind}", b"x")
    tok = _tokenizer(qwen3_models)
    recs = []
    for rid in [*bad, *damaged]:
        _, chunks = make_stream(tok, rid, 1)
        recs += [(rid.encode(), chunks[seq], [("derender-seq", str(seq).encode())]) for seq in (3, 4)]
    for name in ("chat", "bigcall"):
        g = golden[name]
        recs += [(g["rid"].encode(), g["chunks"][seq], [("derender-seq", str(seq).encode())])
                 for seq in range(g["cut"], len(g["chunks"]))]
    _, good = make_stream(tok, "after", 2)
    recs += [(b"after", c, [("derender-seq", str(seq).encode())]) for seq, c in enumerate(good)]
    n = _names()
    settings = _settings(kafka_bootstrap, kafka_broker_kind, input_topic=n.inp, reply_topic=n.reply,
                         dead_letter_topic=n.dlq, group_id=n.group,
                         redis=RedisSettings(url=REDIS_URL, prefix=redis_prefix, ttl_s=120))

    async def go():
        await ensure_topics(kafka_bootstrap, {n.inp: 1, n.reply: 1, n.dlq: 1})
        async with KafkaDerenderWorker(settings, qwen3_models) as w:
            await w.wait_assigned(30)
            await _produce(kafka_bootstrap, n.inp, recs)
            got = await _collect(kafka_bootstrap, [n.reply, n.dlq], len(recs), timeout=120, settle=0.5)
            assert w.stats.crashes == 0
            adv = sync.hgetall(redis_prefix + formats.FORMATS_KEY)  # the running worker advertises
            assert len(adv) == 1 and list(adv.values())[0].split(b" ")[1:] == [b"6", b"6"], adv
        assert not sync.exists(redis_prefix + formats.FORMATS_KEY)  # withdrawn at its stop
        return got

    got = asyncio.run(go())
    assert not got[n.dlq]
    by: dict[str, list] = {}
    for r in got[n.reply]:
        by.setdefault(r.key.decode(), []).append(r)
    assert len(got[n.reply]) == len(recs)
    for rid, what in bad.items():
        first, second = by[rid]
        h1, h2 = dict(first.headers), dict(second.headers)
        assert (h1["derender-seq"], h1["derender-status"], h1["derender-stream-end"]) == (b"3", b"409", b"1")
        body = json.loads(first.value)["error"]["message"]
        assert "unreadable type or version" in body and what in body and "another release" in body, body
        assert (h2["derender-status"], h2["derender-stream-end"]) == (b"409", b"1")
        assert b"already ended" in second.value
    for rid in damaged:  # the core's 400 "unreadable" (its bytes, not the store's shape), ending the stream
        first, second = by[rid]
        h1, h2 = dict(first.headers), dict(second.headers)
        assert (h1["derender-seq"], h1["derender-status"], h1["derender-stream-end"]) == (b"3", b"400", b"1")
        assert b"stream state is unreadable" in first.value, first.value
        assert (h2["derender-status"], h2["derender-stream-end"]) == (b"409", b"1") and b"already ended" in second.value
    for name, kind in (("chat", "settings"), ("bigcall", "pieces")):
        rs = by[golden[name]["rid"]]
        ends = [r for r in rs if dict(r.headers)["derender-status"] != b"200"]
        assert ends and dict(ends[0].headers)["derender-status"] == b"409", (name, [r.value[:200] for r in rs[-3:]])
        body = json.loads(ends[0].value)["error"]["message"]
        assert f"its {kind} key holds another Redis type" in body and "unreadable type or version" in body, body
        assert all(b"already ended" in r.value for r in ends[1:])
    after = by["after"]
    assert [dict(r.headers)["derender-status"] for r in after] == [b"200"] * len(good)
    assert dict(after[-1].headers)["derender-stream-end"] == b"1"


@pytest.mark.redis
def test_the_advertiser_outlives_refresh_failures_and_withdraws(redis_prefix, monkeypatch):
    """``FormatSelector.run``: a refresh that fails (the advertisements key of another type) is
    logged and retried, the choice kept; cancelled, it withdraws its advertisement."""
    monkeypatch.setattr(formats, "ADVERTISE_EVERY_S", 0.01)
    sync = redis.Redis.from_url(REDIS_URL)
    key = redis_prefix + formats.FORMATS_KEY

    async def go():
        store = RedisStateStore.from_settings(RedisSettings(url=REDIS_URL, prefix=redis_prefix))
        tasks: set = set()
        try:
            sync.set(key, b"not a hash")
            formats.start_advertising(store, tasks)
            await asyncio.sleep(0.1)
            assert len(tasks) == 1 and not next(iter(tasks)).done() and store.formats.write == 6
            sync.delete(key)
            for _ in range(200):
                if sync.hexists(key, store.formats.member):
                    break
                await asyncio.sleep(0.01)
            assert sync.hexists(key, store.formats.member)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            assert not sync.exists(key)
        finally:
            await store.close()

    asyncio.run(go())


@pytest.mark.redis
def test_a_huge_advertisements_hash_is_read_only_up_to_its_bound(monkeypatch):
    """An advertisements hash of many more fields than ``ADVERTISED_MAX`` (a foreign writer, or
    members that never expire): a refresh reads about the bound (``HSCAN``), not the whole hash
    (``HGETALL`` of a million fields: GBs into every worker and its event loop blocked, every
    ``ADVERTISE_EVERY_S``). Measured in bytes Redis sent (``total_net_output_bytes`` of a
    private redis-server); the choice stays format 6."""
    from worker.bench.redis_burst import PrivateRedis
    from worker.state import redis_store
    monkeypatch.setattr(redis_store, "ADVERTISED_MAX", 100)
    far = int(time.time() * 1000) + 10 ** 9
    with PrivateRedis() as red:
        sync = redis.Redis.from_url(red.url)
        key = "p:" + formats.FORMATS_KEY
        for i in range(0, 20_000, 1000):
            sync.hset(key, mapping={f"member-{j:06d}".encode(): b"%d 6 6" % far for j in range(i, i + 1000)})
        whole = sum(len(f) + len(v) for f, v in sync.hgetall(key).items())

        async def go():
            store = RedisStateStore.from_settings(RedisSettings(url=red.url, prefix="p:"))
            try:
                await store.ping()
                before = sync.info("stats")["total_net_output_bytes"]
                got = await store.advertised_formats(int(time.time() * 1000))
                sent = sync.info("stats")["total_net_output_bytes"] - before
                assert await store.formats.refresh(store) == 6
                return got, sent
            finally:
                await store.close()

        got, sent = asyncio.run(go())
    assert 0 < len(got) <= 100 and all(r == frozenset({6}) for r in got.values())
    assert sent < whole / 4, (sent, whole)
