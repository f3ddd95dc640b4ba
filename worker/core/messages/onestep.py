"""The non-streaming Message in one parser step (issue 25 item 2), as chat parses a choice: one
detokenization of the whole output, one ``ParserStack.feed`` and its ``finish``, and the
content blocks built from those two deltas in the event builder's order, without the stream
state, the builder, its item log or the segments' steps of ``derender.derender_messages``.

When (``message``; otherwise None and the caller takes the stream's parse): a
``_PARSERS`` pair, no stop string (``stop_sequences``), no rule that reads a step's text (the
Qwen3 tag hold under ``thinking: disabled``), no parser that reads the stop token, tool mode
``auto`` or ``off``; under ``auto`` the output's added tokens must make the segments' steps
equal to one (``shape_ok``). Under ``off`` the stream's parse is already one step. The blocks
then come out as from ``derender._step`` over the same deltas (``responses.onestep.ItemPlan``:
the builder's rules for a quiet, logprob-free item list; ``rules.TEXT_DROPPED_AFTER_CALL`` on
the finish), and the Message as ``events.message_of`` builds it from the builder's items: byte-identical
(tests/test_messages_one_step.py, random Qwen3 outputs against the segmented path).
"""
from __future__ import annotations

import weakref
from typing import Any

from schemas.messages import Message, MessagesRequest, MessageUsage, TextBlock, ThinkingBlock, ToolUseBlock
from worker.core.derender import ModelRuntime, effective_skip_special_tokens
from worker.core.detokenize import stop_token_trimmed
from worker.core.messages import rules
from worker.core.messages.events import Outcome, partial_input, stop_reason
from worker.core.messages.ids import message_id, signature, tool_use_id
from worker.core.messages.request import parser_context
from worker.core.responses.ids import call_id
from worker.core.responses.onestep import MESSAGE, REASONING, ItemPlan, whole_deltas
from worker.parsers.idscan import id_text, runs_pattern

__all__ = ["PARSERS", "shape_ok", "message"]

#: the (tool parser, reasoning parser) pairs whose Message ``message`` may build in one step:
#: ``shape_ok``'s argument holds for their rules (hermes emits a call only when its block closes
#: or at the finish; qwen3's reasoning ends for good at an explicit ``</think>``)
PARSERS = frozenset({("hermes", "qwen3"), ("hermes", None)})

#: tokenizer -> ``(added-id pattern, tool start id, tool end id)``, or None when a hermes marker
#: is not one added token (no one-step view); built once
_MARKS: weakref.WeakKeyDictionary[object, tuple[Any, int, int] | None] = weakref.WeakKeyDictionary()


def _marks(rt: ModelRuntime) -> tuple[Any, int, int] | None:
    tok = rt.tokenizer
    try:
        return _MARKS[tok]
    except KeyError:
        pass
    except TypeError:  # not weak-referenceable
        return None
    tool = rt.stack.tool
    added = tok.added_token_ids
    ts, te = tok.token_to_id(tool.starts[0]), tok.token_to_id(tool.ends[0])
    p = runs_pattern(added)
    ok = p is not None and len(tool.starts) == len(tool.ends) == 1 and ts in added and te in added and ts != te
    m = _MARKS[tok] = (p, ts, te) if ok else None
    return m


