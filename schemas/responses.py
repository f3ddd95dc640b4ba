"""Wire contract of the Responses API derender (``/v1/responses``): the request fields a
derender reads, the ``Response`` object, its output items, usage, every streaming event type
the derender emits, and the two derender bodies.

Sources: OpenAI's Responses API reference (``Response``, ``ResponseOutputMessage``,
``ResponseReasoningItem``, ``ResponseFunctionToolCall``, the ``response.*`` streaming events,
openai-python ``types/responses``) and vLLM 0.32's ``ResponsesRequest`` / ``ResponsesResponse``
(``vllm/entrypoints/openai/responses/protocol.py``), whose extension fields
(``kv_transfer_params``, ``*_per_turn``, ``phase``, ...) the coupled server sends and the parity
reference (``tests/data/parity/responses_public.jsonl``) keeps.

Rules: as ``schemas`` (unknown request fields accepted and ignored, ``None`` == missing, every
integer bounded on decode); response and event Structs encode every field, ``null`` included,
as vLLM does. The derender bodies mirror vLLM's chat derender bodies
(``DerenderChatRequest`` / ``DerenderChatStreamRequest``) with ``responses_request`` in place of
``chat_request``.
"""
from __future__ import annotations

from typing import Any

from msgspec import Struct, field

from schemas import GenerateTokensResponse, GenerateTokensStreamResponse, Int64

__all__ = [
    "ResponsesRequest", "DerenderResponsesRequest", "DerenderResponsesStreamRequest",
    "ResponseFunctionTool", "ResponseLogprobTop", "ResponseLogprob", "DeltaLogprobTop", "DeltaLogprob",
    "OutputText", "ReasoningText", "OutputMessage", "ReasoningItem", "FunctionCallItem", "OutputItem",
    "InputTokensDetails", "OutputTokensDetails", "ResponseUsage", "IncompleteDetails", "ResponseObject",
    "ResponseLifecycleEvent", "OutputItemEvent", "ContentPartEvent", "OutputTextDeltaEvent",
    "OutputTextDoneEvent", "ReasoningTextDeltaEvent", "ReasoningTextDoneEvent",
    "FunctionCallArgumentsDeltaEvent", "FunctionCallArgumentsDoneEvent", "ResponseStreamEvent",
    "ResponseCreatedEvent", "ResponseInProgressEvent", "ResponseCompletedEvent", "ResponseIncompleteEvent",
    "OutputItemAddedEvent", "OutputItemDoneEvent", "ContentPartAddedEvent", "ContentPartDoneEvent",
    "OutputTextDelta", "OutputTextDone", "ReasoningTextDelta", "ReasoningTextDone",
    "FunctionCallArgumentsDelta", "FunctionCallArgumentsDone",
    "RESPONSES_MESSAGE_TYPES", "LOGPROBS_INCLUDE",
]

#: the ``include`` value that asks for output text logprobs (OpenAI ``ResponseIncludable``)
LOGPROBS_INCLUDE = "message.output_text.logprobs"


# ---------------------------------------------------------------------------- request side ---
class ResponsesRequest(Struct, kw_only=True):
    """The OpenAI ``POST /v1/responses`` request fields a derender reads or echoes (all others,
    ``input`` included, are accepted and ignored: the prompt side is already rendered).

    Read: ``tools`` (function tools; other tool types are echoed but never parsed into calls),
    ``tool_choice`` (``none``/``auto``/``required`` or ``{"type": "function", "name": ...}``),
    ``parallel_tool_calls``, ``include`` (``message.output_text.logprobs`` turns logprobs on),
    ``top_logprobs``, ``chat_template_kwargs`` (e.g. ``enable_thinking``: the parsers' initial
    state), ``skip_special_tokens``. Echoed into the Response: ``instructions``, ``metadata``,
    ``temperature``, ``top_p``, ``max_output_tokens``, ``max_tool_calls``, ``reasoning``,
    ``text``, ``prompt``, ``service_tier``, ``truncation``, ``background``, ``user``,
    ``presence_penalty``, ``frequency_penalty``. ``previous_response_id`` set is a 400 (vLLM's
    ``/v1/responses/render`` refuses it: a derender is stateless about earlier responses)."""

    model: str | None = None
    input: Any = None
    instructions: Any = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    include: list[str] | None = None
    top_logprobs: Int64 | None = None
    max_output_tokens: Int64 | None = None
    max_tool_calls: Int64 | None = None
    reasoning: Any = None
    text: Any = None
    metadata: Any = None
    temperature: float | None = None
    top_p: float | None = None
    user: str | None = None
    store: bool | None = None
    background: bool | None = None
    service_tier: str | None = None
    truncation: str | None = None
    prompt: Any = None
    previous_response_id: str | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    stream: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    skip_special_tokens: bool = True


