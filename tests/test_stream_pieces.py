"""Issue 13 item 5: bounded stream state for a tool call of any size. With
``derender_stream(pieces=True)`` the start of an open tool call's body that the parser no longer
reads leaves the per-chunk state for the stream's append-only pieces and comes back only when the
call closes or the output ends (``worker.core.stream``, "Bounded state").

1. Every reply byte is the same with and without pieces: the stream corpus and the split cases
   (1-token and random chunks), with the spill threshold lowered to a few characters so that
   every open call spills and comes back many times (both ``--tool-call-streaming`` modes are
   in the corpus).
2. A never-closed and a closed 3,000-word Hermes call, 1-token chunks, both modes: the same
   replies, and the state stays under 4 KiB while the pieces hold the body.
"""
from __future__ import annotations

import copy
import functools
import json

import msgspec
import pytest

from tests.harness.streams import run_stream, stream_bodies_from_nonstream
from tests.parity import PARITY, STREAM_CASES, missing_parser, nonstream_cases
from tests.parity_tools import to_requests
from worker.config import ServedModelConfig, load_config_file
from worker.core import stream as core_stream
from worker.core.service import DerenderService

SPLIT = [c for c in nonstream_cases() if not (c.get("expected") or {}).get("error")]


@pytest.fixture
def tiny_spill(monkeypatch):
    monkeypatch.setattr("worker.core.stream_spill.SPILL_CHARS", 4)


@pytest.mark.parametrize("case", STREAM_CASES, ids=[c["id"] for c in STREAM_CASES])
def test_corpus_streams_are_byte_identical_with_pieces(case, tiny_spill):
    if missing_parser(case):
        pytest.skip(missing_parser(case))
    bodies = to_requests.stream_bodies(case)
    assert run_stream(copy.deepcopy(bodies), pieces=True) == run_stream(copy.deepcopy(bodies))


@pytest.mark.parametrize("how", ["1", "random"])
@pytest.mark.parametrize("case", SPLIT, ids=[c["id"] for c in SPLIT])
def test_split_streams_are_byte_identical_with_pieces(case, how, tiny_spill):
    if missing_parser(case):
        pytest.skip(missing_parser(case))
    body = to_requests.nonstream_body(case)
    bodies = stream_bodies_from_nonstream(copy.deepcopy(body), case["endpoint"], how, 0)
    assert run_stream(copy.deepcopy(bodies), pieces=True) == run_stream(copy.deepcopy(bodies))


@functools.cache
def _incremental_service() -> DerenderService:
    """The corpus' served models with ``--tool-call-streaming incremental``."""
    models = load_config_file(PARITY / "models.json")
    return DerenderService([msgspec.structs.replace(m, tool_call_streaming="incremental") for m in models])


@pytest.mark.parametrize("case", SPLIT, ids=[c["id"] for c in SPLIT])
def test_incremental_streams_are_byte_identical_with_pieces(case, tiny_spill):
    """The same in ``incremental`` mode: the streamer's offsets move with the spilled body."""
    if missing_parser(case):
        pytest.skip(missing_parser(case))
    body = to_requests.nonstream_body(case)
    bodies = stream_bodies_from_nonstream(copy.deepcopy(body), case["endpoint"], "1", 0)
    svc = _incremental_service()
    assert run_stream(copy.deepcopy(bodies), pieces=True, svc=svc) == run_stream(copy.deepcopy(bodies), svc=svc)


_WORDS = "def add(a, b): return a + b  # a helper used by the service layer".split()
_TOOL = [{"type": "function", "function": {"name": "write_file", "parameters": {
    "type": "object", "properties": {"content": {"type": "string"}}}}}]


