"""Messages stream events from the shared event builder, and the SDK's accumulation of them.

The Responses event builder (``worker.core.responses.events.EventBuilder``) already turns the
parser stack's deltas into items that open on their first delta, in the order the parser emits
them, and close when another kind starts or the output ends, with vLLM's stream rules
(llama3_json argument shaping, the parser engine's cut call and ``tool_choice: none`` hold:
``worker.core.responses.argshape``). A Messages content block is exactly one such item
(reasoning -> ``thinking``, message -> ``text``, function_call -> ``tool_use``; ``index`` =
``output_index`` = position in the final ``content``), so ``translate`` maps its events one to
one (``to_messages``):

* ``response.created`` -> ``message_start`` (no content, ``stop_reason`` null, ``output_tokens`` 0);
* ``output_item.added`` -> ``content_block_start`` (thinking ``{"thinking": "", "signature": ""}``:
  R2; tool_use ``{"id", "name", "input": {}}``);
* ``*.delta`` -> ``content_block_delta`` (``thinking_delta`` / ``text_delta`` / ``input_json_delta``;
  the builder never emits an empty delta);
* ``output_item.done`` -> (thinking: ``signature_delta``) ``content_block_stop``;
* ``response.completed`` / ``.incomplete`` -> ``message_delta`` (``stop_reason``, ``stop_sequence``,
  usage) and ``message_stop``; the other Responses events have no Messages counterpart (no ``ping``).

``accumulate`` is anthropic-sdk-python's ``accumulate_event`` (``lib/streaming/_messages.py``):
the non-streaming Message is the accumulation of the same events (one parse, two views: R3).
``message_of`` builds that Message from the builder's closed items without the events (a block's
text is its item's, which is the join of the item's deltas; a tool_use ``input`` the partial
parse of the call's arguments, the join of its ``input_json_delta``).
"""
from __future__ import annotations

import json
import re
from typing import Any

import msgspec
import partial_json_parser
from partial_json_parser.core.options import Allow

from schemas.messages import (
    ContentBlockDeltaEvent,
    ContentBlockStartEvent,
    ContentBlockStopEvent,
    InputJSONDelta,
    Message,
    MessageDeltaBody,
    MessageDeltaEvent,
    MessageStartEvent,
    MessageStopEvent,
    MessageUsage,
    SignatureDelta,
    TextBlock,
    TextDelta,
    ThinkingBlock,
    ThinkingDelta,
    ToolUseBlock,
)
from schemas.responses import (
    FunctionCallArgumentsDelta,
    FunctionCallItem,
    OutputItemAddedEvent,
    OutputItemDoneEvent,
    OutputMessage,
    OutputTextDelta,
    ReasoningItem,
    ReasoningTextDelta,
    ResponseCompletedEvent,
    ResponseCreatedEvent,
    ResponseIncompleteEvent,
)
from worker.core.messages.ids import message_id, signature, tool_use_id

__all__ = ["Outcome", "translate", "stop_reason", "accumulate", "partial_input", "message_of"]


class Outcome(msgspec.Struct, kw_only=True):
    """What ends a Message: the engine's ``finish_reason``, the matched stop string (or None),
    ``tool_use`` (a tool_use block was opened), the usage counts."""

    finish_reason: str | None = None
    stop_sequence: str | None = None
    tool_use: bool = False
    input_tokens: int = 0
    output_tokens: int = 0


def stop_reason(o: Outcome) -> tuple[str, str | None]:
    """``(stop_reason, stop_sequence)`` by what ended the output: a cut by length is
    ``max_tokens`` even mid-call (R4), a matched stop string ``stop_sequence`` with it, a parsed
    call ``tool_use``, else ``end_turn`` (vLLM's ``_to_anthropic_stop_reason``)."""
    if o.finish_reason == "length":
        return "max_tokens", None
    if o.stop_sequence is not None:
        return "stop_sequence", o.stop_sequence
    return ("tool_use" if o.tool_use else "end_turn"), None