class DerenderResponsesRequest(Struct, kw_only=True):
    """Non-streaming Responses derender body (mirrors ``DerenderChatRequest``): ``model``, the
    engine's ``generate_response`` (exactly one choice: the Responses API has one output),
    ``prompt_tokens`` (usage ``input_tokens``), ``prompt_token_ids`` (seed the detokenizer and the
    parsers) and ``responses_request`` (the original request; required when a parser is
    configured)."""

    model: str
    generate_response: GenerateTokensResponse
    stream: bool = False
    prompt_tokens: Int64 | None = None
    prompt_token_ids: list[Int64] | None = None
    responses_request: ResponsesRequest | None = None


class DerenderResponsesStreamRequest(Struct, kw_only=True):
    """One streaming Responses chunk body: ``{stream: true, model, generate_chunk,
    prompt_tokens, prompt_token_ids, responses_request}``. ``responses_request`` is required on
    a request's first chunk; a later chunk may omit it, and when it carries one, its raw bytes'
    digest must equal the first chunk's (else 400): the core reads this field raw
    (``worker.core.responses``), so a later chunk's request is never decoded."""

    model: str
    generate_chunk: GenerateTokensStreamResponse
    stream: bool = True
    prompt_tokens: Int64 | None = None
    prompt_token_ids: list[Int64] | None = None
    responses_request: ResponsesRequest | None = None


# ---------------------------------------------------------------------------- output items ---
class ResponseFunctionTool(Struct, kw_only=True):
    """A function tool as the Response echoes it (vLLM's ``FunctionTool`` with its defaults)."""

    name: str
    parameters: Any = None
    strict: bool | None = None
    type: str = "function"
    allowed_callers: Any = None
    # ``async`` is a Python keyword: renamed on the wire
    async_: Any = field(default=None, name="async")
    defer_loading: Any = None
    description: str | None = None
    output_schema: Any = None


class ResponseLogprobTop(Struct, kw_only=True):
    """A candidate of a final logprob entry: ``token``, its UTF-8 ``bytes``, ``logprob``."""

    token: str
    bytes: list[int]
    logprob: float


class ResponseLogprob(Struct, kw_only=True):
    """One generated token's logprob entry in a final ``output_text`` part (and
    ``response.output_text.done``): ``token`` (text this token completes; ``""`` for a partial
    UTF-8 token), ``bytes``, ``logprob``, ``top_logprobs`` (``top_logprobs`` candidates, sampled
    token first, the engine's order)."""

    token: str
    bytes: list[int]
    logprob: float
    top_logprobs: list[ResponseLogprobTop] = field(default_factory=list)


class DeltaLogprobTop(Struct, kw_only=True):
    """A candidate of a delta logprob entry (no ``bytes``: openai-python ``ResponseTextDeltaEvent``)."""

    token: str
    logprob: float


class DeltaLogprob(Struct, kw_only=True):
    """One token's logprob entry on a ``response.output_text.delta``."""

    token: str
    logprob: float
    top_logprobs: list[DeltaLogprobTop] = field(default_factory=list)


class OutputText(Struct, kw_only=True, tag="output_text", tag_field="type"):
    """``output_text`` content part of a message. ``logprobs``: ``[]`` while in progress, the
    full per-token list when logprobs were asked for, else ``null`` once done (vLLM)."""

    annotations: list[Any] = field(default_factory=list)
    text: str = ""
    logprobs: list[ResponseLogprob] | None = None


class ReasoningText(Struct, kw_only=True, tag="reasoning_text", tag_field="type"):
    """``reasoning_text`` content part of a reasoning item."""

    text: str = ""


class OutputMessage(Struct, kw_only=True, tag="message", tag_field="type"):
    """A ``message`` output item (one ``output_text`` part). ``status``: ``in_progress`` |
    ``completed`` | ``incomplete``; ``phase``: vLLM's extension, always null here."""

    id: str
    content: list[OutputText] = field(default_factory=list)
    role: str = "assistant"
    status: str = "in_progress"
    phase: Any = None


class ReasoningItem(Struct, kw_only=True, tag="reasoning", tag_field="type"):
    """A ``reasoning`` output item: ``content`` is null when added, one ``reasoning_text``
    part when done; ``summary`` always empty (no summarizer)."""

    id: str
    summary: list[Any] = field(default_factory=list)
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None
    status: str = "in_progress"


