"""The wire contract of derender-worker: msgspec Structs for every message on the wire.

Field names and defaults follow vLLM's disaggregated-serving protocol
(``vllm/entrypoints/serve/disagg/protocol.py``: ``GenerateResponse``, ``DerenderChatRequest``,
``DerenderCompletionRequest``, ``DerenderStreamState``) and the OpenAI API
(``ChatCompletionRequest``/``Response``, ``CompletionRequest``/``Response``, stream chunks, error
object), so a body that vLLM's ``/v1/chat/completions/derender`` accepts decodes here unchanged.

Rules shared by all request Structs:

* unknown fields are accepted and ignored (msgspec's default), so a full OpenAI request decodes
  even though derender reads only a few of its fields;
* ``None`` and a missing field mean the same thing (vLLM's pydantic defaults);
* types are checked on decode: a wrong type raises ``msgspec.ValidationError`` with a JSON path,
  which the core turns into an OpenAI 400 error object;
* every integer of an incoming message is bounded on decode (``Int64``: a signed 64-bit value,
  what msgpack, Rust and C can hold; ``Byte``: 0..255), so an out-of-range number is a 400 with
  its JSON path, never an ``OverflowError`` later; the core then checks what the value means
  (token ids inside the vocabulary, as vLLM does).

Response Structs encode every field (``null`` included), as vLLM does.

``python -m schemas`` regenerates the JSON Schema files next to this module
(``schemas/*.schema.json``); ``tests/test_schemas.py`` fails when they drift.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct, field

__all__ = [
    "TopLogprobIn", "TokenLogprobIn", "LogprobsIn", "UsageInfo", "GenerateTokensChoice",
    "GenerateTokensResponse", "GenerateTokensStreamChoice", "GenerateTokensStreamResponse",
    "ChatCompletionRequest", "CompletionRequest", "StreamOptions", "DerenderChatRequest",
    "DerenderCompletionRequest", "DerenderChatStreamRequest", "DerenderCompletionStreamRequest",
    "DerenderStreamState", "FunctionCall", "ToolCall", "DeltaFunctionCall", "DeltaToolCall",
    "ChatMessage", "ChatLogprobTop", "ChatLogprobToken", "ChatLogprobs", "ChatCompletionChoice",
    "ChatCompletionResponse", "DeltaMessage", "ChatCompletionStreamChoice",
    "ChatCompletionStreamResponse", "CompletionLogprobs", "CompletionChoice", "CompletionResponse",
    "CompletionStreamChoice", "CompletionStreamResponse", "ErrorInfo", "ErrorResponse",
    "CompletionTokensDetails", "MESSAGE_TYPES", "Int64", "Byte",
]


#: a signed 64-bit integer (bounds every integer read from a message; the core checks the
#: meaning: token ids inside the vocabulary, non-negative counts and indices, ...)
Int64 = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]
#: one byte of a token's UTF-8 (``bytes`` of a logprob entry)
Byte = Annotated[int, Meta(ge=0, le=255)]


# ----------------------------------------------------------------------------- engine output ---
#: the logprob Structs are ``gc=False`` (msgspec): they hold only numbers, strings and lists of
#: ints, never a reference cycle, so the thousands a dense-logprobs record carries are not
#: tracked by the cycle collector (a top-20 record: ~5k candidates in, ~5k out)
class TopLogprobIn(Struct, kw_only=True, gc=False):
    """One candidate of an engine logprob entry: ``token_id``, ``logprob`` (natural log), ``rank``
    (1 = most likely). ``token``/``bytes`` are accepted (vLLM may send them) but derender always
    recomputes them from ``token_id`` with the served tokenizer."""

    token_id: Int64 | None = None
    logprob: float = -9999.0
    rank: Int64 | None = None
    token: str | None = None
    bytes: list[Byte] | None = None


class TokenLogprobIn(Struct, kw_only=True, gc=False):
    """Engine logprobs of one sampled token (``token_id``) plus its ``top_logprobs`` candidates."""

    token_id: Int64 | None = None
    logprob: float = -9999.0
    rank: Int64 | None = None
    token: str | None = None
    bytes: list[Byte] | None = None
    top_logprobs: list[TopLogprobIn] = field(default_factory=list)


class LogprobsIn(Struct, kw_only=True):
    """``ChatCompletionLogProbs``-shaped engine logprobs: one ``content`` entry per output token."""

    content: list[TokenLogprobIn] | None = None


class CompletionTokensDetails(Struct, kw_only=True):
    """``usage.completion_tokens_details``; ``reasoning_tokens`` counts tokens the reasoning
    parser classified as reasoning (present only when a reasoning parser is configured)."""

    reasoning_tokens: Int64 | None = None


class UsageInfo(Struct, kw_only=True):
    """OpenAI ``usage`` block (token counts)."""

    prompt_tokens: Int64 = 0
    total_tokens: Int64 = 0
    completion_tokens: Int64 | None = 0
    prompt_tokens_details: dict[str, Any] | None = None
    completion_tokens_details: CompletionTokensDetails | None = None


class GenerateTokensChoice(Struct, kw_only=True):
    """One sequence of a non-streaming engine response (vLLM ``GenerateResponseChoice``).

    ``token_ids``: sampled ids in order, the final stop token included when the engine stopped on
    it. ``finish_reason`` defaults to ``"stop"`` (OpenAI default, as vLLM). ``stop_reason``: the
    stop token id (int) or stop string that ended the sequence, else ``None``."""

    index: Int64 = 0
    token_ids: list[Int64] | None = None
    finish_reason: str | None = "stop"
    stop_reason: Int64 | str | None = None
    logprobs: LogprobsIn | None = None
    routed_experts: str | None = None


class GenerateTokensResponse(Struct, kw_only=True):
    """A complete token-out engine response (vLLM ``GenerateResponse``)."""

    request_id: str | None = None
    model: str | None = None
    created: Int64 | None = None
    choices: list[GenerateTokensChoice] = field(default_factory=list)
    usage: UsageInfo | None = None
    prompt_token_ids: list[Int64] | None = None
    prompt_logprobs: Any = None
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None


class GenerateTokensStreamChoice(Struct, kw_only=True):
    """One choice of one streaming engine chunk: the new ``token_ids`` since the last chunk;
    ``finish_reason``/``stop_reason`` set on the choice's last chunk only."""

    index: Int64 = 0
    token_ids: list[Int64] | None = None
    finish_reason: str | None = None
    stop_reason: Int64 | str | None = None
    logprobs: LogprobsIn | None = None
    routed_experts: str | None = None