def shape_ok(rt: ModelRuntime, s: str, ids: list[int], finish_reason: str, stop_reason_: Any) -> bool:
    """Whether the segments' steps of ``ids`` (``s``: their ``idscan.id_text``) under tool mode
    ``auto`` give the Message of one step: the added tokens before the last id are at most a
    reasoning start marker at position 0, reasoning end markers and either no tool-call marker
    (then ``derender._lead_merged`` leaves one step) or exactly one call block, opened after a
    reasoning end (when a reasoning parser is configured) and closed by the output's last text
    id (the last id itself, or followed only by a stop token that is not detokenized). The
    steps are then ``[<think>] + ...<tool_call>`` (merged), ``...</tool_call>`` and that stop
    token alone: the first yields no call (the block closes in the second) and ends the
    reasoning, the last one's delta is empty, so the builder sees reasoning, then text, then the
    call, as from one step, and the text-after-call rule drops nothing in either."""
    marks = _marks(rt)
    n = len(ids)
    if marks is None or n < 2:
        return False
    p, ts, te = marks
    r = rt.stack.reasoning
    rs, re_ = (r.start_ids, r.end_ids) if r is not None else (frozenset(), frozenset())
    found = p.findall(s, 0, n - 1)  # the added ids before the last, in order (as characters)
    if found and ids[0] in rs:
        found = found[1:]
    ts_c, te_c = chr(ts), chr(te)
    n_ts = found.count(ts_c)
    n_te = found.count(te_c) + (ids[-1] == te)
    if n_ts == n_te == 0:  # no call block: no cut but the leading start marker
        return all(ord(ch) in re_ and ord(ch) not in rs for ch in found)
    if n_ts != 1 or n_te != 1:
        return False
    p0 = s.find(ts_c)
    ends = 0
    for ch in found:  # the two call markers; reasoning end markers, only before the call
        k = ord(ch)
        if k in re_ and k not in rs:
            if s.find(ch, p0) >= 0:
                return False
            ends += 1
        elif k != ts and k != te:
            return False
    if r is not None and not ends:
        return False
    pe = s.find(te_c)
    if pe == n - 1:
        return p0 < pe
    return pe == n - 2 and p0 < pe and len(stop_token_trimmed(ids, finish_reason, stop_reason_,
                                                                 rt.tokenizer.eos_token_ids)) == n - 1


def message(rt: ModelRuntime, req: MessagesRequest, request_id: str, model: str, prompt_ids: list[int] | None,
            prompt_tokens: int | None, c) -> Message | None:
    """The Message of choice ``c`` (a validated generate choice, its ids in the vocabulary) in
    one step (module docstring), or None when the request or the output is not one for it."""
    cfg = rt.config
    stack = rt.stack
    if (cfg.tool_parser, cfg.reasoning_parser) not in PARSERS or stack.wants_stop_token or \
            any(req.stop_sequences or ()):
        return None
    ctx = parser_context(req, prompt_ids)
    mode = stack.tool_mode(ctx)
    if mode not in ("auto", "off") or (cfg.reasoning_parser == "qwen3" and ctx.thinking_disabled()):
        return None
    tok = rt.tokenizer
    ids = c.token_ids
    if not ids:
        return None
    fin = c.finish_reason or "stop"
    text_ids = stop_token_trimmed(ids, fin, c.stop_reason, tok.eos_token_ids)
    if mode == "auto":
        s = id_text(text_ids)  # kept: the reasoning parser's count of the same list reads it
        if s is None or not 0 <= ids[-1] < 0x110000:
            return None
        if not shape_ok(rt, s if len(text_ids) == len(ids) else s + chr(ids[-1]), ids, fin, c.stop_reason):
            return None
    d, f = whole_deltas(rt, ctx, mode, effective_skip_special_tokens(rt, True, mode), text_ids, [], prompt_ids)
    b = ItemPlan()
    b.feed(d)
    if b.calls and cfg.tool_parser in rules.TEXT_DROPPED_AFTER_CALL:
        f.content = ""
    b.feed(f)
    fmt = stack.id_format
    content: list[Any] = []
    for i, (kind, parts, name, _index, number) in enumerate(b.items):
        if kind == REASONING:
            content.append(ThinkingBlock(thinking="".join(parts), signature=signature(request_id, i)))
        elif kind == MESSAGE:
            content.append(TextBlock(text="".join(parts)))
        else:
            cid = call_id(request_id, number, fmt) if fmt == "alnum9" else ""
            block = ToolUseBlock(id=tool_use_id(request_id, i, cid, fmt), name=name)
            if parts:
                parsed = partial_input("".join(parts))
                if parsed is not None:
                    block.input = parsed
            content.append(block)
    engine_stop = c.stop_reason if fin == "stop" and isinstance(c.stop_reason, str) else None
    # an empty engine stop string is no stop sequence (``derender._outcome``: ``engine_stop or matched``)
    reason, seq = stop_reason(Outcome(finish_reason=fin, stop_sequence=engine_stop or None, tool_use=b.calls > 0))
    return Message(id=message_id(request_id), model=model, content=content, stop_reason=reason, stop_sequence=seq,
                   usage=MessageUsage(input_tokens=prompt_tokens if prompt_tokens is not None else len(prompt_ids or []),
                                      output_tokens=len(ids)))
