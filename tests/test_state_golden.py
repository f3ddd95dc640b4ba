"""Issue 23 item 1: the stream state of release e8f2be2 (state format 6, ``tests/data/golden_state/v6``,
written by a real Kafka worker of that release) is read by this one, both ways:

* every golden value is probed as format 6, decodes (checkpoint, tombstone, chat/completion state
  and settings, Responses state) and keeps the v6 field layout (a frozen copy of e8f2be2's
  ``Checkpoint`` / ``ReplayEntry`` below, state and settings versions);
* a worker of this release (real broker, real Redis) given the golden mid-stream keys continues
  each stream: its replies equal the in-process core's bytes of an uninterrupted run, and the
  tombstone it writes is byte-identical to the one e8f2be2 wrote;
* the keys it writes for the first half of each stream (the format it selects while e8f2be2 may
  be in the group) are byte-identical to e8f2be2's, so e8f2be2 reads them.
"""
from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import msgspec
import pytest
import redis

from tests.harness.golden_state import TS_MS, load_streams, run_phase, v6_read
from tests.harness.kafka import REDIS_URL
from worker.core.service import DerenderService
from worker.state import formats
from worker.transport.checkpoints import decode_stored
from worker.transport.jobs import derender_stream_job

GOLDEN = Path(__file__).resolve().parent / "data" / "golden_state" / "v6"
STREAMS = load_streams(GOLDEN / "streams.json")


def _files(name: str) -> dict[str, bytes]:
    return {p.name.split(".", 1)[1]: p.read_bytes() for p in GOLDEN.glob(f"{name}.*")}


@pytest.mark.parametrize("s", STREAMS, ids=[s["name"] for s in STREAMS])
def test_golden_values_are_format_6_and_decode(s):
    files = _files(s["name"])
    mid, end = files["mid.checkpoint"], files["end.checkpoint"]
    for value, seq in ((mid, s["cut"] - 1), (end, len(s["chunks"]) - 1)):
        assert int(value[:20]) == seq
        assert formats.probe_checkpoint(value[20:]) == 6
        ck = decode_stored(value[20:])
        assert ck == decode_stored(formats.checkpoint_in(value[20:]))
        old = v6_read(value)
        assert [(e.seq, e.status, e.value) for e in ck.replies] == [(e.seq, e.status, e.value) for e in old.replies]
        assert [e.seq for e in ck.replies] == list(range(seq + 1))
    assert decode_stored(mid[20:]).state is not None and decode_stored(end[20:]).state is None  # a tombstone
    if s["name"] != "responses":
        assert msgspec.msgpack.decode(files["mid.settings"])[0] == 6
        assert formats.settings_in(files["mid.settings"]) == files["mid.settings"]
    assert ("mid.pieces" in files) == (s["name"] in ("bigcall", "responses"))


def _uninterrupted(s) -> list[bytes]:
    """Reply bodies of the whole stream through the in-process core (the pool job the worker runs)."""
    from worker.config import load_config_file
    svc = DerenderService(load_config_file(str(GOLDEN.parent.parent / "models.json")))
    state, settings, pieces, out_bodies = None, None, bytearray(), []
    for seq, body in enumerate(s["chunks"]):
        give = None
        for _ in range(3):
            out = derender_stream_job(svc, body, state, seq, s["kind"], TS_MS // 1000, give, settings)
            if out.needs_pieces is not None:
                a, b = out.needs_pieces
                give = (a, bytes(pieces[a:b]))
            elif not out.needs_settings:
                break
        assert out.needs_pieces is None and not out.needs_settings
        if out.settings:
            settings = out.settings
        if out.pieces_len:
            at = out.pieces_len - len(out.append)
            pieces[at:] = out.append
        state = out.state
        out_bodies.append(out.body)
    return out_bodies


@pytest.mark.kafka
@pytest.mark.redis
def test_this_release_continues_golden_streams_and_writes_their_bytes(kafka_bootstrap, kafka_broker_kind,
                                                                      qwen3_models, redis_prefix):
    """Continue: the golden mid-stream keys under a fresh prefix, a worker of this release
    answers the second half of every stream; replies = the uninterrupted run's, tombstones = the
    golden ones. Write: a worker of this release answers the first half of every stream under
    another prefix; the keys it wrote are the golden bytes (e8f2be2's layout, hence readable by it)."""
    sync = redis.Redis.from_url(REDIS_URL)
    for s in STREAMS:
        key = f"{redis_prefix}{{{s['rid']}}}"
        for name, value in _files(s["name"]).items():
            if name.startswith("mid."):
                suffix = {"checkpoint": "", "settings": ":settings", "pieces": ":pieces"}[name[4:]]
                sync.set(key + suffix, value, px=600_000)
    end, replies = asyncio.run(run_phase(kafka_bootstrap, kafka_broker_kind, qwen3_models, redis_prefix, STREAMS,
                                         "rest"))
    by_key: dict[bytes, dict[int, bytes]] = {}
    for r in replies:
        h = dict(r.headers)
        by_key.setdefault(r.key, {})[int(h["derender-seq"])] = r.value
    for s in STREAMS:
        want = _uninterrupted(s)
        got = by_key[s["rid"].encode()]
        assert sorted(got) == list(range(s["cut"], len(s["chunks"]))), s["name"]
        for seq in got:
            assert got[seq] == want[seq], (s["name"], seq, got[seq][:200], want[seq][:200])
        assert end[s["name"]]["checkpoint"] == _files(s["name"])["end.checkpoint"], s["name"]
        v6_read(end[s["name"]]["checkpoint"])

    other = redis_prefix + uuid.uuid4().hex[:6] + ":"
    try:
        mid, _ = asyncio.run(run_phase(kafka_bootstrap, kafka_broker_kind, qwen3_models, other, STREAMS, "first"))
    finally:
        keys = list(sync.scan_iter(match=other + "*"))
        if keys:
            sync.delete(*keys)
    for s in STREAMS:
        files = _files(s["name"])
        for name, value in mid[s["name"]].items():
            assert value == files[f"mid.{name}"], (s["name"], name)
            if name == "checkpoint":
                v6_read(value)
        assert set(mid[s["name"]]) == {n[4:] for n in files if n.startswith("mid.")}
