"""Tool markers that are special tokens reach the tool parser (vLLM's ``adjust_request`` of the
``granite4`` tool parser turns ``skip_special_tokens`` off when tools are in play).

Found by replaying vLLM's granite4 vectors through ``derender-worker batch`` with the request's
default ``skip_special_tokens: true``: the markers were stripped and the calls became content.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from worker.cli import main as cli_main

TOK = Path(__file__).resolve().parent / "data" / "test_tokenizers" / "granite4"  # <tool_call> special
OUTPUT = 'Hi <tool_call> {"name": "get_weather", "arguments": {"city": "Paris"}} </tool_call>'
TOOLS = [{"type": "function", "function": {"name": "get_weather"}}]


def _bodies(tok, model: str, tools) -> list:
    ids = tok.encode(OUTPUT)
    req = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    if tools is not None:
        req.update(tools=tools, tool_choice="auto")
    body = {"model": model, "prompt_tokens": 1, "prompt_token_ids": tok.encode("x"), "chat_request": req,
            "generate_response": {"request_id": "r", "choices": [
                {"index": 0, "token_ids": ids, "finish_reason": "stop", "stop_reason": None}]}}
    chunks = [{"stream": True, "model": model, "stream_state": None, "prompt_tokens": 1,
               "prompt_token_ids": tok.encode("x"), "chat_request": req,
               "generate_chunk": {"request_id": "s", "choices": [
                   {"index": 0, "token_ids": [t], "finish_reason": "stop" if i == len(ids) - 1 else None,
                    "stop_reason": None}]}} for i, t in enumerate(ids)]
    return [body, chunks]


@pytest.mark.parametrize("parser", ["granite4"])
def test_special_tool_markers_kept_when_tools_in_play(tmp_path, parser):
    from worker.core.tokenizers.registry import load_tokenizer

    tok = load_tokenizer(str(TOK))
    assert len(tok.encode("<tool_call>")) == 1
    cfg = tmp_path / "models.json"
    cfg.write_text(json.dumps({mode: {"tokenizer": str(TOK), "tool_parser": parser, "enable_auto_tool_choice": True,
                                      "tool_call_streaming": mode} for mode in ("whole", "incremental")}))
    lines = _bodies(tok, "whole", TOOLS) + _bodies(tok, "incremental", TOOLS) + _bodies(tok, "whole", None)
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(b) + "\n" for b in lines))
    assert cli_main(["batch", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "out.jsonl"), "--config", str(cfg),
                     "--no-progress"]) == 0
    out = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    for whole, stream in (out[0:2], out[2:4]):
        msg = whole["choices"][0]["message"]
        assert msg["content"] == "Hi " and msg["tool_calls"][0]["function"]["name"] == "get_weather"
        assert json.loads(msg["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
        deltas = [c["choices"][0]["delta"] for c in stream if c.get("choices")]
        assert "".join(d.get("content") or "" for d in deltas) == "Hi "
        calls = [tc for d in deltas for tc in d.get("tool_calls") or []]
        assert [tc["function"]["name"] for tc in calls if tc["function"].get("name")] == ["get_weather"]
        assert json.loads("".join(tc["function"].get("arguments") or "" for tc in calls)) == {"city": "Paris"}
    # no tools: skip_special_tokens stays as requested (true): the markers are skipped, as in vLLM
    plain = out[4]["choices"][0]["message"]
    assert plain["content"] == OUTPUT.replace("<tool_call>", "").replace("</tool_call>", "")
    assert not plain.get("tool_calls")