class FunctionCallItem(Struct, kw_only=True, tag="function_call", tag_field="type"):
    """A ``function_call`` output item: ``arguments`` (JSON text, ``""`` when added),
    ``call_id`` (the parser's tool call id), ``name``; ``async``/``caller``/``namespace``:
    vLLM's extension fields, null."""

    arguments: str = ""
    call_id: str = ""
    name: str = ""
    id: str = ""
    async_: Any = field(default=None, name="async")
    caller: Any = None
    namespace: Any = None
    status: str = "in_progress"


OutputItem = OutputMessage | ReasoningItem | FunctionCallItem


class InputTokensDetails(Struct, kw_only=True):
    """``usage.input_tokens_details`` (no prefix cache behind a derender: 0)."""

    cached_tokens: Int64 = 0
    cache_write_tokens: Int64 = 0
    input_tokens_per_turn: list[Int64] = field(default_factory=list)
    cached_tokens_per_turn: list[Int64] = field(default_factory=list)


class OutputTokensDetails(Struct, kw_only=True):
    """``usage.output_tokens_details``: ``reasoning_tokens`` counts the tokens the reasoning
    parser classified as reasoning (0 without one)."""

    reasoning_tokens: Int64 = 0
    tool_output_tokens: Int64 = 0
    output_tokens_per_turn: list[Int64] = field(default_factory=list)
    tool_output_tokens_per_turn: list[Int64] = field(default_factory=list)


class ResponseUsage(Struct, kw_only=True):
    """Responses ``usage``: ``input_tokens`` (the body's ``prompt_tokens``), ``output_tokens``
    (every generated token id), ``total_tokens``."""

    input_tokens: Int64 = 0
    input_tokens_details: InputTokensDetails = field(default_factory=InputTokensDetails)
    output_tokens: Int64 = 0
    output_tokens_details: OutputTokensDetails = field(default_factory=OutputTokensDetails)
    total_tokens: Int64 = 0


class IncompleteDetails(Struct, kw_only=True):
    """Why a response is ``incomplete``: ``max_output_tokens`` (the engine's ``length``)."""

    reason: str = "max_output_tokens"


class ResponseObject(Struct, kw_only=True):
    """The OpenAI ``Response`` object (vLLM 0.32 field set and order). ``status``:
    ``in_progress`` (created / in_progress events), ``completed``, ``incomplete``."""

    id: str
    created_at: Int64 = 0
    incomplete_details: IncompleteDetails | None = None
    instructions: Any = None
    metadata: Any = None
    model: str = ""
    object: str = "response"
    output: list[OutputItem] = field(default_factory=list)
    parallel_tool_calls: bool = True
    temperature: float | None = None
    tool_choice: Any = "auto"
    tools: list[Any] = field(default_factory=list)
    top_p: float | None = None
    background: bool = False
    max_output_tokens: Int64 | None = None
    max_tool_calls: Int64 | None = None
    previous_response_id: str | None = None
    prompt: Any = None
    reasoning: Any = None
    service_tier: str = "auto"
    status: str = "in_progress"
    text: Any = None
    top_logprobs: Int64 | None = None
    truncation: str = "disabled"
    usage: ResponseUsage | None = None
    user: str | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    input_messages: Any = None
    output_messages: Any = None


# --------------------------------------------------------------------------------- events ---
class ResponseLifecycleEvent(Struct, kw_only=True, tag_field="type"):
    """``response.created`` | ``response.in_progress`` | ``response.completed`` |
    ``response.incomplete``: the whole response at that point."""

    response: ResponseObject
    sequence_number: Int64


class OutputItemEvent(Struct, kw_only=True, tag_field="type"):
    """``response.output_item.added`` | ``response.output_item.done``."""

    item: OutputItem
    output_index: Int64
    sequence_number: Int64


class ContentPartEvent(Struct, kw_only=True, tag_field="type"):
    """``response.content_part.added`` | ``response.content_part.done``."""

    content_index: Int64
    item_id: str
    output_index: Int64
    part: OutputText | ReasoningText
    sequence_number: Int64


class OutputTextDeltaEvent(Struct, kw_only=True, tag_field="type"):
    """``response.output_text.delta``: ``delta`` (never empty), the ``logprobs`` of its
    tokens (``[]`` without logprobs)."""

    content_index: Int64
    delta: str
    item_id: str
    logprobs: list[DeltaLogprob]
    output_index: Int64
    sequence_number: Int64


