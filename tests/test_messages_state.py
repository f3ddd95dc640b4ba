"""Anthropic Messages stream state (issue 26): versioned from birth (golden blob of version 1),
small and flat per chunk, the piece log append-only and replay-safe, another version or a
corrupted state refused, the packed single-value form."""
from __future__ import annotations

import json

import msgspec
import pytest

from tests.harness.messages import BY_ID, GOLDEN_AT, GOLDEN_CASE, GOLDEN_DIR, MODELS, golden_bytes
from tests.parity_tools import compare_messages as cmp
from tests.parity_tools import messages_to_requests as m2r
from worker.config import load_config_file
from worker.core.messages import service as ms
from worker.core.messages.derender import STATE_VERSION
from worker.core.responses import memory_reader
from worker.core.service import DerenderService


@pytest.fixture(scope="module")
def service() -> DerenderService:
    return DerenderService(load_config_file(str(MODELS)))


def _rest(service, bodies, state, log) -> list[dict]:
    out = []
    for b in bodies:
        res = service.derender_messages_stream(msgspec.json.encode(b), state, memory_reader(log))
        assert res.status == 200, res.body
        state, log = res.state, log + res.log_append
        out.extend(json.loads(res.body))
    assert res.done
    return out


@pytest.mark.parametrize("name", ["v1", "v1-d022ecd", "v1-638fca1"])
def test_golden_state_v1_is_read_and_continued(service, name):
    """This release reads the version-1 golden state and log (``v1``: written by this release;
    ``v1-d022ecd``: by the build before ``StackState``'s trailing ``lead_ws`` / ``text_seen``;
    ``v1-638fca1``: by release 638fca1, before ``ws_carried``)
    and finishes the stream exactly as the reference; it still writes ``v1``'s exact bytes (a
    layout change needs a new version)."""
    state = (GOLDEN_DIR / f"{name}.state").read_bytes()
    log = (GOLDEN_DIR / f"{name}.pieces").read_bytes()
    assert msgspec.msgpack.decode(state)[0] == STATE_VERSION == 1
    if name == "v1":
        assert golden_bytes(service) == (state, log)
    case = BY_ID[GOLDEN_CASE]
    bodies = m2r.stream_bodies(case)
    head = []
    st, lg = None, b""
    for b in bodies[:GOLDEN_AT + 1]:
        res = service.derender_messages_stream(msgspec.json.encode(b), st, memory_reader(lg))
        st, lg = res.state, lg + res.log_append
        head.extend(json.loads(res.body))
    events = head + _rest(service, bodies[GOLDEN_AT + 1:], state, log)
    want = [e["data"] for e in case["expected"]["stream"]]
    assert cmp.norm_events(events) == want


def test_other_version_and_garbage_refused(service):
    """A state of another version, or bytes that are not a Messages state: 400, never misread."""
    case = BY_ID["qwen3-plain"]
    bodies = m2r.stream_bodies(case)
    res = service.derender_messages_stream(msgspec.json.encode(bodies[0]), None, memory_reader(b""))
    parts = msgspec.msgpack.decode(res.state)
    parts[0] = STATE_VERSION + 1
    bad = service.derender_messages_stream(msgspec.json.encode(bodies[1]), msgspec.msgpack.encode(parts),
                                           memory_reader(res.log_append))
    assert bad.status == 400 and "version" in json.loads(bad.body)["error"]["message"]
    for junk in (b"\x00", b"\xc1RSP2xx", msgspec.msgpack.encode([1, b"nope"])):
        bad = service.derender_messages_stream(msgspec.json.encode(bodies[1]), junk, memory_reader(b""))
        assert bad.status == 400, junk


def test_state_small_and_flat_log_append_only(service):
    """A 1,500-token stream in 1-token chunks: the state stays under 1 kB and does not grow;
    what grows goes to the piece log, appended only."""
    case = BY_ID["qwen3-plain"]
    b0 = m2r.stream_bodies(case)[0]
    ids = [t for b in m2r.stream_bodies(case) for t in b["generate_chunk"]["choices"][0]["token_ids"]][:-1]
    state, log, sizes = None, bytearray(), []
    for n in range(1500):
        b = json.loads(json.dumps(b0))
        b["generate_chunk"]["choices"][0]["token_ids"] = [ids[n % len(ids)]]
        if n:
            b.pop("messages_request")
        res = service.derender_messages_stream(msgspec.json.encode(b), state, memory_reader(log))
        assert res.status == 200
        assert res.log_len == len(log) + len(res.log_append)
        state, log = res.state, log + res.log_append
        sizes.append(len(state))
    assert max(sizes) < 1024 and sizes[-1] <= sizes[50] + 16, (sizes[50], sizes[-1])
    assert len(log) > 10_000


def test_replayed_chunk_is_byte_identical(service):
    """A chunk derendered twice from the same stored state and log (a redelivery after a crash,
    the log's append maybe already written) gives the same reply and state bytes."""
    bodies = m2r.stream_bodies(BY_ID["qwen3-thinking-tool-use"])
    state, log = None, b""
    for b in bodies:
        raw = msgspec.json.encode(b)
        one = service.derender_messages_stream(raw, state, memory_reader(log))
        two = service.derender_messages_stream(raw, state, memory_reader(log + one.log_append))
        assert (one.body, one.state, one.log_append) == (two.body, two.state, two.log_append)
        state, log = one.state, log + one.log_append


def test_packed_single_value_and_lost_log(service):
    """The packed form (state + log in one value) gives the same events; a log shorter than the
    state records is the 409 "lost"."""
    bodies = m2r.stream_bodies(BY_ID["llama3-tool-use-parallel"])
    packed, a = None, []
    for b in bodies:
        res, packed = ms.derender_stream_packed(service.runtime, msgspec.json.encode(b), packed)
        assert res.status == 200
        a.extend(json.loads(res.body))
    assert a == _rest(service, bodies, None, b"")
    state, log = None, b""
    for b in bodies[:-1]:
        res = service.derender_messages_stream(msgspec.json.encode(b), state, memory_reader(log))
        state, log = res.state, log + res.log_append
    lost = service.derender_messages_stream(msgspec.json.encode(bodies[-1]), state, memory_reader(log[:-3]))
    assert lost.status == 409 and json.loads(lost.body)["type"] == "error"
    need = service.derender_messages_stream(msgspec.json.encode(bodies[-1]), state, None)
    assert need.needs_pieces == (0, len(log))
