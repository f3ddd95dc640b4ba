"""The request side of a Responses derender: validation (vLLM semantics plus the Responses
rules of issue 14), the parser context and the echo fields of the Response object.

Echo rules (what the coupled ``vllm serve`` 0.32 returns, ``tests/data/parity/responses_public.jsonl``):

* ``temperature`` / ``top_p``: the request's value, else the served model's
  ``generation_config.json`` default (vLLM's ``default_sampling_params``), else 1.0;
* ``tool_choice``: the request's value, else ``auto`` when the request has tools, else ``none``;
* ``tools``: function tools echoed with vLLM's ``FunctionTool`` defaults (``strict``,
  ``allowed_callers``, ``async``, ``defer_loading``, ``output_schema``: null); other tool types
  as sent;
* ``parallel_tool_calls`` (default true), ``background`` (false), ``service_tier`` (``auto``),
  ``truncation`` (``disabled``), ``presence_penalty`` / ``frequency_penalty`` (0.0),
  ``instructions``, ``metadata``, ``max_output_tokens``, ``max_tool_calls``, ``prompt``,
  ``reasoning``, ``text``, ``top_logprobs``, ``user``: as sent (null when absent);
* ``previous_response_id``: always null (a request that sets it is a 400);
* ``kv_transfer_params`` / ``ec_transfer_params``: the engine response's;
  ``input_messages`` / ``output_messages``: null.
"""
from __future__ import annotations

import json
import os
from functools import lru_cache
from typing import Any

from schemas.responses import LOGPROBS_INCLUDE, ResponseFunctionTool, ResponseObject, ResponsesRequest
from worker.core.derender import ModelRuntime, check_request_numbers
from worker.core.errors import BadRequest
from worker.parsers.base import RequestContext

__all__ = ["DEFAULT_REQUEST", "generation_defaults", "response_head", "parser_context", "wants_logprobs",
           "check_responses_request"]

DEFAULT_REQUEST = ResponsesRequest()


@lru_cache(maxsize=64)
def generation_defaults(tokenizer_dir: str) -> tuple[float, float]:
    """``(temperature, top_p)`` defaults of a served model: its ``generation_config.json`` (vLLM's
    ``--generation-config auto``), else ``(1.0, 1.0)``. Read once per directory; an unreadable
    file counts as absent (vLLM falls back the same way)."""
    path = os.path.join(tokenizer_dir, "generation_config.json")
    try:
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        return 1.0, 1.0
    if not isinstance(cfg, dict):
        return 1.0, 1.0
    t, p = cfg.get("temperature", 1.0), cfg.get("top_p", 1.0)
    return (float(t) if _number(t) else 1.0), (float(p) if _number(p) else 1.0)


def _number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def wants_logprobs(req: ResponsesRequest) -> bool:
    """True when ``include`` asks for ``message.output_text.logprobs``."""
    return bool(req.include) and LOGPROBS_INCLUDE in req.include


def _echo_tool(tool: dict[str, Any]) -> Any:
    if tool.get("type") != "function" or not isinstance(tool.get("name"), str):
        return tool
    desc = tool.get("description")
    return ResponseFunctionTool(name=tool["name"], parameters=tool.get("parameters"),
                                strict=tool.get("strict") if isinstance(tool.get("strict"), bool) else None,
                                description=desc if isinstance(desc, str) else None)