class GenerateTokensStreamResponse(Struct, kw_only=True):
    """One streaming engine chunk (vLLM ``GenerateStreamResponse``); ``usage`` on the last one."""

    request_id: str | None = None
    choices: list[GenerateTokensStreamChoice] = field(default_factory=list)
    usage: UsageInfo | None = None
    prompt_token_ids: list[Int64] | None = None


# --------------------------------------------------------------------------- OpenAI requests ---
class StreamOptions(Struct, kw_only=True):
    """OpenAI ``stream_options``."""

    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class ChatCompletionRequest(Struct, kw_only=True):
    """The OpenAI chat request fields derender reads (others are accepted and ignored).

    ``tool_choice``: ``"none" | "auto" | "required"`` or ``{"type": "function", "function":
    {"name": ...}}``. ``chat_template_kwargs`` carries e.g. ``enable_thinking``/``thinking``."""

    model: str | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = True
    logprobs: bool | None = False
    top_logprobs: Int64 | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_reasoning: bool = True
    include_stop_str_in_output: bool = False
    stop: str | list[str] | None = None
    min_tokens: Int64 = 0
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_ids: bool | None = None
    echo: bool = False
    n: Int64 | None = 1
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: Int64 | None = None
    max_completion_tokens: Int64 | None = None
    response_format: dict[str, Any] | None = None
    reasoning_effort: str | None = None


class CompletionRequest(Struct, kw_only=True):
    """The OpenAI (legacy) completion request fields derender reads; others are ignored.
    ``logprobs`` is an int here (number of top candidates), per the OpenAI completions API."""

    model: str | None = None
    prompt: Any = None
    logprobs: Int64 | None = None
    echo: bool | None = False
    n: Int64 = 1
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    stop: str | list[str] | None = None
    min_tokens: Int64 = 0
    return_token_ids: bool | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: Int64 | None = 16
    suffix: str | None = None


# ------------------------------------------------------------------------- derender requests ---
class DerenderChatRequest(Struct, kw_only=True):
    """Body of vLLM's ``/v1/chat/completions/derender`` (non-streaming); a Kafka message value.

    ``prompt_tokens``: prompt length for usage (default 0). ``prompt_token_ids``: the rendered
    prompt, used to seed detokenization and to read parser state the template set (e.g. a
    pre-opened or pre-closed ``<think>``); falls back to ``generate_response.prompt_token_ids``.
    ``chat_request``: the original OpenAI request; required when a parser is configured."""

    model: str
    generate_response: GenerateTokensResponse
    stream: bool = False
    prompt_tokens: Int64 | None = None
    prompt_token_ids: list[Int64] | None = None
    chat_request: ChatCompletionRequest | None = None


