"""Issue 13 item 5, the Kafka worker's piece reads: a pool process that needs stored piece bytes
says which (``StreamOutcome.needs_pieces``: ``(start, end)``) and is run again with exactly
those bytes (``derender_stream_job(pieces=(start, bytes))``, as ``transport.streams.
submit_chunk`` does). With n=2 choices whose open calls spill in turns (their ranges interleave)
and close in the same chunk or one after the other, the span asked for covers every range of
every choice: same replies as without pieces, never the 409 "lost or expired" for a live
stream (it was, when a choice's first range alone was asked for)."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from worker.config import ServedModelConfig
from worker.core.service import DerenderService
from worker.transport.jobs import StreamOutcome, derender_stream_job
from worker.transport.outage import OutageClock
from worker.transport.stream_registry import LiveStream
from worker.transport.streams import submit_chunk

_QWEN3 = Path(__file__).resolve().parent / "data" / "tokenizers" / "qwen3"
_TOOL = [{"type": "function", "function": {"name": "write_file", "parameters": {
    "type": "object", "properties": {"content": {"type": "string"}}}}}]


@pytest.fixture
def tiny_spill(monkeypatch):
    monkeypatch.setattr("worker.core.stream_spill.SPILL_CHARS", 4)


def _bodies(tok, together: bool, lengths: tuple[int, int]) -> list[bytes]:
    """An n=2 hermes stream; choice i's call has ``lengths[i]`` words; 3-token chunks, both
    choices in one chunk (``together``) or one chunk per choice in turns."""
    ids = []
    for n in lengths:
        words = " ".join("abc déf ghi" for _ in range(n))
        ids.append(tok.encode('W.\n<tool_call>\n{"name": "write_file", "arguments": {"content": "' + words +
                              '"}}\n</tool_call>') + [tok.token_to_id("<|im_end|>")])
    steps = []
    for i in range(0, max(map(len, ids)), 3):
        chs = [{"index": ci, "token_ids": x[i:i + 3], "finish_reason": "stop" if i + 3 >= len(x) else None}
               for ci, x in enumerate(ids) if i < len(x)]
        steps += [chs] if together else [[ch] for ch in chs]
    out = []
    for j, chs in enumerate(steps):
        b: dict = {"model": "m", "stream": True, "generate_chunk": {"request_id": "f", "choices": chs}}
        if j == 0:
            b |= {"prompt_token_ids": tok.encode("<|im_start|>assistant\n"), "chat_request": {
                "model": "m", "messages": [{"role": "user", "content": "w"}], "tools": _TOOL, "n": 2}}
        out.append(json.dumps(b).encode())
    return out


@pytest.mark.parametrize("together", [True, False])
@pytest.mark.parametrize("lengths", [(30, 30), (30, 12), (12, 30)])
def test_the_span_asked_for_serves_every_interleaved_range(together, lengths, tiny_spill):
    svc = DerenderService([ServedModelConfig(name="m", tokenizer=str(_QWEN3), tool_parser="hermes",
                                             enable_auto_tool_choice=True)])
    bodies = _bodies(svc.runtime("m").tokenizer, together, lengths)
    want, state = [], None
    for seq, raw in enumerate(bodies):
        res, state = svc.derender_stream(raw, state, seq=seq)
        assert res.status == 200, res.body
        want.append(res.body)
    got, state, log, asked = [], None, bytearray(), 0
    for seq, raw in enumerate(bodies):
        out = derender_stream_job(svc, raw, state, seq, None, None)
        if out.needs_pieces is not None:
            asked += 1
            a, z = out.needs_pieces
            out = derender_stream_job(svc, raw, state, seq, None, None, (a, bytes(log[a:z])))
        assert out.needs_pieces is None and out.status == 200, out.body
        log[out.pieces_len - len(out.append):out.pieces_len] = out.append
        state = out.state
        got.append(out.body)
    assert asked and got == want


def _call_text(parser: str, extra: dict, words: str) -> str:
    """One choice's output: a call of ``write_file`` in ``parser``'s format (or the JSON a
    required / named ``tool_choice`` asks for)."""
    tc = extra.get("tool_choice")
    if tc == "required":
        return '[{"name": "write_file", "parameters": {"content": "' + words + '"}}]'
    if tc is not None:
        return '{"content": "' + words + '"}'
    return {"hermes": 'W.\n<tool_call>\n{"name": "write_file", "arguments": {"content": "' + words + '"}}\n</tool_call>',
            "mistral": 'W.[TOOL_CALLS][{"name": "write_file", "arguments": {"content": "' + words + '"}}]',
            "pythonic": 'W.\n[write_file(content="' + words + '")]',
            "qwen3_coder": "W.\n<tool_call>\n<function=write_file>\n<parameter=content>\n" + words +
                           "\n</parameter>\n</function>\n</tool_call>",
            "llama3_json": '{"name": "write_file", "parameters": {"content": "' + words + '"}}'}[parser]


@pytest.mark.parametrize("seed", range(3))
def test_random_choices_engines_and_held_content_through_the_span_asked_for(seed, tiny_spill):
    """Random n (1-3), engines, required / named tool_choice (held content spills), stop
    strings, random choice subsets per chunk and chunk sizes: the Kafka worker's reads give
    the replies (and statuses) of the same stream without pieces."""
    import random
    rng = random.Random(f"fetch-{seed}")
    for _ in range(12):
        parser = rng.choice(["hermes", "mistral", "pythonic", "qwen3_coder", "llama3_json"])
        svc = DerenderService([ServedModelConfig(name="m", tokenizer=str(_QWEN3), tool_parser=parser,
                                                 enable_auto_tool_choice=True)])
        tok = svc.runtime("m").tokenizer
        extra = rng.choice([{}, {"tool_choice": "required"},
                            {"tool_choice": {"type": "function", "function": {"name": "write_file"}}},
                            {"stop": ["zzz", "ghi abc déf ghi abc déf ghi abc XX"]}, {"stop": ["déf ghi abc"]}])
        n = rng.choice([1, 2, 3])
        texts = [tok.encode(_call_text(parser, extra, " ".join("abc déf ghi" for _ in range(rng.choice([5, 20, 40])))))
                 + [tok.token_to_id("<|im_end|>")] for _ in range(n)]
        pos, bodies = [0] * n, []
        while any(pos[i] < len(texts[i]) for i in range(n)):
            live = [i for i in range(n) if pos[i] < len(texts[i])]
            chs = []
            for i in rng.sample(live, rng.randint(1, len(live))):
                k = rng.choice([1, 2, 3, 5])
                chs.append({"index": i, "token_ids": texts[i][pos[i]:pos[i] + k],
                            "finish_reason": "stop" if pos[i] + k >= len(texts[i]) else None})
                pos[i] += k
            b: dict = {"model": "m", "stream": True, "generate_chunk": {"request_id": "f", "choices": chs}}
            if not bodies:
                b |= {"prompt_token_ids": tok.encode("<|im_start|>assistant\n"), "chat_request": {
                    "model": "m", "messages": [{"role": "user", "content": "w"}], "tools": _TOOL, "n": n, **extra}}
            bodies.append(json.dumps(b).encode())
        want, state = [], None
        for seq, raw in enumerate(bodies):
            res, new = svc.derender_stream(raw, state, seq=seq)
            want.append((res.status, res.body))
            state = new if new is not None else state
        assert {s for s, _ in want} == {200}
        got, state, log = [], None, bytearray()
        for seq, raw in enumerate(bodies):
            out = derender_stream_job(svc, raw, state, seq, None, None)
            if out.needs_pieces is not None:
                a, z = out.needs_pieces
                out = derender_stream_job(svc, raw, state, seq, None, None, (a, bytes(log[a:z])))
            got.append((out.status, out.body))
            if out.state is not None:
                log[out.pieces_len - len(out.append):out.pieces_len] = out.append
                state = out.state
        assert got == want, (parser, extra, n)


@pytest.mark.parametrize("ask", ["pieces", "settings"])
def test_a_core_that_keeps_asking_gets_a_500_never_an_empty_reply(ask):
    """``submit_chunk`` fetches what the core asks for at most twice; an outcome that still asks
    after that is a 500 naming why (the stream then ends), never a status-0 empty reply."""
    calls = []

    async def submit(value, state, seq, kind, created, pieces, settings):
        calls.append((pieces, settings))
        if ask == "pieces":
            return StreamOutcome(b"", 0, False, "chat-stream", None, needs_pieces=(0, 4))
        return StreamOutcome(b"", 0, False, "chat-stream", None, needs_settings=True)

    s = LiveStream(rid="r-ask")
    s.pieces, s.pieces_at = bytearray(b"abcdef"), 0
    s.settings = b"s" * 4096  # over SETTINGS_SEND_MAX: sent only when asked
    msg = SimpleNamespace(value=b'{"model": "m"}', timestamp=0, topic="t", partition=0, offset=1, headers=())
    out = asyncio.run(submit_chunk(SimpleNamespace(submit=submit), None, OutageClock("state store", "r-ask", 5.0), s, msg, 1, "chat-stream"))
    assert out.status == 500 and out.crash
    assert b"asked again for" in out.body and b"r-ask" in out.body
    assert len(calls) == 2  # the first ask was answered once, with what it named
    assert (calls[1][0] == (0, b"abcd")) if ask == "pieces" else (calls[1][1] == s.settings)