def response_head(rt: ModelRuntime, req: ResponsesRequest, *, response_id: str, model: str, created_at: int,
                  kv_transfer_params: dict | None = None, ec_transfer_params: dict | None = None) -> ResponseObject:
    """The Response object with every echo field set (module docstring), ``status``
    ``in_progress``, no output and no usage: what ``response.created`` carries and what the
    final response starts from."""
    temp, top_p = generation_defaults(rt.config.tokenizer)
    tools = [_echo_tool(t) for t in (req.tools or [])]
    tool_choice = req.tool_choice if req.tool_choice is not None else ("auto" if req.tools else "none")
    if kv_transfer_params is None and ec_transfer_params is None and req.instructions is None \
            and req.metadata is None and req.max_output_tokens is None and req.max_tool_calls is None \
            and req.prompt is None and req.reasoning is None and req.text is None and req.top_logprobs is None \
            and req.user is None and req.parallel_tool_calls is not False and not req.background \
            and not req.service_tier and not req.truncation and not req.presence_penalty \
            and not req.frequency_penalty:  # every other echo field is ResponseObject's default:
        return ResponseObject(  # only these keywords (msgspec matches each one, ~0.1 us apiece)
            id=response_id, created_at=created_at, model=model,
            temperature=req.temperature if req.temperature is not None else temp,
            tool_choice=tool_choice, tools=tools, top_p=req.top_p if req.top_p is not None else top_p)
    return ResponseObject(
        id=response_id, created_at=created_at, instructions=req.instructions, metadata=req.metadata, model=model,
        parallel_tool_calls=req.parallel_tool_calls is not False,
        temperature=req.temperature if req.temperature is not None else temp,
        tool_choice=tool_choice, tools=tools,
        top_p=req.top_p if req.top_p is not None else top_p,
        background=bool(req.background), max_output_tokens=req.max_output_tokens,
        max_tool_calls=req.max_tool_calls, prompt=req.prompt, reasoning=req.reasoning,
        service_tier=req.service_tier or "auto", text=req.text, top_logprobs=req.top_logprobs,
        truncation=req.truncation or "disabled", user=req.user,
        presence_penalty=req.presence_penalty or 0.0, frequency_penalty=req.frequency_penalty or 0.0,
        kv_transfer_params=kv_transfer_params, ec_transfer_params=ec_transfer_params,
    )


def _chat_tool_choice(choice: Any) -> Any:
    """Responses ``tool_choice`` -> the chat form the parsers read (``{"type": "function",
    "name": X}`` -> ``{"type": "function", "function": {"name": X}}``)."""
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def parser_context(req: ResponsesRequest, prompt_ids: list[int] | None) -> RequestContext:
    """The parsers' view of a Responses request: its function tools in chat form
    (``{"type": "function", "function": {name, description, parameters}}``), ``tool_choice``,
    ``parallel_tool_calls``, ``chat_template_kwargs``, the prompt ids."""
    tools = [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}
             for t in (req.tools or []) if isinstance(t, dict) and t.get("type") == "function"]
    # ``request_context`` of the chat request with these fields, without building that request
    # (``include_reasoning`` is the chat request's default, True)
    return RequestContext(tools=tools or None, tool_choice=_chat_tool_choice(req.tool_choice),
                          parallel_tool_calls=req.parallel_tool_calls is not False,
                          chat_template_kwargs=req.chat_template_kwargs, prompt_token_ids=prompt_ids)


def check_responses_request(rt: ModelRuntime, req: ResponsesRequest | None, prompt_tokens: int | None) -> None:
    """Request-level checks of a Responses derender body: ``previous_response_id`` is a 400
    (vLLM's ``/v1/responses/render`` refuses it; a derender is stateless about earlier
    responses); ``responses_request`` is required when a parser is configured (plain
    detokenization would leak markup, as chat's ``chat_request`` rule); ``top_logprobs`` in [0,
    ``max_logprobs``] and ``prompt_tokens`` in [0, ``max_model_len``] (``check_request_numbers``).
    Raises ``BadRequest``."""
    if req is None:
        if rt.has_parser:
            raise BadRequest("responses_request is required when a tool or reasoning parser is configured "
                             "(plain detokenization would leak parser markup into the output)",
                             param="responses_request")
        req = DEFAULT_REQUEST
    if req.previous_response_id is not None:
        raise BadRequest("previous_response_id is not supported by a derender (it is stateless about earlier "
                         "responses; vLLM's /v1/responses/render refuses it too)",
                         param="responses_request.previous_response_id")
    if req.max_output_tokens is not None and req.max_output_tokens < 0:
        raise BadRequest(f"max_output_tokens ({req.max_output_tokens}) must not be negative",
                         param="responses_request.max_output_tokens")
    check_request_numbers(rt, n=None, top_logprobs=req.top_logprobs, min_tokens=None, prompt_tokens=[prompt_tokens],
                          logprobs_param="top_logprobs")