def translate(events: list[Any], request_id: str, model: str, fmt: str, input_tokens: int,
              outcome: Outcome | None) -> list[Any]:
    """The Messages events of one chunk's Responses events (module docstring). ``fmt``: the
    tool parser's id format (``worker.core.messages.ids``); ``input_tokens``: the prompt's
    length (``message_start``); ``outcome``: read at the terminal event (None: the chunk has
    none)."""
    out: list[Any] = []
    for ev in events:
        if isinstance(ev, (OutputTextDelta, ReasoningTextDelta, FunctionCallArgumentsDelta)):
            i = ev.output_index
            d: Any = TextDelta(text=ev.delta) if isinstance(ev, OutputTextDelta) else \
                ThinkingDelta(thinking=ev.delta) if isinstance(ev, ReasoningTextDelta) else \
                InputJSONDelta(partial_json=ev.delta)
            out.append(ContentBlockDeltaEvent(index=i, delta=d))
        elif isinstance(ev, OutputItemAddedEvent):
            i, item = ev.output_index, ev.item
            block: Any = ThinkingBlock() if isinstance(item, ReasoningItem) else \
                TextBlock() if isinstance(item, OutputMessage) else \
                ToolUseBlock(id=tool_use_id(request_id, i, item.call_id, fmt), name=item.name)
            out.append(ContentBlockStartEvent(index=i, content_block=block))
        elif isinstance(ev, OutputItemDoneEvent):
            if isinstance(ev.item, ReasoningItem):
                out.append(ContentBlockDeltaEvent(index=ev.output_index,
                                                  delta=SignatureDelta(signature=signature(request_id,
                                                                                           ev.output_index))))
            out.append(ContentBlockStopEvent(index=ev.output_index))
        elif isinstance(ev, ResponseCreatedEvent):
            out.append(MessageStartEvent(message=Message(id=message_id(request_id), model=model,
                                                         usage=MessageUsage(input_tokens=input_tokens))))
        elif isinstance(ev, (ResponseCompletedEvent, ResponseIncompleteEvent)):
            assert outcome is not None
            reason, seq = stop_reason(outcome)
            out.append(MessageDeltaEvent(delta=MessageDeltaBody(stop_reason=reason, stop_sequence=seq),
                                         usage=MessageUsage(input_tokens=outcome.input_tokens,
                                                            output_tokens=outcome.output_tokens)))
            out.append(MessageStopEvent())
    return out


_INCOMPLETE_NUMBER = re.compile(r"[0-9][.eE+-]+$")


def _encodable(obj: dict, buf: str) -> dict | None:
    """``obj`` (``buf`` parsed), or None when it holds a lone surrogate (an escaped ``\\ud83c``
    without its pair, or that character as a tool parser's ``json.dumps(..., ensure_ascii=False)``
    of a parsed call writes it): jiter raises on one (``lone leading surrogate in hex escape``),
    so the SDK keeps the block's ``input``; the reply could not encode it either. ``obj`` is
    dumped and encoded only where ``buf`` holds a ``\\u`` escape or does not encode as UTF-8
    (C-level checks otherwise)."""
    if "\\u" not in buf and (buf.isascii() or _utf8(buf)):
        return obj
    return obj if _utf8(json.dumps(obj, ensure_ascii=False)) else None


