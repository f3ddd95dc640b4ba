"""Wire contract of the Anthropic Messages API derender (``/v1/messages``, issue 26): the request
fields a derender reads, the ``Message``, its content blocks, every stream event the derender
emits, Anthropic's error object and the two derender bodies.

Sources: Anthropic's Messages API reference ("Create a Message", "Streaming messages",
"Errors"), anthropic-sdk-python ``types/`` (``Message``, ``TextBlock``, ``ThinkingBlock``,
``ToolUseBlock``, ``Raw*Event``, ``shared/error_object.py``) and vLLM 0.32's
``vllm/entrypoints/anthropic/protocol.py`` (its ``AnthropicMessagesRequest``); the shapes the
parity reference (``tests/data/parity/messages_public.jsonl``) shows: a Message always carries
``stop_sequence`` (R1), a thinking ``content_block_start`` carries ``"signature": ""`` (R2).

Rules: as ``schemas`` (unknown request fields accepted and ignored, ``None`` == missing, every
integer bounded on decode); Message and event Structs encode every field, ``null`` included.
The derender bodies mirror the Responses ones with ``messages_request`` in place of
``responses_request``.
"""
from __future__ import annotations

from typing import Any, Literal

from msgspec import Struct, field

from schemas import GenerateTokensResponse, GenerateTokensStreamResponse, Int64

__all__ = [
    "MessagesRequest", "DerenderMessagesRequest", "DerenderMessagesStreamRequest",
    "TextBlock", "ThinkingBlock", "ToolUseBlock", "ContentBlock", "MessageUsage", "Message",
    "TextDelta", "ThinkingDelta", "SignatureDelta", "InputJSONDelta", "BlockDelta", "MessageDeltaBody",
    "MessageStartEvent", "ContentBlockStartEvent", "ContentBlockDeltaEvent", "ContentBlockStopEvent",
    "MessageDeltaEvent", "MessageStopEvent", "MessageStreamEvent", "AnthropicErrorInfo", "AnthropicError",
    "STOP_REASONS", "MESSAGES_MESSAGE_TYPES",
]

#: Anthropic ``stop_reason`` values a derender gives (``refusal`` / ``pause_turn`` never)
STOP_REASONS = ("end_turn", "max_tokens", "stop_sequence", "tool_use")


# ---------------------------------------------------------------------------- request side ---
class MessagesRequest(Struct, kw_only=True):
    """The Anthropic ``POST /v1/messages`` request fields a derender reads (all others are
    accepted and ignored: the prompt side is already rendered).

    Read: ``messages`` (only the tool ids of its history: a template rule, Mistral),
    ``tools`` (``{name, description, input_schema}``), ``tool_choice`` (``{"type": "auto" |
    "any" | "none" | "tool", "name", "disable_parallel_tool_use"}``), ``thinking``
    (``{"type": "enabled", "budget_tokens"}`` / ``{"type": "disabled"}`` / ``{"type":
    "adaptive"}``), ``stop_sequences``, ``max_tokens``, ``stream``. Kept as given: ``model``,
    ``system``, ``temperature``, ``top_p``, ``top_k``, ``metadata``."""

    model: str | None = None
    messages: list[Any] | None = None
    system: Any = None
    max_tokens: Int64 | None = None
    stop_sequences: list[str] | None = None
    stream: bool | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: Int64 | None = None
    metadata: dict[str, Any] | None = None


class DerenderMessagesRequest(Struct, kw_only=True):
    """Non-streaming Messages derender body: ``model``, the engine's ``generate_response``
    (exactly one choice: a Message has one output), ``prompt_tokens`` (usage
    ``input_tokens``), ``prompt_token_ids`` (seed the detokenizer and the parsers) and
    ``messages_request`` (the original request; required when a parser is configured)."""

    model: str
    generate_response: GenerateTokensResponse
    stream: bool = False
    prompt_tokens: Int64 | None = None
    prompt_token_ids: list[Int64] | None = None
    messages_request: MessagesRequest | None = None


class DerenderMessagesStreamRequest(Struct, kw_only=True):
    """One streaming Messages chunk body: ``{stream: true, model, generate_chunk,
    prompt_tokens, prompt_token_ids, messages_request}``. ``messages_request`` is required on a
    request's first chunk; a later chunk may omit it, and when it carries one its raw bytes'
    digest must equal the first chunk's (else 400): it is never decoded again."""

    model: str
    generate_chunk: GenerateTokensStreamResponse
    stream: bool = True
    prompt_tokens: Int64 | None = None
    prompt_token_ids: list[Int64] | None = None
    messages_request: MessagesRequest | None = None


# -------------------------------------------------------------------------- content blocks ---
class TextBlock(Struct, kw_only=True, tag="text", tag_field="type"):
    """``{"type": "text", "text"}``."""

    text: str = ""