class OutputTextDoneEvent(Struct, kw_only=True, tag_field="type"):
    """``response.output_text.done``: the part's full ``text`` and ``logprobs`` (the part's
    list; ``[]`` without logprobs)."""

    content_index: Int64
    item_id: str
    logprobs: list[ResponseLogprob]
    output_index: Int64
    sequence_number: Int64
    text: str


class ReasoningTextDeltaEvent(Struct, kw_only=True, tag_field="type"):
    """``response.reasoning_text.delta``."""

    content_index: Int64
    delta: str
    item_id: str
    output_index: Int64
    sequence_number: Int64


class ReasoningTextDoneEvent(Struct, kw_only=True, tag_field="type"):
    """``response.reasoning_text.done``."""

    content_index: Int64
    item_id: str
    output_index: Int64
    sequence_number: Int64
    text: str


class FunctionCallArgumentsDeltaEvent(Struct, kw_only=True, tag_field="type"):
    """``response.function_call_arguments.delta``."""

    delta: str
    item_id: str
    output_index: Int64
    sequence_number: Int64


class FunctionCallArgumentsDoneEvent(Struct, kw_only=True, tag_field="type"):
    """``response.function_call_arguments.done``: always sent before the call's
    ``output_item.done``, also when no argument delta was sent."""

    arguments: str
    item_id: str
    output_index: Int64
    sequence_number: Int64
    name: str = ""


def _event(base: type, tag: str, name: str) -> type:
    """A concrete event class: ``base`` with ``type`` = ``tag`` on the wire."""
    cls = type(name, (base,), {"__doc__": f"``{tag}`` ({base.__name__})."}, tag=tag)
    cls.__module__ = __name__
    return cls


ResponseCreatedEvent = _event(ResponseLifecycleEvent, "response.created", "ResponseCreatedEvent")
ResponseInProgressEvent = _event(ResponseLifecycleEvent, "response.in_progress", "ResponseInProgressEvent")
ResponseCompletedEvent = _event(ResponseLifecycleEvent, "response.completed", "ResponseCompletedEvent")
ResponseIncompleteEvent = _event(ResponseLifecycleEvent, "response.incomplete", "ResponseIncompleteEvent")
OutputItemAddedEvent = _event(OutputItemEvent, "response.output_item.added", "OutputItemAddedEvent")
OutputItemDoneEvent = _event(OutputItemEvent, "response.output_item.done", "OutputItemDoneEvent")
ContentPartAddedEvent = _event(ContentPartEvent, "response.content_part.added", "ContentPartAddedEvent")
ContentPartDoneEvent = _event(ContentPartEvent, "response.content_part.done", "ContentPartDoneEvent")
OutputTextDelta = _event(OutputTextDeltaEvent, "response.output_text.delta", "OutputTextDelta")
OutputTextDone = _event(OutputTextDoneEvent, "response.output_text.done", "OutputTextDone")
ReasoningTextDelta = _event(ReasoningTextDeltaEvent, "response.reasoning_text.delta", "ReasoningTextDelta")
ReasoningTextDone = _event(ReasoningTextDoneEvent, "response.reasoning_text.done", "ReasoningTextDone")
FunctionCallArgumentsDelta = _event(FunctionCallArgumentsDeltaEvent, "response.function_call_arguments.delta",
                                    "FunctionCallArgumentsDelta")
FunctionCallArgumentsDone = _event(FunctionCallArgumentsDoneEvent, "response.function_call_arguments.done",
                                   "FunctionCallArgumentsDone")

#: every streaming event type the derender emits (a stream reply is a JSON list of these)
ResponseStreamEvent = (
    ResponseCreatedEvent | ResponseInProgressEvent | ResponseCompletedEvent | ResponseIncompleteEvent
    | OutputItemAddedEvent | OutputItemDoneEvent | ContentPartAddedEvent | ContentPartDoneEvent
    | OutputTextDelta | OutputTextDone | ReasoningTextDelta | ReasoningTextDone | FunctionCallArgumentsDelta
    | FunctionCallArgumentsDone
)

#: the Responses message types, by JSON Schema file name (merged into ``schemas.MESSAGE_TYPES``)
RESPONSES_MESSAGE_TYPES: dict[str, Any] = {
    "ResponsesRequest": ResponsesRequest,
    "DerenderResponsesRequest": DerenderResponsesRequest,
    "DerenderResponsesStreamRequest": DerenderResponsesStreamRequest,
    "ResponseObject": ResponseObject,
    "ResponseStreamEvent": list[ResponseStreamEvent],
}