def _utf8(s: str) -> bool:
    """Whether ``s`` encodes as UTF-8 (holds no surrogate)."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def partial_input(buf: str) -> Any:
    """The SDK's partial parse of a tool_use block's joined ``input_json_delta`` (jiter
    ``from_json(partial_mode=True)``: an unfinished string, literal or number is dropped with its
    key, open objects and arrays are closed: ``{"city": "Pa`` -> ``{}``). None when the text is
    not a JSON object prefix or escapes a lone surrogate (the SDK would raise; the block keeps
    its ``input``). A complete
    JSON object is ``json.loads``'s, as ``partial_json_parser`` gives it (its ``fix_fast`` leaves
    a text whose brackets balance as it is and parses it with ``json.loads``), without its scan."""
    try:
        obj = json.loads(buf)
    except Exception:  # noqa: BLE001 - not complete JSON: the partial parse below
        obj = None
    if isinstance(obj, dict):
        return _encodable(obj, buf)
    allow = Allow.ARR | Allow.OBJ
    if not _INCOMPLETE_NUMBER.search(buf):
        allow |= Allow.NUM
    try:
        obj = partial_json_parser.loads(buf, allow)
    except Exception:  # noqa: BLE001 - any parser failure: not a JSON object prefix
        return None
    return _encodable(obj, buf) if isinstance(obj, dict) else None


def accumulate(events: list[Any]) -> Message:
    """The Message anthropic-sdk-python's stream accumulation builds from ``events`` (a whole
    stream, ``message_start`` first). Raises ``ValueError`` without a ``message_start``."""
    msg: Message | None = None
    bufs: dict[int, str] = {}
    for ev in events:
        if isinstance(ev, MessageStartEvent):
            msg = msgspec.structs.replace(ev.message, content=list(ev.message.content))
            continue
        if msg is None:
            raise ValueError("a Messages stream starts with message_start")
        if isinstance(ev, ContentBlockStartEvent):
            msg.content.append(msgspec.structs.replace(ev.content_block))
        elif isinstance(ev, ContentBlockDeltaEvent):
            block, d = msg.content[ev.index], ev.delta
            if isinstance(d, TextDelta):
                block.text += d.text
            elif isinstance(d, ThinkingDelta):
                block.thinking += d.thinking
            elif isinstance(d, SignatureDelta):
                block.signature = d.signature
            else:  # parsed once, at the block's stop (the SDK parses after every delta: same last value)
                bufs[ev.index] = bufs.get(ev.index, "") + d.partial_json
        elif isinstance(ev, ContentBlockStopEvent) and ev.index in bufs:
            parsed = partial_input(bufs.pop(ev.index))
            if parsed is not None:
                msg.content[ev.index].input = parsed
        elif isinstance(ev, MessageDeltaEvent):
            msg.stop_reason, msg.stop_sequence = ev.delta.stop_reason, ev.delta.stop_sequence
            msg.usage = MessageUsage(input_tokens=ev.usage.input_tokens, output_tokens=ev.usage.output_tokens)
    if msg is None:
        raise ValueError("a Messages stream starts with message_start")
    for i, buf in bufs.items():  # a block the events never stopped (not in a whole stream)
        parsed = partial_input(buf)
        if parsed is not None:
            msg.content[i].input = parsed
    return msg


def message_of(items: list[Any], request_id: str, model: str, fmt: str, outcome: Outcome) -> Message:
    """The Message ``accumulate(translate(events, ...))`` gives for a whole stream whose builder
    closed ``items`` (the terminal Response's ``output``: item ``i`` is block ``i``), without
    building the events. Not for a stream whose events were edited after the builder
    (``derender._merge_final_arguments``: shaped arguments)."""
    content: list[Any] = []
    for i, it in enumerate(items):
        if isinstance(it, ReasoningItem):
            content.append(ThinkingBlock(thinking=it.content[0].text, signature=signature(request_id, i)))
        elif isinstance(it, OutputMessage):
            content.append(TextBlock(text=it.content[0].text))
        else:
            assert isinstance(it, FunctionCallItem)
            block = ToolUseBlock(id=tool_use_id(request_id, i, it.call_id, fmt), name=it.name)
            if it.arguments:
                parsed = partial_input(it.arguments)
                if parsed is not None:
                    block.input = parsed
            content.append(block)
    reason, seq = stop_reason(outcome)
    return Message(id=message_id(request_id), model=model, content=content, stop_reason=reason, stop_sequence=seq,
                   usage=MessageUsage(input_tokens=outcome.input_tokens, output_tokens=outcome.output_tokens))
