"""The non-streaming Responses and Messages views built without the stream's machinery (issue 25
item 2): a quiet event builder over a ``MemoryLog`` gives the same Response as a loud one over
the persisted ``PieceLog`` (JSON records), and ``messages.events.message_of`` of its items the
same Message as the SDK-style accumulation of the translated events. Random parser deltas (text
with multi-byte characters, calls, content breaks, logprob entries with spills), fed in random
steps, and every chunking a stream may take. The reference corpora's end-to-end two views are in
tests/test_responses.py and tests/test_messages.py."""
from __future__ import annotations

import random

import msgspec
import pytest

from schemas.responses import ResponseLogprob, ResponseLogprobTop, ResponsesRequest
from tests.harness.messages import MODELS
from worker.config import load_config_file
from worker.core.messages.events import Outcome, accumulate, message_of, translate
from worker.core.responses.echo import response_head
from worker.core.responses.events import EventBuilder, ResponsesStreamState
from worker.core.responses.log import MemoryLog, PieceLog, memory_reader
from worker.core.service import DerenderService
from worker.parsers.base import Delta, ToolCallDelta

_TEXT = ["a", " the", "天气", "🌤️", "\n", "\"", "\\", "{\"city\": ", "\"Pa", "ris\"}", "  ", "é"]


@pytest.fixture(scope="module")
def rt():
    svc = DerenderService(load_config_file(str(MODELS)))
    return svc.runtime(next(iter(svc.models)))


def _state(rt, want_lp: bool) -> ResponsesStreamState:
    head = response_head(rt, ResponsesRequest(), response_id="req-1", model="m", created_at=0)
    return ResponsesStreamState(request_id="req-1", model="m", head=head, want_lp=want_lp, top_logprobs=2,
                                prompt_tokens=7)


def _text(rng: random.Random) -> str:
    return "".join(rng.choice(_TEXT) for _ in range(rng.randint(1, 4)))


def _entry(rng: random.Random) -> ResponseLogprob:
    lp = -rng.random() * 9
    return ResponseLogprob(token=_text(rng), bytes=[rng.randrange(256)], logprob=lp,
                           top_logprobs=[ResponseLogprobTop(token=_text(rng), bytes=[], logprob=lp - 1)])


def _deltas(rng: random.Random, want_lp: bool) -> list[tuple[Delta, list | None]]:
    """A random output as parser steps: reasoning, content (with breaks), call fragments (a named
    first fragment, argument pieces, a call with none), steps with logprob entries only."""
    out = []
    calls = 0
    for _ in range(rng.randint(0, 14)):
        d = Delta()
        r = rng.random()
        if r < 0.25:
            d.reasoning = _text(rng)
        elif r < 0.55:
            d.content = _text(rng)
            if rng.random() < 0.2 and len(d.content) > 1:
                d.content_break = rng.randint(1, len(d.content) - 1)
        elif r < 0.8:
            if calls == 0 or rng.random() < 0.3:
                d.tool_calls.append(ToolCallDelta(index=calls, name=rng.choice(["f", "get_weather"])))
                calls += 1
            if rng.random() < 0.8:
                d.tool_calls.append(ToolCallDelta(index=calls - 1, arguments=_text(rng)))
        n = rng.randint(0, 7) if want_lp else 0
        out.append((d, [_entry(rng) for _ in range(n)] if want_lp else None))
    return out


def _loud(rt, steps, want_lp: bool, sizes: list[int], finish: str):
    """The stream: steps in chunks of ``sizes``, state and log persisted between chunks."""
    st = _state(rt, want_lp)
    store = bytearray()
    events: list = []
    at = 0
    resp = None
    for k, n in enumerate(sizes):
        log = PieceLog(memory_reader(store), len(store))
        st = msgspec.msgpack.decode(msgspec.msgpack.encode(st), type=ResponsesStreamState)
        b = EventBuilder(st, log)
        if k == 0:
            b.start()
        for d, e in steps[at:at + n]:
            b.feed(msgspec.structs.replace(d, tool_calls=list(d.tool_calls)), e)
        at += n
        if k == len(sizes) - 1:
            resp = b.finish(finish)
        events += b.events
        store += log.new
    return resp, events, st


def _sizes(n: int, rng: random.Random) -> list[int]:
    out = []
    while n > 0:
        k = min(n, rng.randint(1, 4))
        out.append(k)
        n -= k
    return out or [0]


@pytest.mark.parametrize("seed", range(60))
def test_quiet_memory_view_equals_the_stream(rt, seed):
    rng = random.Random(seed)
    want_lp = seed % 2 == 0
    steps = _deltas(rng, want_lp)
    finish = "length" if seed % 5 == 0 else "stop"
    st = _state(rt, want_lp)
    b = EventBuilder(st, MemoryLog(), quiet=True)
    b.start()
    for d, e in steps:
        b.feed(msgspec.structs.replace(d, tool_calls=list(d.tool_calls)), e)
    quiet = b.finish(finish)
    assert b.events == []
    outcome = Outcome(finish_reason=finish, tool_use=st.n_calls > 0, input_tokens=7, output_tokens=len(steps))
    msg = msgspec.json.encode(message_of(b.log.items(), "req-1", "m", st.fmt, outcome))
    for sizes in ([len(steps)], [1] * len(steps) or [0], _sizes(len(steps), rng), _sizes(len(steps), rng)):
        resp, events, lst = _loud(rt, steps, want_lp, sizes, finish)
        assert msgspec.json.encode(resp) == msgspec.json.encode(quiet), sizes
        loud_msg = accumulate(translate(events, "req-1", "m", lst.fmt, 7, outcome))
        assert msgspec.json.encode(loud_msg) == msg, sizes


def _partial_reference(buf: str):
    """``partial_input`` without its complete-JSON shortcut: partial_json_parser alone."""
    import partial_json_parser
    from partial_json_parser.core.options import Allow

    from worker.core.messages.events import _INCOMPLETE_NUMBER
    allow = Allow.ARR | Allow.OBJ | (Allow.NUM if not _INCOMPLETE_NUMBER.search(buf) else 0)
    try:
        obj = partial_json_parser.loads(buf, allow)
    except Exception:  # noqa: BLE001 - as partial_input: not a JSON object prefix
        return None
    return obj if isinstance(obj, dict) else None


def test_partial_input_shortcut_equals_the_partial_parse():
    """A tool_use ``input``: complete objects (escapes, nesting, duplicate keys, NaN, spaces
    around, big numbers) and every prefix of them give what partial_json_parser gives."""
    from worker.core.messages.events import partial_input
    texts = ['{"city": "Paris", "unit": "c"}', ' {"a": [1, {"b": "x\\\\"}], "a": 2} ', '{"q": "say \\"hi\\" {"}',
             '{"n": NaN, "i": -Infinity}', '{"big": 123456789012345678901234567890, "f": 1e400}', '{}',
             '{"a": "}"}', '{"a": 1} x', '[1, 2]', '"s"', '{"k": "天气 🌤️\\u00e9"}']
    rng = random.Random(25)
    for _ in range(40):
        texts.append(msgspec.json.encode({_text(rng): [_text(rng), rng.random(), {"x": None}]}).decode())
    for t in texts:
        for cut in range(len(t) + 1):
            s = t[:cut]
            assert repr(partial_input(s)) == repr(_partial_reference(s)), s
