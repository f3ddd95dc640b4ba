"""One typed decode per body (issue 13): the non-streaming and streaming entry points decode a
body once into its typed Struct and fall back to the routing-probe path only when that decode
fails or the shape is ambiguous, so every error reply (status, message, request id, kind) is the
probe path's, byte for byte. Each case runs both paths on a real service and compares."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from worker.config import ServedModelConfig
from worker.core.service import DerenderService

TOKDIR = Path(__file__).parent / "data" / "tokenizers"


def _svc() -> DerenderService:
    return DerenderService([ServedModelConfig(name="m", tokenizer=str(TOKDIR / "qwen3"), reasoning_parser="qwen3",
                                              tool_parser="hermes", enable_auto_tool_choice=True)])


@pytest.mark.parametrize("body,kind", [
    ({"model": "m", "generate_response": {"choices": [{"token_ids": [1]}]},
      "generate_responses": [{"choices": [{"token_ids": [1]}]}]}, None),
    ({"model": "m", "generate_response": {"choices": [{"token_ids": [1]}]}, "generate_chunk": {}}, None),
    ({"model": None, "generate_response": {"choices": [{"token_ids": [1]}]}}, None),
    ({"model": "nope", "generate_response": {"request_id": "r", "choices": [{"token_ids": [1]}]}}, None),
    ({"model": "m", "generate_response": {"request_id": "r", "choices": [{"token_ids": [1]}]}}, "completion"),
    ({"model": "m", "generate_responses": []}, None),
    ({"model": "m", "generate_responses": [{"request_id": "c", "choices": [{"token_ids": [-1]}]}]}, None),
    ({"model": "m", "generate_response": None, "generate_responses": [{"choices": []}]}, None),
])
def test_one_decode_keeps_probe_path_errors(body, kind, monkeypatch):
    """Bodies the one-decode path must hand to the probe path (or answer identically)."""
    import worker.core.service as service

    raw = json.dumps(body).encode()
    fast = _svc().derender(raw, kind)
    monkeypatch.setattr(service, "_one_decode", lambda body, kind, *decoders: None)
    slow = _svc().derender(raw, kind)
    assert (fast.status, fast.body, fast.request_id, fast.kind) == (slow.status, slow.body, slow.request_id,
                                                                    slow.kind)
    assert fast.status != 200


_CHUNK = {"request_id": "s", "choices": [{"index": 0, "token_ids": [9707]}]}


@pytest.mark.parametrize("body,kind", [
    ({"model": "m", "stream": True, "generate_chunk": _CHUNK}, None),  # chat without chat_request: 400
    ({"model": "m", "stream": True, "generate_chunk": _CHUNK,
      "chat_request": {"messages": []}, "completion_request": {"logprobs": 99}}, None),
    ({"model": "m", "stream": True, "generate_chunk": _CHUNK, "completion_request": {"logprobs": "x"}}, None),
    ({"model": "m", "stream": True, "generate_chunk": _CHUNK, "chat_request": {"n": 0}}, None),
    ({"model": "m", "stream": True, "generate_chunk": None}, None),
    ({"model": 5, "stream": True, "generate_chunk": _CHUNK}, None),
    ({"model": "nope", "stream": True, "generate_chunk": _CHUNK}, None),
    ({"model": "m", "stream": False, "generate_chunk": _CHUNK, "chat_request": {}}, None),
    ({"model": "m", "stream": True, "generate_chunk": _CHUNK, "chat_request": {}}, "completion"),
    ({"model": "m", "stream": True, "generate_chunk": {"request_id": 7, "choices": []}}, None),
])
def test_stream_one_decode_keeps_probe_path_replies(body, kind, monkeypatch):
    import worker.core.service as service

    raw = json.dumps(body).encode()
    fast, fast_state = _svc().derender_stream(raw, None, kind=kind)
    monkeypatch.setattr(service, "_stream_body_decoder", _Failing())
    slow, slow_state = _svc().derender_stream(raw, None, kind=kind)
    assert (fast.status, fast.body, fast.request_id, fast.kind) == (slow.status, slow.body, slow.request_id,
                                                                    slow.kind)
    assert fast_state == slow_state


class _Failing:
    """A decoder that always fails as a malformed body would (forces the probe path)."""

    def decode(self, data):
        import msgspec
        raise msgspec.DecodeError("forced")


def test_stream_state_typed_decode_roundtrips_and_keeps_version_refusal():
    """The per-stack typed state decoder restores parser sub-states as their own Structs in one
    decode, re-encodes to the same bytes, and a state of another version is still refused with
    the version message (never misread)."""
    import msgspec

    from worker.core import stream as core_stream

    svc = _svc()
    rt = svc.runtime("m")
    tok = rt.tokenizer
    ids = tok.encode("<think>\nhmm</think>\n\nok <tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}")
    state = None
    for i, t in enumerate(ids):
        b = {"model": "m", "stream": True,
             "generate_chunk": {"request_id": "s", "choices": [{"index": 0, "token_ids": [t]}]}}
        if i == 0:
            b["chat_request"] = {"messages": [], "tools": [{"type": "function", "function": {"name": "f"}}]}
        res, state = svc.derender_stream(json.dumps(b).encode(), state)
        assert res.status == 200, res.body
        st = core_stream.decode_state(rt, state)
        r_type, t_type = rt.stack.state_types
        parser = st.choices[0].parser
        assert type(parser.reasoning) is r_type and type(parser.tool) is t_type
        assert core_stream.encode_state(st) == state
    old = msgspec.msgpack.decode(state)
    old[0] = core_stream.STATE_VERSION - 1
    res, _ = svc.derender_stream(json.dumps({"model": "m", "stream": True, "generate_chunk": {
        "request_id": "s", "choices": [{"index": 0, "token_ids": [ids[0]]}]}}).encode(), msgspec.msgpack.encode(old))
    assert res.status == 409  # another release's state: the "lost or expired" path, never misread
    msg = json.loads(res.body)["error"]["message"]
    assert f"has version {core_stream.STATE_VERSION - 1}" in msg and "lost or expired" in msg
