"""The request side of a Messages derender: validation (vLLM 0.32's Messages semantics and the
reference's facts, ``tests/data/parity/messages_public.jsonl``) and the parsers' view of the
request.

vLLM maps an Anthropic request to its chat request (``vllm/entrypoints/anthropic/serving``):
``tools`` -> function tools (``input_schema`` as ``parameters``), ``tool_choice`` ``auto`` /
``any`` / ``none`` / ``{"type": "tool", "name"}`` -> ``auto`` / ``required`` / ``none`` / the
named function, ``disable_parallel_tool_use`` -> ``parallel_tool_calls: false``, ``thinking``
``{"type": "disabled"}`` -> ``chat_template_kwargs.enable_thinking: false`` (the reasoning
parser off: everything is text), ``enabled`` / ``adaptive`` / absent -> the template default,
``stop_sequences`` -> ``stop``.
"""
from __future__ import annotations

import re
from typing import Any

from schemas.messages import MessagesRequest
from worker.core.derender import ModelRuntime, check_request_numbers
from worker.core.errors import BadRequest
from worker.parsers.base import RequestContext

__all__ = ["DEFAULT_REQUEST", "AUTO_TOOL_CHOICE_ERROR", "MISTRAL_TOOL_ID_ERROR", "parser_context", "stop_strings",
           "check_messages_request"]

DEFAULT_REQUEST = MessagesRequest()

#: vLLM's refusal of tools on a server without a tool parser (``tool_choice`` defaults to auto)
AUTO_TOOL_CHOICE_ERROR = '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
#: the Mistral chat template's ``raise_exception`` for a history tool id that is not 9 alphanumerics
MISTRAL_TOOL_ID_ERROR = "Tool call IDs should be alphanumeric strings with length 9!"

_ALNUM9 = re.compile(r"[A-Za-z0-9]{9}")


def _chat_tool_choice(tc: dict[str, Any] | None) -> Any:
    """Anthropic ``tool_choice`` -> the chat form the parsers read."""
    if tc is None:
        return None
    typ = tc.get("type")
    if typ == "any":
        return "required"
    if typ == "tool" and isinstance(tc.get("name"), str):
        return {"type": "function", "function": {"name": tc["name"]}}
    if typ in ("auto", "none"):
        return typ
    raise BadRequest(f"tool_choice.type must be auto, any, tool or none, not {typ!r}",
                     param="messages_request.tool_choice")


def _chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    out = []
    for t in tools or []:
        if not isinstance(t.get("name"), str):
            continue  # a server tool (no custom function): never parsed into a call
        fn = {"name": t["name"], "parameters": t.get("input_schema")}
        if isinstance(t.get("description"), str):
            fn["description"] = t["description"]
        out.append({"type": "function", "function": fn})
    return out or None


def parser_context(req: MessagesRequest, prompt_ids: list[int] | None) -> RequestContext:
    """The parsers' view of a Messages request (module docstring)."""
    tc = req.tool_choice
    thinking = req.thinking or {}
    return RequestContext(
        tools=_chat_tools(req.tools), tool_choice=_chat_tool_choice(tc),
        parallel_tool_calls=not (isinstance(tc, dict) and tc.get("disable_parallel_tool_use") is True),
        chat_template_kwargs={"enable_thinking": False} if thinking.get("type") == "disabled" else None,
        prompt_token_ids=prompt_ids)


def stop_strings(req: MessagesRequest) -> list[str]:
    """The request's non-empty ``stop_sequences``."""
    return [s for s in (req.stop_sequences or []) if s]


def _history_tool_ids(messages: list[Any] | None):
    for m in messages or []:
        content = m.get("content") if isinstance(m, dict) else None
        for block in content if isinstance(content, list) else []:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "tool_use":
                yield block.get("id")
            elif block.get("type") == "tool_result":
                yield block.get("tool_use_id")


def check_messages_request(rt: ModelRuntime, req: MessagesRequest | None, prompt_tokens: int | None) -> None:
    """Request-level checks: ``messages_request`` required when a parser is configured; tools
    with ``tool_choice`` auto (or absent) on a model without a tool parser and
    ``--enable-auto-tool-choice`` (vLLM's 400); a history tool id that is not 9 alphanumerics
    under a tool parser with ``alnum9`` ids (the Mistral template's refusal); ``max_tokens``
    not negative; ``stop_sequences`` and ``prompt_tokens`` bounded (``check_request_numbers``).
    Raises ``BadRequest``."""
    if req is None:
        if rt.has_parser:
            raise BadRequest("messages_request is required when a tool or reasoning parser is configured "
                             "(plain detokenization would leak parser markup into the output)",
                             param="messages_request")
        req = DEFAULT_REQUEST
    stack = rt.stack
    tc = req.tool_choice
    if req.tools and (tc is None or tc.get("type") == "auto") and not (
            stack.tool is not None and stack.enable_auto_tool_choice):
        raise BadRequest(AUTO_TOOL_CHOICE_ERROR, param="messages_request.tool_choice")
    _chat_tool_choice(tc)
    if stack.id_format == "alnum9":
        for tid in _history_tool_ids(req.messages):
            if not (isinstance(tid, str) and _ALNUM9.fullmatch(tid)):
                raise BadRequest(MISTRAL_TOOL_ID_ERROR, param="messages_request.messages")
    if req.max_tokens is not None and req.max_tokens < 0:
        raise BadRequest(f"max_tokens ({req.max_tokens}) must not be negative", param="messages_request.max_tokens")
    check_request_numbers(rt, n=None, top_logprobs=None, min_tokens=None, prompt_tokens=[prompt_tokens],
                          logprobs_param="top_logprobs", stop=req.stop_sequences)