@pytest.mark.parametrize("parser", ["hermes", "qwen3_coder"])
@pytest.mark.parametrize("mode", ["whole", "incremental"])
@pytest.mark.parametrize("closed", [False, True])
def test_a_huge_call_keeps_the_state_under_4_kib(parser, mode, closed):
    """A 3,000-word string argument of a Hermes JSON call or a Qwen3-Coder XML call (whose
    ``incremental`` entries sent also leave the state: ``spill_args``)."""
    svc = DerenderService([ServedModelConfig(name="m", tokenizer=str(_qwen3()), tool_parser=parser,
                                             enable_auto_tool_choice=True, tool_call_streaming=mode)])
    tok = svc.runtime("m").tokenizer
    words = " ".join(_WORDS[i % len(_WORDS)] for i in range(3000))
    if parser == "hermes":
        text = 'Writing it.\n<tool_call>\n{"name": "write_file", "arguments": {"content": "' + words
        if closed:
            text += '"}}\n</tool_call>'
    else:
        text = "Writing it.\n<tool_call>\n<function=write_file>\n<parameter=content>\n" + words
        if closed:
            text += "\n</parameter>\n</function>\n</tool_call>"
    ids = tok.encode(text) + ([tok.token_to_id("<|im_end|>")] if closed else [])
    bodies = []
    for i, t in enumerate(ids):
        b = {"model": "m", "stream": True, "generate_chunk": {"request_id": "big", "choices": [
            {"index": 0, "token_ids": [t], "finish_reason": "stop" if closed and i == len(ids) - 1 else None}]}}
        if i == 0:
            b |= {"prompt_token_ids": tok.encode("<|im_start|>assistant\n"), "chat_request": {
                "model": "m", "messages": [{"role": "user", "content": "write it"}], "tools": _TOOL}}
        bodies.append(b)
    import tests.harness.streams as hs
    old = hs.service
    hs.service = lambda: svc
    try:
        sizes_on: list[int] = []
        sizes_off: list[int] = []
        on = run_stream(copy.deepcopy(bodies), pieces=True, sizes=sizes_on)
        off = run_stream(copy.deepcopy(bodies), sizes=sizes_off)
    finally:
        hs.service = old
    assert on == off
    assert max(sizes_on) <= 4096, max(sizes_on)
    assert max(sizes_off) > 3 * 4096  # (without pieces the body is in the state: the case is real)
    if closed:
        args = "".join(tc["function"].get("arguments") or "" for c in on for ch in c["choices"]
                       for tc in (ch["delta"].get("tool_calls") or []))
        assert len(json.loads(args)["content"]) > 10000


def _qwen3():
    from pathlib import Path
    return Path(__file__).resolve().parent / "data" / "tokenizers" / "qwen3"


