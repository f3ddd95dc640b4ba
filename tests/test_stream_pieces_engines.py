"""Issue 13 item 5 for every engine that buffers an open call (``worker.core.stream``, "Bounded
state"): jsontail (mistral, llama3_json, phi4_mini_json, granite-20b-fc), marker (pythonic,
llama4_pythonic, olmo3, granite, xlam), Harmony (gpt-oss's ``openai``, text mode; its id mode:
``test_gptoss_harmony``), the content a required / named ``tool_choice`` holds for JSON parsing
(``StackState.held``), and streams with stop strings.

For each: a huge call (a ~3,000-word string argument) streamed in 1-token chunks in both
``--tool-call-streaming`` modes, closed and never closed, gives the same replies with pieces as
without and keeps the state under 4 KiB (it grows past 12 KiB without pieces); a closed call
still comes out whole. With a spill threshold of a few characters: the same answer under random
chunking as under 1-token chunks, a chunk redone after a crash (its pieces written, its
checkpoint not) never appends twice, and pieces lost or overwritten are the 409 "lost or
expired", never a 500 or a wrong reply.
"""
from __future__ import annotations

import copy
import functools
import json
import random
from pathlib import Path

import pytest

from tests.harness.streams import run_stream
from worker.config import ServedModelConfig
from worker.core.service import DerenderService

_QWEN3 = Path(__file__).resolve().parent / "data" / "tokenizers" / "qwen3"
_WORDS = "def add(a, b): return a + b  # a helper used by the service layer".split()
_TOOL = [{"type": "function", "function": {"name": "write_file", "parameters": {
    "type": "object", "properties": {"content": {"type": "string"}}}}}]
_NAMED = {"type": "function", "function": {"name": "write_file"}}


def _hermes(s: str) -> tuple[str, str]:
    return 'Writing it.\n<tool_call>\n{"name": "write_file", "arguments": {"content": "' + s, '"}}\n</tool_call>'


#: engine case -> (tool parser, request extras, argument text -> (text up to and through it, the
#: call's closing text)); granite's, xlam's and llama4_pythonic's calls open the output
CASES = {
    "mistral": ("mistral", {}, lambda s: ('Writing it.\n[TOOL_CALLS][{"name": "write_file", "arguments": {"content": "' + s,
                                          '"}}]')),
    "llama3_json": ("llama3_json", {}, lambda s: ('{"name": "write_file", "parameters": {"content": "' + s,
                                                  '"}}')),
    "pythonic": ("pythonic", {}, lambda s: ('Writing it.\n[write_file(content="' + s, '")]')),
    "granite": ("granite", {}, lambda s: ('<|tool_call|>[{"name": "write_file", "arguments": {"content": "' + s,
                                          '"}}]')),
    "phi4_mini_json": ("phi4_mini_json", {}, lambda s: (
        'Writing it.\nfunctools[{"name": "write_file", "arguments": {"content": "' + s, '"}}]')),
    "granite-20b-fc": ("granite-20b-fc", {}, lambda s: (
        'Writing it.\n<function_call>{"name": "write_file", "arguments": {"content": "' + s, '"}}')),
    "xlam": ("xlam", {}, lambda s: ('[{"name": "write_file", "arguments": {"content": "' + s, '"}}]')),
    "llama4_pythonic": ("llama4_pythonic", {}, lambda s: ('<|python_start|>[write_file(content="' + s,
                                                          '")]<|python_end|>')),
    "olmo3": ("olmo3", {}, lambda s: ('Writing it.\n<function_calls>\nwrite_file(content="' + s,
                                      '")\n</function_calls>')),
    "harmony": ("openai", {}, lambda s: ("Writing it.\n<|channel|>commentary to=functions.write_file <|constrain|>json"
                                         '<|message|>{"content": "' + s, '"}<|call|>')),
    "required": ("hermes", {"tool_choice": "required"},
                 lambda s: ('[{"name": "write_file", "parameters": {"content": "' + s, '"}}]')),
    "named": ("hermes", {"tool_choice": _NAMED}, lambda s: ('{"content": "' + s, '"}')),
    "stop strings": ("hermes", {"stop": ["NEVER_SAID", "ZZ"]}, _hermes),
}


@functools.cache
def _svc(parser: str, mode: str) -> DerenderService:
    return DerenderService([ServedModelConfig(name="m", tokenizer=str(_QWEN3), tool_parser=parser,
                                              enable_auto_tool_choice=True, tool_call_streaming=mode)])


def _words(n: int) -> str:
    return " ".join(_WORDS[i % len(_WORDS)] for i in range(n))