class DerenderCompletionRequest(Struct, kw_only=True):
    """Body of vLLM's ``/v1/completions/derender`` (non-streaming): one engine response per prompt.

    ``prompt_tokens`` / ``prompt_token_ids``, when given, have one entry per ``generate_responses``
    entry (a length mismatch is a 400 error)."""

    model: str
    generate_responses: list[GenerateTokensResponse]
    stream: bool = False
    prompt_tokens: list[Int64] | None = None
    prompt_token_ids: list[list[Int64]] | None = None
    completion_request: CompletionRequest | None = None


class DerenderStreamState(Struct, kw_only=True):
    """Per-sequence streaming state (vLLM ``DerenderStreamState`` field names), held in Redis by
    the streaming worker. Its size is bounded by the detokenizer window and the parser's buffered
    markup, never by the stream length.

    ``prev_tokens``: trailing decode window (token strings from ``prefix_offset`` on);
    ``prefix_offset``/``read_offset``: incremental-detokenization offsets into that window;
    ``role_sent``: the ``role`` delta was emitted; ``logprob_context_token_ids``: up to 4 preceding
    token ids for U+FFFD byte-fallback repair; ``logprob_text_offset``: completion
    ``text_offset`` so far (chars); ``parser_state``: the parser's own msgspec-encodable state;
    ``last_tool_call_ids``: ids assigned to calls so far; ``next_seq``: next expected chunk
    sequence number; ``completion_tokens`` / ``reasoning_tokens``: running usage counts."""

    prev_tokens: list[str] = field(default_factory=list)
    prefix_offset: int = 0
    read_offset: int = 0
    role_sent: bool = False
    logprob_context_token_ids: list[int] = field(default_factory=list)
    logprob_text_offset: int = 0
    last_content: str | None = None
    last_reasoning: str | None = None
    last_tool_call_ids: list[str] = field(default_factory=list)
    parser_state: Any = None
    next_seq: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    finished: bool = False


class DerenderChatStreamRequest(Struct, kw_only=True):
    """One streaming chunk to derender for a chat request (``stream: true``, ``generate_chunk``).
    The first chunk of a request also carries ``chat_request`` and ``prompt_token_ids``."""

    model: str
    generate_chunk: GenerateTokensStreamResponse
    stream: bool = True
    stream_state: DerenderStreamState | None = None
    prompt_tokens: Int64 | None = None
    prompt_token_ids: list[Int64] | None = None
    chat_request: ChatCompletionRequest | None = None


class DerenderCompletionStreamRequest(Struct, kw_only=True):
    """One streaming chunk to derender for a completion request."""

    model: str
    generate_chunk: GenerateTokensStreamResponse
    stream: bool = True
    stream_state: DerenderStreamState | None = None
    prompt_tokens: Int64 | None = None
    prompt_token_ids: list[Int64] | None = None
    completion_request: CompletionRequest | None = None


# -------------------------------------------------------------------------- OpenAI responses ---
class FunctionCall(Struct, kw_only=True):
    """``function`` of a tool call: ``name`` and ``arguments`` (a JSON text)."""

    name: str
    arguments: str


class ToolCall(Struct, kw_only=True):
    """A complete tool call (non-streaming message)."""

    id: str
    type: str = "function"
    function: FunctionCall


class DeltaFunctionCall(Struct, kw_only=True):
    """Streamed function fragment: ``name`` once, then ``arguments`` fragments."""

    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(Struct, kw_only=True):
    """Streamed tool-call fragment; ``id``/``type`` on the call's first fragment only."""

    index: int
    id: str | None = None
    type: str | None = None
    function: DeltaFunctionCall | None = None


class ChatMessage(Struct, kw_only=True):
    """Assistant message of a chat completion (``reasoning`` is vLLM's field name)."""

    role: str = "assistant"
    content: str | None = None
    refusal: str | None = None
    annotations: Any = None
    audio: Any = None
    function_call: Any = None
    tool_calls: list[ToolCall] | None = None
    reasoning: str | None = None


class ChatLogprobTop(Struct, kw_only=True, gc=False):
    """One top-logprob candidate: ``token`` text, ``logprob``, UTF-8 ``bytes``."""

    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatLogprobToken(ChatLogprobTop, kw_only=True, gc=False):
    """Logprob of one sampled token plus ``top_logprobs`` candidates (OpenAI shape)."""

    top_logprobs: list[ChatLogprobTop] = field(default_factory=list)


class ChatLogprobs(Struct, kw_only=True):
    """Chat ``logprobs`` block."""

    content: list[ChatLogprobToken] | None = None


