"""The non-streaming Response without logprobs, built straight from its one parser step (issue 25
item 2): ``derender_responses`` detokenizes the whole output once and feeds the parser stack once
plus its ``finish``; this module turns those two deltas into output items as the quiet event
builder would (``ItemPlan``: ``events.EventBuilder.feed`` / ``_calls`` / ``_close`` without
logprobs, held text or argument shaping), without the stream state, the builder, its item log
and the open-item bookkeeping.

When (``response``; otherwise None and the caller takes the builder): no logprobs asked
(``include``), a tool parser whose arguments are neither shaped (``argshape.SHAPED_PARSERS``)
nor cut by the engine rules (``argshape.ENGINE_PARSERS``, which also hold text under
``tool_choice: none``). The Response is then byte-identical to the builder's
(tests/test_responses_one_step.py, random outputs and requests against the builder path).
The Messages one-step view (``worker.core.messages.onestep``) plans its blocks with the same
``ItemPlan``.
"""
from __future__ import annotations

from typing import Any

import msgspec

from schemas.responses import (
    FunctionCallItem,
    IncompleteDetails,
    InputTokensDetails,
    OutputMessage,
    OutputText,
    OutputTokensDetails,
    ReasoningItem,
    ReasoningText,
    ResponseObject,
    ResponsesRequest,
    ResponseUsage,
)
from worker.core.derender import ModelRuntime, effective_skip_special_tokens
from worker.core.detokenize import detokenize_with_stop, stop_token_trimmed
from worker.core.responses import argshape
from worker.core.responses.echo import parser_context, response_head, wants_logprobs
from worker.core.responses.ids import call_id, item_id
from worker.parsers.base import Delta
from worker.parsers.idscan import has_special

__all__ = ["ItemPlan", "whole_deltas", "response"]

#: ``ItemPlan`` item kinds (the Responses item types)
REASONING, MESSAGE, CALL = "reasoning", "message", "function_call"


class ItemPlan:
    """The quiet event builder's output items for a sequence of parser deltas, without logprobs,
    held text or argument shaping (``events.EventBuilder.feed`` / ``_calls``): ``items`` holds
    ``[kind, text parts, name, tool index, call number]`` per item in output order (kind
    ``REASONING`` / ``MESSAGE`` / ``CALL``; name, index and number for calls only, else
    ``""``, -1, -1); ``calls``: call items opened. The rules: a step's reasoning, then its
    content, then its call fragments; a kind change opens a new item; a named fragment (or
    another parser index) opens a new call; a merged step (text after an open call's end) sends
    the open call's fragments first."""

    __slots__ = ("items", "calls")

    def __init__(self) -> None:
        self.items: list[list[Any]] = []
        self.calls = 0

    def _text(self, kind: str, text: str) -> None:
        items = self.items
        if not items or items[-1][0] != kind:
            items.append([kind, [], "", -1, -1])
        items[-1][1].append(text)

    def _calls(self, tool_calls: list) -> None:
        items = self.items
        for tc in tool_calls:
            o = items[-1] if items else None
            if tc.name is not None or o is None or o[0] != CALL or o[3] != tc.index:
                o = [CALL, [], tc.name or "", tc.index, self.calls]
                items.append(o)
                self.calls += 1
            if tc.arguments:
                o[1].append(tc.arguments)

    def feed(self, d: Delta) -> None:
        """Add one parser step's delta."""
        calls = d.tool_calls
        items = self.items
        if calls and (d.reasoning or d.content) and items and items[-1][0] == CALL:
            k = 0  # a merged step: the open call's fragments first (``EventBuilder.feed``)
            while k < len(calls) and calls[k].name is None and calls[k].index == items[-1][3]:
                k += 1
            self._calls(calls[:k])
            calls = calls[k:]
        if d.reasoning:
            self._text(REASONING, d.reasoning)
        if d.content:
            self._text(MESSAGE, d.content)
        if calls:
            self._calls(calls)