def _bodies(case: str, mode: str, words: int, closed: bool, how: str = "1", rid: str = "big") -> list[dict]:
    """Chunk bodies (``how``: ``1``-token chunks or ``random`` sizes) of ``case``'s call."""
    parser, extra, build = CASES[case]
    tok = _svc(parser, mode).runtime("m").tokenizer
    head, tail = build(_words(words))
    ids = tok.encode(head + (tail if closed else "")) + ([tok.token_to_id("<|im_end|>")]
                                                                          if closed else [])
    rng = random.Random(7)
    cuts, i = [], 0
    while i < len(ids):
        k = 1 if how == "1" else rng.choice([1, 2, 3, 5, 8, 17, 40])
        cuts.append((i, min(len(ids), i + k)))
        i += k
    out = []
    for n, (a, z) in enumerate(cuts):
        b = {"model": "m", "stream": True, "generate_chunk": {"request_id": rid, "choices": [
            {"index": 0, "token_ids": ids[a:z], "finish_reason": "stop" if closed and z == len(ids) else None}]}}
        if n == 0:
            b |= {"prompt_token_ids": tok.encode("<|im_start|>assistant\n"), "chat_request": {
                "model": "m", "messages": [{"role": "user", "content": "write it"}], "tools": _TOOL, **extra}}
        out.append(b)
    return out


def _calls(chunks: list) -> dict[int, dict]:
    """Tool calls of a streamed answer, their argument fragments joined."""
    calls: dict[int, dict] = {}
    for c in chunks:
        for ch in c.get("choices") or []:
            for tc in ch["delta"].get("tool_calls") or []:
                d = calls.setdefault(tc["index"], {"name": None, "arguments": ""})
                d["name"] = d["name"] or tc["function"].get("name")
                d["arguments"] += tc["function"].get("arguments") or ""
    return calls


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("mode", ["whole", "incremental"])
@pytest.mark.parametrize("closed", [False, True])
def test_a_huge_call_keeps_the_state_under_4_kib(case, mode, closed):
    svc = _svc(CASES[case][0], mode)
    bodies = _bodies(case, mode, 3000, closed)
    sizes_on: list[int] = []
    sizes_off: list[int] = []
    on = run_stream(copy.deepcopy(bodies), pieces=True, sizes=sizes_on, svc=svc)
    off = run_stream(copy.deepcopy(bodies), sizes=sizes_off, svc=svc)
    assert on == off
    assert max(sizes_on) <= 4096, max(sizes_on)
    assert max(sizes_off) > 3 * 4096  # (without pieces the body is in the state: the case is real)
    if closed:
        calls = _calls(on)
        assert [c["name"] for c in calls.values()] == ["write_file"], on[-3:]
        assert len(json.loads(calls[0]["arguments"])["content"]) > 10000


@pytest.fixture
def tiny_spill(monkeypatch):
    monkeypatch.setattr("worker.core.stream_spill.SPILL_CHARS", 4)


def _view(chunks: list) -> tuple[str, dict, list]:
    """What a client assembles: content, calls (arguments joined), finish reasons."""
    content = "".join((ch["delta"].get("content") or "") for c in chunks for ch in c.get("choices") or [])
    finish = [ch.get("finish_reason") for c in chunks for ch in c.get("choices") or [] if ch.get("finish_reason")]
    return content, _calls(chunks), finish


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("closed", [False, True])
def test_split_invariance_with_pieces(case, closed, tiny_spill):
    """``whole`` mode: random chunking with pieces assembles to the 1-token answer without
    pieces (the spilled body comes back whatever the chunk boundaries)."""
    svc = _svc(CASES[case][0], "whole")
    ref = run_stream(_bodies(case, "whole", 120, closed), svc=svc)
    for seed_how in ("1", "random"):
        got = run_stream(_bodies(case, "whole", 120, closed, seed_how), pieces=True, svc=svc)
        assert _view(got) == _view(ref)
    if closed:
        assert _view(ref)[1] and _view(ref)[2] == ["tool_calls" if case != "named" else "stop"]


