"""Responses API parity cases and their pinned pass/fail sets, shared by the Responses test
modules (``tests/test_responses*.py``, ``tests/test_batch_ray.py``)."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.parity_tools import responses_to_requests as r2r

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "parity"
CASES_PATH = DATA / "responses_public.jsonl"
MODELS = DATA / "responses_models.json"
CASES = r2r.load_cases(str(CASES_PATH), None)
#: two Responses function tools (``get_weather(city)``, ``search(q)``), the generated bodies' tools
TOOLS = [{"type": "function", "name": "get_weather", "description": "w",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
         {"type": "function", "name": "search", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}]
#: text pieces of hostile outputs (``parsers.pieces_ids``): words, JSON and call fragments, markers
HOSTILE_PIECES = ["hello", " world", "\n", "\n\n", " ", "😀", "東京", "é", "{", "}", '"name"', ": ", '"get_weather"',
                  ', "arguments": ', '{"city": "Paris"}', '{"name": "get_weather", "arguments": {"city": "P"}}',
                  '[{"name": "search", "arguments": {"q": "x"}}]', "<", "</", "%s", "\\", '"', "<think>", "</think>",
                  "<tool_call>", "</tool_call>", "[TOOL_CALLS]", "<|python_tag|>"]
BY_ID = {c["id"]: c for c in CASES}

#: The 4 streams whose delta boundaries came from engine timing (vLLM's
#: ``RequestOutputCollector.put`` merging engine outputs the server had not consumed yet) are fed
#: the same merged outputs: the reference's ``stream_chunks`` lists them (README "Responses API"),
#: ``responses_to_requests.chunk_sizes`` reads it, so no case is pinned (issue 26 item 6).


def chat_corpus_outputs() -> Iterator[tuple[dict, Any, list[int], list[int], list[dict], Any, dict | None]]:
    """The parity corpus' chat outputs as Responses inputs: ``(case, runtime, prompt ids, output
    ids, Responses tools, tool_choice, extra request fields)`` of each chat case whose parsers
    exist and whose ids lie in its model's vocabulary (the parity service's runtimes). The chat
    tools and a named ``tool_choice`` in the Responses shape; ``chat_template_kwargs`` carried
    over."""
    from tests.parity import corpus, missing_parser, service
    from tests.parity_tools.to_requests import nonstream_body
    svc = service()
    for case in corpus():
        body = nonstream_body(case) if case["endpoint"] == "chat" and not missing_parser(case) else None
        if body is None or "chat_request" not in body:
            continue
        rt = svc.runtime(case["model"])
        ids = body["generate_response"]["choices"][0]["token_ids"]
        if not ids or max(ids) >= rt.tokenizer.vocab_size or min(ids) < 0:
            continue
        req = body["chat_request"]
        tools = [dict(type="function", **t["function"]) for t in req.get("tools") or [] if t.get("type") == "function"]
        tc = req.get("tool_choice")
        if isinstance(tc, dict):
            tc = {"type": "function", "name": tc["function"]["name"]}
        extra = {"chat_template_kwargs": req["chat_template_kwargs"]} if req.get("chat_template_kwargs") else None
        yield case, rt, body.get("prompt_token_ids") or [], ids, tools, tc, extra
