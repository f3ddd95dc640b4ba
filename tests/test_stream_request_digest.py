"""Issue 13 item 4: a chat/completion stream's request is decoded on its first chunk only. The
state keeps the digest of its raw bytes (``StreamState.req_digest``); a later chunk may omit the
request, and when it carries one its bytes must be the first chunk's (400 otherwise), compared by
digest, never decoded. A state of another ``STATE_VERSION`` (another release wrote it, old layout
included) is refused with the 409 "lost or expired", never misread."""
from __future__ import annotations

import json

import msgspec

from tests.parity import service
from worker.core import stream as core_stream

_CHAT_REQ = {"model": "qwen3", "messages": [{"role": "user", "content": "hi"}],
             "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}
_PROMPT = [151644, 872, 198]


def _chunk(ids, finish=None, rid="dg", **extra) -> bytes:
    b = {"model": "qwen3", "stream": True,
         "generate_chunk": {"request_id": rid, "choices": [{"index": 0, "token_ids": ids, "finish_reason": finish}]}}
    b.update(extra)
    return json.dumps(b).encode()


def _raw_chunk(ids, raw_request: bytes, key: str = "chat_request") -> bytes:
    """A later chunk carrying ``raw_request`` verbatim (bytes as given, not re-serialized)."""
    head = _chunk(ids)[:-1]
    return head + b', "' + key.encode() + b'": ' + raw_request + b"}"


def _first(svc, raw_request: bytes) -> bytes:
    body = _chunk([151667], prompt_token_ids=_PROMPT)[:-1] + b', "chat_request": ' + raw_request + b"}"
    res, st = svc.derender_stream(body, None)
    assert res.status == 200, res.body
    return st


def _replies(svc, st, bodies):
    out = []
    for b in bodies:
        res, st = svc.derender_stream(b, st)
        out.append((res.status, res.body))
        if res.status != 200:
            break
    return out


def test_first_chunk_digest_is_stored_and_identical_later_requests_change_nothing():
    svc = service()
    raw = json.dumps(_CHAT_REQ).encode()
    st = _first(svc, raw)
    rt = svc.runtime("qwen3")
    assert core_stream.decode_state(rt, st).req_digest == core_stream.request_digest(raw)
    plain = _replies(svc, st, [_chunk([9707]), _chunk([151645], "stop")])
    same = _replies(svc, st, [_raw_chunk([9707], raw), _raw_chunk([151645], raw)[:-1].replace(
        b'"finish_reason": null', b'"finish_reason": "stop"') + b"}"])
    assert [s for s, _ in plain] == [200, 200]
    assert same == plain  # the repeated request is only compared: same replies, byte for byte


def test_a_later_request_with_other_bytes_is_a_400_and_the_state_is_kept():
    svc = service()
    raw = json.dumps(_CHAT_REQ).encode()
    st = _first(svc, raw)
    for other in (json.dumps(_CHAT_REQ, indent=1).encode(),  # same request, other bytes: refused too
                  json.dumps({**_CHAT_REQ, "tools": []}).encode(),
                  b'{"messages": "not a list"}'):  # invalid: never decoded, refused by digest
        res, new = svc.derender_stream(_raw_chunk([9707], other), st)
        assert res.status == 400 and new is None, res.body
        err = json.loads(res.body)["error"]
        assert err["param"] == "chat_request"
        assert "differs from the one the stream started with" in err["message"]
    res, _ = svc.derender_stream(_raw_chunk([9707], b"null"), st)  # null = absent
    assert res.status == 200, res.body


def test_a_request_on_a_later_chunk_when_the_first_had_none_is_a_400():
    svc = service()  # (chat needs its request on chunk 0 with a parser: a completion stream here)
    res, st = svc.derender_stream(_chunk([9707], prompt_token_ids=[6023]), None, kind="completion")
    assert res.status == 200, res.body
    res, _ = svc.derender_stream(_raw_chunk([13], b'{"model": "qwen3", "prompt": "hi"}', "completion_request"), st)
    assert res.status == 400 and "differs" in json.loads(res.body)["error"]["message"]


def test_completion_streams_compare_their_completion_request():
    svc = service()
    raw = json.dumps({"model": "qwen3", "prompt": "hi"}).encode()
    first = _chunk([9707], prompt_token_ids=[6023])[:-1] + b', "completion_request": ' + raw + b"}"
    res, st = svc.derender_stream(first, None)
    assert res.status == 200, res.body
    res, _ = svc.derender_stream(_raw_chunk([13], raw, "completion_request"), st)
    assert res.status == 200, res.body
    res, _ = svc.derender_stream(_raw_chunk([13], b'{"model": "qwen3", "prompt": "ho"}', "completion_request"), st)
    assert res.status == 400
    assert json.loads(res.body)["error"]["param"] == "completion_request"


def test_a_state_of_the_previous_release_is_refused_with_the_409_never_misread():
    svc = service()
    st = _first(svc, json.dumps(_CHAT_REQ).encode())
    arr = msgspec.msgpack.decode(st)
    prev = [core_stream.STATE_VERSION - 1, *arr[1:-1]]  # the previous layout: no req_digest
    res, new = svc.derender_stream(_chunk([9707]), msgspec.msgpack.encode(prev))
    assert res.status == 409 and new is None
    assert "lost or expired" in json.loads(res.body)["error"]["message"]
    # a foreign layout with another version first is refused the same way
    res, _ = svc.derender_stream(_chunk([9707]), msgspec.msgpack.encode([core_stream.STATE_VERSION - 1, "x", {}]))
    assert res.status == 409
    # bytes that are no state at all keep the 400 "unreadable"
    res, _ = svc.derender_stream(_chunk([9707]), b"\x93\xa1x\x01\x02")
    assert res.status == 400 and "unreadable" in json.loads(res.body)["error"]["message"]


def test_a_packed_responses_state_of_the_previous_layout_is_the_409_with_pieces():
    """The Kafka worker keeps a Responses stream's log in the stream's pieces now; a checkpoint
    that packs it inside (``PACKED_MAGIC``: the previous layout) is refused, never misread."""
    from worker.core.responses.service import PACKED_MAGIC
    svc = service()
    chunk = _chunk([9707])
    res, new = svc.derender_stream(chunk, PACKED_MAGIC + b"\x92\xc4\x00\xc4\x00", kind="responses", pieces=True)
    assert res.status == 409 and new is None
    assert "lost or expired" in json.loads(res.body)["error"]["message"]
    res, _ = svc.derender_stream(chunk, b"\x93abc", kind="responses", pieces=True)  # another kind's state
    assert res.status == 400 and "unreadable" in json.loads(res.body)["error"]["message"]