_CORRUPT = {
    "not utf-8": lambda log: b"\xff" * len(log),
    "utf-8 cut in a character": lambda log: log[:len(log) // 2] + b"\xc3" + log[len(log) // 2 + 1:],
    "same bytes, other characters": lambda log: b"Z" * len(log),
    # as many bytes and characters as spilled, one word of the body changed (found by the CRC-32)
    "one word overwritten": lambda log: log.replace(b"abc", b"XYZ", 1),
    "zero bytes": lambda log: b"\0" * len(log),
    "short": lambda log: log[:-1],
}


@pytest.mark.parametrize("parser", ["hermes", "qwen3_coder"])
@pytest.mark.parametrize("how", list(_CORRUPT))
def test_corrupted_pieces_are_the_lost_409_never_a_500_or_a_wrong_reply(parser, how):
    """Pieces overwritten in the store (garbage of the recorded length, a cut UTF-8 character,
    zero bytes) or truncated, read back when the call closes: the chunk is the 409 "lost or
    expired" (``PiecesLost``), not an internal-error 500 from decoding them and never a reply
    built from them. (A body with 2-byte characters: same-length garbage has other characters.)"""
    svc = DerenderService([ServedModelConfig(name="m", tokenizer=str(_qwen3()), tool_parser=parser,
                                             enable_auto_tool_choice=True)])
    tok = svc.runtime("m").tokenizer
    words = " ".join("abc déf ghi" for _ in range(300))
    if parser == "hermes":
        text = 'W.\n<tool_call>\n{"name": "write_file", "arguments": {"content": "' + words + '"}}\n</tool_call>'
    else:
        text = "W.\n<tool_call>\n<function=write_file>\n<parameter=content>\n" + words + \
            "\n</parameter>\n</function>\n</tool_call>"
    ids = tok.encode(text) + [tok.token_to_id("<|im_end|>")]
    state, log, statuses = None, bytearray(), []
    for seq, i in enumerate(range(0, len(ids), 7)):
        b = {"model": "m", "stream": True, "generate_chunk": {"request_id": "c", "choices": [
            {"index": 0, "token_ids": ids[i:i + 7], "finish_reason": "stop" if i + 7 >= len(ids) else None}]}}
        if seq == 0:
            b |= {"prompt_token_ids": tok.encode("<|im_start|>assistant\n"), "chat_request": {
                "model": "m", "messages": [{"role": "user", "content": "write it"}], "tools": _TOOL}}
        raw = json.dumps(b).encode()
        res, new = svc.derender_stream(raw, state, seq=seq, pieces=True)
        if res.needs_pieces is not None:
            bad = _CORRUPT[how](bytes(log))
            res, new = svc.derender_stream(raw, state, seq=seq, pieces=True, reader=lambda a, z, bad=bad: bad[a:z])
        statuses.append(res.status)
        if res.status != 200:
            err = json.loads(res.body)["error"]
            assert err["type"] == "ConflictError" and "lost or expired" in err["message"], err
            break
        log[res.pieces_len - len(res.append):] = res.append
        state = new
    assert statuses[-1] == 409 and set(statuses[:-1]) == {200}


_LIES = {
    "pieces_len negative": lambda s: setattr(s, "pieces_len", -5),
    "pieces_len huge": lambda s: setattr(s, "pieces_len", 2**62),
    "range longer than the pieces": lambda s: s.choices[0].spill.__setitem__(1, 2**62),
    "range offset negative": lambda s: s.choices[0].spill.__setitem__(0, -100),
    "range length negative": lambda s: s.choices[0].spill.__setitem__(1, -100),
    "half a range": lambda s: s.choices[0].spill.append(7),
}


@pytest.mark.parametrize("lie", list(_LIES))
def test_a_state_lying_about_its_pieces_is_refused(lie):
    """A stored state whose pieces numbers lie (negative, past Redis's largest string, ranges
    outside the recorded length, an odd range list) is refused as unreadable (400) when decoded,
    before any read or write at those offsets: not a 500 from ``len() < 0`` / an index error."""
    svc = DerenderService([ServedModelConfig(name="m", tokenizer=str(_qwen3()), tool_parser="hermes",
                                             enable_auto_tool_choice=True)])
    rt = svc.runtime("m")
    tok = rt.tokenizer
    ids = tok.encode('<tool_call>\n{"name": "write_file", "arguments": {"content": "' + "abc " * 800)
    b = {"model": "m", "stream": True, "prompt_token_ids": [1], "generate_chunk": {"request_id": "l", "choices": [
        {"index": 0, "token_ids": ids, "finish_reason": None}]},
        "chat_request": {"model": "m", "messages": [{"role": "user", "content": "w"}], "tools": _TOOL}}
    res, state = svc.derender_stream(json.dumps(b).encode(), None, seq=0, pieces=True)
    st = core_stream.decode_state(rt, state)
    assert res.status == 200 and st.pieces_len > 0 and st.choices[0].spill  # (the case is real)
    _LIES[lie](st)
    nxt = {"model": "m", "stream": True, "generate_chunk": {"request_id": "l", "choices": [
        {"index": 0, "token_ids": tok.encode('"}}\n</tool_call>'), "finish_reason": "stop"}]}}
    res, _ = svc.derender_stream(json.dumps(nxt).encode(), core_stream.encode_state(st), seq=1, pieces=True,
                                 reader=lambda a, z: b"x" * max(z - a, 0))
    assert res.status == 400, res.body
    assert "stored stream state is unreadable" in json.loads(res.body)["error"]["message"]