def whole_deltas(rt: ModelRuntime, ctx: Any, mode: str, skip: bool, text_ids: list[int], stop_ids: list[int],
                 prompt_ids: list[int] | None) -> tuple[Delta, Delta]:
    """The one parser step of a whole output: ``(feed delta, finish delta)`` of ``text_ids``
    detokenized at once (``detokenize_with_stop``, seeded with ``prompt_ids``) and fed with
    ``stop_ids`` (the stop token, to a parser that reads it) to a fresh streaming-form stack
    state for request context ``ctx`` and tool mode ``mode``; special ids left out of the ids
    the parsers see when ``skip`` (``_step``'s rule). Without parsers: the text as content."""
    tok = rt.tokenizer
    text = detokenize_with_stop(tok, text_ids, (), skip_special_tokens=skip,
                                prompt_token_ids=prompt_ids or [])[0] if text_ids else ""
    if not rt.has_parser:
        return Delta(content=text), Delta()
    pids = text_ids + stop_ids if stop_ids else text_ids
    if skip and has_special(tok, pids):  # (C-level test first)
        special = tok.special_ids
        pids = [t for t in pids if t not in special]
    stack = rt.stack
    st = stack.initial_state(ctx, streaming=True, mode=mode)
    d = stack.feed(st, text, pids) if (text or pids) else Delta()
    return d, stack.finish(st)


def response(rt: ModelRuntime, req: ResponsesRequest, *, request_id: str, model: str, created: int,
             prompt_ids: list[int] | None, prompt_tokens: int | None, kv: dict | None, ec: dict | None,
             c: Any) -> ResponseObject | None:
    """The final Response of generate choice ``c`` (validated, its ids in the vocabulary) as
    ``derender._step`` over one whole-output chunk and ``EventBuilder.finish`` give it, or None
    when the request or the parsers are not one for this path (module docstring). ``created``:
    the ``created_at`` Unix seconds; ``prompt_tokens`` None: ``len(prompt_ids)``."""
    cfg = rt.config
    if wants_logprobs(req) or cfg.tool_parser in argshape.SHAPED_PARSERS or \
            cfg.tool_parser in argshape.ENGINE_PARSERS:
        return None
    stack = rt.stack
    tok = rt.tokenizer
    ctx = parser_context(req, prompt_ids)
    mode = stack.tool_mode(ctx)
    skip = effective_skip_special_tokens(rt, req.skip_special_tokens, mode)
    ids = list(c.token_ids or [])
    fin = c.finish_reason or "stop"
    text_ids = stop_token_trimmed(ids, fin, c.stop_reason, tok.eos_token_ids)
    stop_ids = ids[len(text_ids):] if stack.wants_stop_token else []
    d, f = whole_deltas(rt, ctx, mode, skip, text_ids, stop_ids, prompt_ids)
    plan = ItemPlan()
    plan.feed(d)
    plan.feed(f)
    reasoning_tokens = d.reasoning_tokens + f.reasoning_tokens
    incomplete = fin == "length"
    fmt = stack.id_format
    output: list[Any] = []
    last = len(plan.items) - 1
    for i, (kind, parts, name, _index, number) in enumerate(plan.items):
        iid = item_id(request_id, i, kind)
        status = "incomplete" if incomplete and i == last else "completed"
        if kind == MESSAGE:
            output.append(OutputMessage(id=iid, content=[OutputText(text="".join(parts))], status=status))
        elif kind == REASONING:
            output.append(ReasoningItem(id=iid, content=[ReasoningText(text="".join(parts))], status=status))
        else:
            output.append(FunctionCallItem(id=iid, call_id=call_id(request_id, number, fmt), name=name,
                                           arguments="".join(parts), status=status))
    n_prompt = prompt_tokens if prompt_tokens is not None else len(prompt_ids or [])
    usage = ResponseUsage(input_tokens=n_prompt, input_tokens_details=InputTokensDetails(), output_tokens=len(ids),
                          output_tokens_details=OutputTokensDetails(reasoning_tokens=reasoning_tokens),
                          total_tokens=n_prompt + len(ids))
    head = response_head(rt, req, response_id=request_id, model=model, created_at=created,
                         kv_transfer_params=kv, ec_transfer_params=ec)
    return msgspec.structs.replace(
        head, output=output, status="incomplete" if incomplete else "completed",
        incomplete_details=IncompleteDetails(reason="max_output_tokens") if incomplete else None, usage=usage)