class ThinkingBlock(Struct, kw_only=True, tag="thinking", tag_field="type"):
    """``{"type": "thinking", "thinking", "signature"}`` (``signature`` ``""`` only in a
    ``content_block_start``: R2)."""

    thinking: str = ""
    signature: str = ""


class ToolUseBlock(Struct, kw_only=True, tag="tool_use", tag_field="type"):
    """``{"type": "tool_use", "id", "name", "input"}`` (``input`` ``{}`` in a
    ``content_block_start``)."""

    id: str
    name: str
    input: dict[str, Any] = field(default_factory=dict)


ContentBlock = TextBlock | ThinkingBlock | ToolUseBlock


class MessageUsage(Struct, kw_only=True):
    """``usage``: ``input_tokens`` = the prompt's ids, ``output_tokens`` = every generated id."""

    input_tokens: Int64 = 0
    output_tokens: Int64 = 0


class Message(Struct, kw_only=True, tag="message", tag_field="type"):
    """An Anthropic ``Message`` (``role`` ``assistant``); ``stop_sequence`` always present (R1)."""

    id: str
    role: Literal["assistant"] = "assistant"
    content: list[ContentBlock] = field(default_factory=list)
    model: str = ""
    stop_reason: Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"] | None = None
    stop_sequence: str | None = None
    usage: MessageUsage = field(default_factory=MessageUsage)


# ---------------------------------------------------------------------------------- events ---
class TextDelta(Struct, kw_only=True, tag="text_delta", tag_field="type"):
    """``text_delta`` (never empty)."""

    text: str


class ThinkingDelta(Struct, kw_only=True, tag="thinking_delta", tag_field="type"):
    """``thinking_delta`` (never empty)."""

    thinking: str


class SignatureDelta(Struct, kw_only=True, tag="signature_delta", tag_field="type"):
    """``signature_delta``: a thinking block's signature, right before its ``content_block_stop``."""

    signature: str


class InputJSONDelta(Struct, kw_only=True, tag="input_json_delta", tag_field="type"):
    """``input_json_delta``: the next piece of a tool_use block's input JSON (never empty)."""

    partial_json: str


BlockDelta = TextDelta | ThinkingDelta | SignatureDelta | InputJSONDelta


class MessageDeltaBody(Struct, kw_only=True):
    """``message_delta.delta``."""

    stop_reason: Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"] | None = None
    stop_sequence: str | None = None


class MessageStartEvent(Struct, kw_only=True, tag="message_start", tag_field="type"):
    """``message_start``: the Message with no content, no stop reason, ``output_tokens`` 0."""

    message: Message


class ContentBlockStartEvent(Struct, kw_only=True, tag="content_block_start", tag_field="type"):
    """``content_block_start``: ``index`` = the block's position in the final ``content``."""

    index: Int64
    content_block: ContentBlock


class ContentBlockDeltaEvent(Struct, kw_only=True, tag="content_block_delta", tag_field="type"):
    """``content_block_delta``."""

    index: Int64
    delta: BlockDelta


class ContentBlockStopEvent(Struct, kw_only=True, tag="content_block_stop", tag_field="type"):
    """``content_block_stop``."""

    index: Int64


class MessageDeltaEvent(Struct, kw_only=True, tag="message_delta", tag_field="type"):
    """``message_delta``: the stop reason and the final usage (``input_tokens`` repeated, as vLLM)."""

    delta: MessageDeltaBody
    usage: MessageUsage


class MessageStopEvent(Struct, kw_only=True, tag="message_stop", tag_field="type"):
    """``message_stop``: the last event of a stream."""


#: every stream event the derender emits (a stream reply is a JSON list of these; no ``ping``)
MessageStreamEvent = (
    MessageStartEvent | ContentBlockStartEvent | ContentBlockDeltaEvent | ContentBlockStopEvent
    | MessageDeltaEvent | MessageStopEvent
)


# ----------------------------------------------------------------------------------- errors ---
class AnthropicErrorInfo(Struct, kw_only=True):
    """``error``: ``type`` (``invalid_request_error`` for 400, 409 and 413, ``not_found_error``
    404, ``api_error`` 500, ...) and ``message``."""

    type: str
    message: str


class AnthropicError(Struct, kw_only=True, tag="error", tag_field="type"):
    """Anthropic's error object ``{"type": "error", "error": {"type", "message"}}`` (the
    reference's R6; anthropic-sdk-python ``ErrorResponse``)."""

    error: AnthropicErrorInfo


#: the Messages message types, by JSON Schema file name (merged into ``schemas.MESSAGE_TYPES``)
MESSAGES_MESSAGE_TYPES: dict[str, Any] = {
    "MessagesRequest": MessagesRequest,
    "DerenderMessagesRequest": DerenderMessagesRequest,
    "DerenderMessagesStreamRequest": DerenderMessagesStreamRequest,
    "Message": Message,
    "MessageStreamEvent": list[MessageStreamEvent],
    "AnthropicError": AnthropicError,
}