class ChatCompletionChoice(Struct, kw_only=True):
    """One choice of a chat completion."""

    index: int
    message: ChatMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = "stop"
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class ChatCompletionResponse(Struct, kw_only=True):
    """OpenAI ``chat.completion`` object (plus vLLM's ``kv_transfer_params``/``prompt_token_ids``)."""

    id: str
    object: str = "chat.completion"
    created: int = 0
    model: str
    choices: list[ChatCompletionChoice]
    usage: UsageInfo
    system_fingerprint: str | None = None
    service_tier: str | None = None
    prompt_logprobs: Any = None
    prompt_token_ids: list[int] | None = None
    kv_transfer_params: dict[str, Any] | None = None


class DeltaMessage(Struct, kw_only=True, omit_defaults=True):
    """Delta of a chat stream chunk: ``role`` on the first chunk, then ``content``,
    ``reasoning`` and ``tool_calls`` fragments (absent fields are omitted)."""

    role: str | None = None
    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChatCompletionStreamChoice(Struct, kw_only=True):
    """One choice of a ``chat.completion.chunk``."""

    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class ChatCompletionStreamResponse(Struct, kw_only=True):
    """OpenAI ``chat.completion.chunk``; ``usage`` on the final chunk when asked for."""

    id: str
    object: str = "chat.completion.chunk"
    created: int = 0
    model: str
    choices: list[ChatCompletionStreamChoice]
    usage: UsageInfo | None = None


class CompletionLogprobs(Struct, kw_only=True):
    """Completion ``logprobs``: ``text_offset`` (chars into the choice text), ``token_logprobs``,
    ``tokens`` and ``top_logprobs`` (dicts token text -> logprob)."""

    text_offset: list[int] = field(default_factory=list)
    token_logprobs: list[float | None] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = field(default_factory=list)


class CompletionChoice(Struct, kw_only=True):
    """One choice of a text completion (flat ``index`` across prompts)."""

    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None
    prompt_logprobs: Any = None
    prompt_token_ids: list[int] | None = None


class CompletionResponse(Struct, kw_only=True):
    """OpenAI ``text_completion`` object."""

    id: str
    object: str = "text_completion"
    created: int = 0
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo
    system_fingerprint: str | None = None
    service_tier: str | None = None
    kv_transfer_params: dict[str, Any] | None = None


class CompletionStreamChoice(Struct, kw_only=True):
    """One choice of a streamed text completion chunk."""

    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class CompletionStreamResponse(Struct, kw_only=True):
    """OpenAI streamed ``text_completion`` chunk."""

    id: str
    object: str = "text_completion"
    created: int = 0
    model: str
    choices: list[CompletionStreamChoice]
    usage: UsageInfo | None = None


class ErrorInfo(Struct, kw_only=True):
    """OpenAI error body: ``message``, ``type`` (``BadRequestError``, ``NotFoundError``,
    ``InternalServerError``), ``param`` and ``code`` (the HTTP status as an int, as vLLM)."""

    message: str
    type: str = "BadRequestError"
    param: str | None = None
    code: int = 400


class ErrorResponse(Struct, kw_only=True):
    """OpenAI error object: ``{"error": {...}}``. ``request_id`` is added when it could be read."""

    error: ErrorInfo
    request_id: str | None = None


#: Every message type on the wire, by the name used for its JSON Schema file.
MESSAGE_TYPES: dict[str, type] = {
    "GenerateTokensResponse": GenerateTokensResponse,
    "GenerateTokensStreamResponse": GenerateTokensStreamResponse,
    "DerenderChatRequest": DerenderChatRequest,
    "DerenderCompletionRequest": DerenderCompletionRequest,
    "DerenderChatStreamRequest": DerenderChatStreamRequest,
    "DerenderCompletionStreamRequest": DerenderCompletionStreamRequest,
    "DerenderStreamState": DerenderStreamState,
    "ChatCompletionRequest": ChatCompletionRequest,
    "CompletionRequest": CompletionRequest,
    "ChatCompletionResponse": ChatCompletionResponse,
    "ChatCompletionStreamResponse": ChatCompletionStreamResponse,
    "CompletionResponse": CompletionResponse,
    "CompletionStreamResponse": CompletionStreamResponse,
    "ErrorResponse": ErrorResponse,
}

# Responses API (``schemas/responses.py``): its message types join the table (issue 14)
from schemas.responses import RESPONSES_MESSAGE_TYPES  # noqa: E402

MESSAGE_TYPES.update(RESPONSES_MESSAGE_TYPES)

# Anthropic Messages API (``schemas/messages.py``): its message types join the table (issue 26)
from schemas.messages import MESSAGES_MESSAGE_TYPES  # noqa: E402

MESSAGE_TYPES.update(MESSAGES_MESSAGE_TYPES)

AnyDerenderRequest = (
    DerenderChatRequest | DerenderCompletionRequest | DerenderChatStreamRequest | DerenderCompletionStreamRequest
)
Kind = Literal["chat", "completion", "chat-stream", "completion-stream"]