def _drive(svc: DerenderService, bodies: list[dict], redo: set[int], corrupt=None) -> tuple[list, list[int]]:
    """Run ``bodies`` with pieces kept as the piece stores keep them (a chunk's bytes written at
    the offset its previous state recorded). A chunk in ``redo`` is first run and its pieces
    written, but its checkpoint lost (a worker killed between the two), then run again from the
    previous state. ``corrupt(log)``: the bytes a reader gets. Returns (chunks, statuses)."""
    state, log, chunks, statuses = None, bytearray(), [], []
    for seq, b in enumerate(bodies):
        raw = json.dumps(b).encode()
        for attempt in range(2 if seq in redo else 1):
            res, new = svc.derender_stream(raw, state, seq=seq, pieces=True)
            if res.needs_pieces is not None:
                data = corrupt(bytes(log)) if corrupt else bytes(log)
                res, new = svc.derender_stream(raw, state, seq=seq, pieces=True, reader=lambda a, z, d=data: d[a:z])
            statuses.append(res.status)
            if res.status != 200:
                return chunks, statuses
            at = res.pieces_len - len(res.append)
            assert at <= len(log)
            log[at:at + len(res.append)] = res.append
            if attempt == 0 and seq in redo:
                continue  # the checkpoint was not stored: redo from the previous state
            chunks.extend(json.loads(res.body))
            state = new
    return chunks, statuses


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("mode", ["whole", "incremental"])
def test_a_redone_chunk_never_appends_twice(case, mode, tiny_spill):
    svc = _svc(CASES[case][0], mode)
    bodies = _bodies(case, mode, 120, True, "random")
    ref, _ = _drive(svc, bodies, set())
    got, statuses = _drive(svc, bodies, set(range(1, len(bodies), 3)))
    assert set(statuses) == {200}
    assert got == ref == run_stream(copy.deepcopy(bodies), svc=svc)
    assert _calls(ref)


_CORRUPT = {
    "not utf-8": lambda log: b"\xff" * len(log),
    "same bytes, other characters": lambda log: b"Z" * len(log),
    # as many bytes and characters as spilled, one word of the body changed (found by the CRC-32)
    "one word overwritten": lambda log: log.replace(b"abc", b"XYZ", 1),
    "short": lambda log: log[:-1],
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("how", list(_CORRUPT))
def test_lost_or_corrupted_pieces_are_the_409(case, how, tiny_spill):
    """Pieces overwritten or truncated, read back when the call closes: the 409 "lost or
    expired" (``PiecesLost``), never a 500 or a reply built from them. (Arguments with 2-byte
    characters: same-length garbage has other characters.)"""
    svc = _svc(CASES[case][0], "whole")
    _, extra, build = CASES[case]
    tok = svc.runtime("m").tokenizer
    head, tail = build(" ".join("abc déf ghi" for _ in range(60)))
    ids = tok.encode(head + tail) + [tok.token_to_id("<|im_end|>")]
    bodies = []
    for n, i in enumerate(range(0, len(ids), 7)):
        b = {"model": "m", "stream": True, "generate_chunk": {"request_id": "c", "choices": [
            {"index": 0, "token_ids": ids[i:i + 7], "finish_reason": "stop" if i + 7 >= len(ids) else None}]}}
        if n == 0:
            b |= {"prompt_token_ids": tok.encode("<|im_start|>assistant\n"), "chat_request": {
                "model": "m", "messages": [{"role": "user", "content": "w"}], "tools": _TOOL, **extra}}
        bodies.append(b)
    _, statuses = _drive(svc, bodies, set(), _CORRUPT[how])
    assert statuses[-1] == 409 and set(statuses[:-1]) == {200}, statuses


@pytest.mark.parametrize("case", ["required", "named", "stop strings", "mistral"])
def test_a_stop_string_matching_inside_a_spilled_body(case, tiny_spill):
    """A stop string that matches inside the spilled body (the choice ends there: the held
    content / open call is resolved from the text before the cut): the same replies with
    pieces as without, under 1-token and random chunks."""
    parser, extra, build = CASES[case]
    svc = _svc(parser, "whole")
    tok = svc.runtime("m").tokenizer
    head, tail = build(_words(60) + " CUT_HERE " + _words(20))
    ids = tok.encode(head + tail) + [tok.token_to_id("<|im_end|>")]
    for how in ("1", "random"):
        rng = random.Random(3)
        bodies, i = [], 0
        while i < len(ids):
            k = 1 if how == "1" else rng.choice([1, 2, 5, 11])
            b = {"model": "m", "stream": True, "generate_chunk": {"request_id": "s", "choices": [
                {"index": 0, "token_ids": ids[i:i + k], "finish_reason": "stop" if i + k >= len(ids) else None}]}}
            if i == 0:
                b |= {"prompt_token_ids": tok.encode("<|im_start|>assistant\n"), "chat_request": {
                    "model": "m", "messages": [{"role": "user", "content": "w"}], "tools": _TOOL,
                    **{**extra, "stop": ["CUT_HERE"]}}}
            bodies.append(b)
            i += k
        off = run_stream(copy.deepcopy(bodies), svc=svc)
        assert run_stream(copy.deepcopy(bodies), pieces=True, svc=svc) == off
        assert [ch.get("stop_reason") for c in off for ch in c.get("choices") or [] if ch.get("finish_reason")] \
            == ["CUT_HERE"]
