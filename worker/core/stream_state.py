"""Stream state of the chat/completion streaming derender (``worker.core.stream``): the typed
checkpoint of one request (``StreamState``: per choice a ``ChoiceState``; the request's write-once
``StreamSettings``: its compact options ``StreamOpts``, the prompt seed ``StreamSeed``, request
id, model, created, request digest, kept inside the state or stored once apart, the state then
recording their digest), its msgpack codec (``encode_state`` / ``decode_state``,
``encode_settings`` / ``decode_settings`` / ``settings_digest``, parser sub-states typed per
model), the version rule (another version: the 409 "lost or expired", never misread), the
request digest of later chunks (``request_digest`` / ``check_request_digest``) and the bounds
on every number a stored state carries (its pieces' length and spilled ranges). Layout and rules:
``worker.core.stream``'s docstring ("State", "Bounded state"). No I/O."""
from __future__ import annotations

import hashlib
import weakref
from typing import Any

import msgspec

from schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    DerenderStreamState,
    GenerateTokensStreamResponse,
    Int64,
)
from worker.core.derender import ModelRuntime
from worker.core.detokenize import DetokState
from worker.core.errors import BadRequest, Conflict
from worker.core.responses.log import MAX_PIECES_LEN

__all__ = ["StreamOpts", "ChoiceState", "StreamSeed", "StreamSettings", "StreamState", "LaterChunkBody",
           "encode_state", "decode_state", "encode_settings", "decode_settings", "settings_digest",
           "STATE_VERSION", "request_digest", "check_request_digest"]

#: 2: parser states gained fields (tagged ``after_end``, think ``ws``, Harmony id scanning); a state
#: stored by an older build is refused (a 400 for that stream), never misread.
#: 3: tagged / jsontail states gained the incremental tool-call streamer (``inc``, ``calls``).
#: 4: tagged states gained the bare-call fields (``bare``, ``fence``, ``inline``: qwen3_coder /
#: seed_oss calls without their wrapper); gpt-oss's Harmony state became one Struct with enum
#: phase / route and a typed header (``worker.parsers.harmony.HarmonyState``).
#: 5: ``req_digest`` (blake2b-128 of the first chunk's raw request bytes: later chunks that carry
#: the request are compared with it, never decoded). A state of another version is refused with
#: the 409 "lost or expired" (``decode_state``), never misread.
#: 6: bounded state for every engine (``worker.core.stream``, "Bounded state"): jsontail, marker
#: (pythonic, granite, xlam) and Harmony states gained ``spilled``, ``StackState`` gained
#: ``held_spilled`` and ``ChoiceState`` ``spill_held`` (required/named content in the pieces).
#:    and the request's settings (``StreamSettings``: kind, request id, model, created, request digest,
#: ``StreamOpts``, the prompt seed) are one nested value, stored once apart from the per-chunk state
#: when the caller keeps them (``settings_digest``); a later chunk's own prompt seed is ``reseed``.
#: (The stored values' formats, which of them a release reads and which it writes during a rolling
#: upgrade: ``worker.state.formats``; a layout change adds a format there and golden blobs in
#: ``tests/data/golden_state/``.)
STATE_VERSION = 6


class StreamOpts(msgspec.Struct, kw_only=True, array_like=True, omit_defaults=True):
    """The request fields read after the first chunk (compact copy of chat_request /
    completion_request): detokenization flags, logprob settings, echo, usage, expected choices."""

    skip_special: bool = True
    spaces: bool = True
    include_stop: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    return_token_ids: bool = False
    include_usage: bool = True
    echo: bool = False
    n: int = 1
    expected_choices: int | None = 1
    tool_mode: str = "off"
    #: the request's stop strings (``stop_strings``) and ``min_tokens``
    stop: list[str] = msgspec.field(default_factory=list)
    min_tokens: int = 0


class ChoiceState(msgspec.Struct, kw_only=True, array_like=True):
    """Per-choice stream state (see module docstring)."""

    detok: DetokState | None = None
    parser: Any = None
    lp_ctx: list[int] = msgspec.field(default_factory=list)
    text_offset: int = 0
    role_sent: bool = False
    tool_ids: list[str] = msgspec.field(default_factory=list)
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    prompt_tokens: int = 0
    finished: bool = False
    #: text held back while it may be the start of a stop string (< the longest stop string)
    held: str = ""
    #: a stop string matched: the OpenAI stream of this choice has ended; the engine's later
    #: tokens are only counted (``finished`` comes with the engine's own finish_reason)
    stopped: bool = False
    #: where the open tool call's spilled start lives in the stream's pieces: flat
    #: ``[offset, length, ...]`` byte ranges, in order (one range unless choices interleave)
    spill: list[int] = msgspec.field(default_factory=list)
    #: the same for the open XML call's spilled sent entries (``TaggedToolParser.spill_args``)
    spill_args: list[int] = msgspec.field(default_factory=list)
    #: the same for the required/named content held for JSON parsing (``ParserStack.spill_held``)
    spill_held: list[int] = msgspec.field(default_factory=list)
    #: CRC-32 (``zlib.crc32``, running) of the bytes of ``spill`` / ``spill_args`` / ``spill_held``
    #: in order: pieces read back must give it (bytes overwritten with as many characters of other
    #: text are refused with the 409 "lost or expired", never turned into a reply)
    spill_crc: int = 0
    spill_args_crc: int = 0
    spill_held_crc: int = 0
    #: an EOS id that ended a chunk without ``finish_reason``, not yet detokenized: the next chunk
    #: of the choice starts with it (trimmed as the stop token on a ``stop`` finish, vLLM's
    #: ``stop_terminated``; -1: none)
    held_stop_id: int = -1


class StreamSeed(msgspec.Struct, kw_only=True, array_like=True):
    """What a new choice of the stream starts from, built from a prompt (the first chunk's, or a
    later chunk's own ``prompt_token_ids`` for choices it opens): the detokenizer window over the
    prompt tail, the parser stack's initial state, the prompt's token count."""

    detok: DetokState | None = None
    parser: Any = None
    prompt_tokens: int = 0


class StreamSettings(msgspec.Struct, kw_only=True, array_like=True):
    """The stream's write-once settings (issue 13 item 4): everything fixed by its first chunk,
    stored once beside the per-chunk state and never rewritten. ``kind`` (``chat`` /
    ``completion``), ``request_id``, ``model``, ``created`` (every chunk's, Unix seconds),
    ``req_digest`` (``request_digest`` of the first chunk's raw request; ``b""``: none), ``opts``
    (the request's compact settings, stop strings included: up to ``MAX_STOP_STRINGS`` /
    ``MAX_STOP_CHARS``), ``seed`` (the first chunk's prompt seed). ``v``: ``STATE_VERSION``."""

    v: int = STATE_VERSION
    kind: str = "chat"
    request_id: str = ""
    model: str = ""
    created: int = 0
    req_digest: bytes = b""
    opts: StreamOpts = msgspec.field(default_factory=StreamOpts)
    seed: StreamSeed = msgspec.field(default_factory=StreamSeed)


class StreamState(msgspec.Struct, kw_only=True, array_like=True):
    """Per-request stream state: the write-once ``settings`` and what changes per chunk
    (per-choice states keyed by choice index, ``next_seq``, ``usage_sent``, ``pieces_len``,
    ``reseed``). Stored two ways (``encode_state``): with ``settings`` inside (a caller that
    keeps one value per stream), or, when ``settings_digest`` is set (``DerenderService.
    derender_stream(settings_aside=True)``), without them: they are stored once apart
    (``encode_settings``) and the state records their digest (``settings_digest``; a reader
    puts them back by that digest: ``decode_settings``, the service's settings cache).
    ``kind``, ``request_id``, ``model``, ``created``, ``req_digest``, ``opts`` read the
    settings; ``seed_detok`` / ``seed_parser`` / ``seed_prompt_tokens`` read ``seed``."""

    v: int = STATE_VERSION
    #: the write-once settings (None only in a stored state whose settings are kept apart)
    settings: StreamSettings | None = None
    #: blake2b-128 of ``encode_settings(settings)`` when the settings are stored apart, else ``b""``
    settings_digest: bytes = b""
    #: the seed of choices opened by a later chunk that carried its own prompt (``_reseed``);
    #: None: the settings' seed
    reseed: StreamSeed | None = None
    choices: dict[int, ChoiceState] = msgspec.field(default_factory=dict)
    next_seq: int = 0
    usage_sent: bool = False
    #: length of the stream's append-only pieces after this chunk (readers truncate to it)
    pieces_len: int = 0

    @property
    def kind(self) -> str:
        """``chat`` / ``completion`` (the settings')."""
        return self.settings.kind

    @property
    def request_id(self) -> str:
        """The stream's request id (the settings')."""
        return self.settings.request_id

    @property
    def model(self) -> str:
        """The model name the stream started with (the settings')."""
        return self.settings.model

    @property
    def created(self) -> int:
        """Every chunk's ``created`` (Unix seconds; fixed by the first chunk)."""
        return self.settings.created

    @property
    def req_digest(self) -> bytes:
        """``request_digest`` of the first chunk's raw request (``b""``: it carried none)."""
        return self.settings.req_digest

    @property
    def opts(self) -> StreamOpts:
        """The request's compact settings (the settings')."""
        return self.settings.opts

    @property
    def seed(self) -> StreamSeed:
        """The seed new choices start from: ``reseed`` when a later chunk set one, else the
        settings'."""
        return self.reseed if self.reseed is not None else self.settings.seed

    @property
    def seed_detok(self) -> DetokState | None:
        """``seed.detok``."""
        return self.seed.detok

    @property
    def seed_parser(self) -> Any:
        """``seed.parser``."""
        return self.seed.parser

    @property
    def seed_prompt_tokens(self) -> int:
        """``seed.prompt_tokens``."""
        return self.seed.prompt_tokens

    @property
    def done(self) -> bool:
        """Every expected choice has finished (the stream's state can be deleted)."""
        choices = self.choices
        if not choices:
            return False
        for c in choices.values():  # (a loop, not ``all`` over a generator: read twice per chunk)
            if not c.finished:
                return False
        exp = self.settings.opts.expected_choices
        return exp is None or len(choices) >= exp


_state_encoder = msgspec.msgpack.Encoder()
_state_decoder = msgspec.msgpack.Decoder(StreamState)


class LaterChunkBody(msgspec.Struct, kw_only=True):
    """A chat or completion chunk body after the stream's first chunk, as the service decodes it:
    ``generate_chunk`` typed, the request kept raw (``chat_request_raw`` / ``completion_request_raw``,
    JSON keys ``chat_request`` / ``completion_request``): its digest is compared with the stored
    one (``check_request_digest``), it is not decoded. ``chat_request`` / ``completion_request``
    decode it only when read: a later chunk opening a new choice with its own prompt ids
    (``_reseed``), once its digest matched the first chunk's."""

    model: str
    generate_chunk: GenerateTokensStreamResponse
    stream: bool = True
    stream_state: DerenderStreamState | None = None
    prompt_tokens: Int64 | None = None
    prompt_token_ids: list[Int64] | None = None
    chat_request_raw: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="chat_request")
    completion_request_raw: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="completion_request")

    def request_raw(self, kind: str) -> bytes:
        """The raw bytes of the ``kind`` (``chat``/``completion``) request (``b""``: absent)."""
        return bytes(self.chat_request_raw if kind == "chat" else self.completion_request_raw)

    @property
    def chat_request(self) -> ChatCompletionRequest | None:
        """The chat request, decoded on demand (None when absent or ``null``)."""
        raw = bytes(self.chat_request_raw)
        return msgspec.json.decode(raw, type=ChatCompletionRequest | None) if raw else None

    @property
    def completion_request(self) -> CompletionRequest | None:
        """The completion request, decoded on demand (None when absent or ``null``)."""
        raw = bytes(self.completion_request_raw)
        return msgspec.json.decode(raw, type=CompletionRequest | None) if raw else None


def encode_state(state: StreamState) -> bytes:
    """msgpack bytes of ``state`` (what the store keeps): its settings inside, or, when
    ``state.settings_digest`` is set (settings stored apart), without them."""
    if state.settings_digest:
        settings, state.settings = state.settings, None
        try:
            return _state_encoder.encode(state)
        finally:
            state.settings = settings
    return _state_encoder.encode(state)


def encode_settings(settings: StreamSettings) -> bytes:
    """msgpack bytes of a stream's write-once ``settings`` (stored once, on its first chunk)."""
    return _state_encoder.encode(settings)


def settings_digest(data: bytes) -> bytes:
    """blake2b-128 of ``encode_settings`` bytes: what a state whose settings are stored apart
    records (``StreamState.settings_digest``) and what the settings cache is keyed by."""
    return hashlib.blake2b(data, digest_size=16).digest()


_typed_decoders: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class _Typed(msgspec.Struct):
    """The typed decoders of one parser stack (``_typed``)."""

    state: msgspec.msgpack.Decoder
    choice: msgspec.msgpack.Decoder
    settings: msgspec.msgpack.Decoder


def _typed(stack) -> _Typed:
    """msgpack decoders of ``StreamState`` / ``ChoiceState`` / ``StreamSettings`` whose parser
    sub-states are ``stack``'s own Struct types (``ParserStack.typed_state``): one decode,
    nothing rebuilt. Built once per stack; the last stack's are kept aside (read every chunk:
    one weak reference call instead of the weak dictionary's lookup)."""
    global _last_typed
    ref, dec = _last_typed
    if ref() is stack:
        return dec
    dec = _typed_decoders.get(stack)
    if dec is None:
        sst = stack.typed_state
        seed = msgspec.defstruct("TypedStreamSeed", [("parser", sst | None, None)], bases=(StreamSeed,),
                                 kw_only=True, array_like=True)
        sett = msgspec.defstruct("TypedStreamSettings", [("seed", seed, msgspec.field(default_factory=seed))],
                                 bases=(StreamSettings,), kw_only=True, array_like=True)
        cst = msgspec.defstruct("TypedChoiceState", [("parser", sst | None, None)], bases=(ChoiceState,),
                                kw_only=True, array_like=True)
        tst = msgspec.defstruct("TypedStreamState", [("settings", sett | None, None), ("reseed", seed | None, None),
                                                     ("choices", dict[int, cst], msgspec.field(default_factory=dict))],
                                bases=(StreamState,), kw_only=True, array_like=True)
        dec = _Typed(msgspec.msgpack.Decoder(tst), msgspec.msgpack.Decoder(cst), msgspec.msgpack.Decoder(sett))
        _typed_decoders[stack] = dec
    _last_typed = (weakref.ref(stack), dec)
    return dec


def _no_stack() -> None:
    return None


#: ``(weak reference to the stack, its decoders)`` of the last ``_typed`` call
_last_typed: tuple = (_no_stack, None)


def _typed_decoder(stack) -> msgspec.msgpack.Decoder:
    """The typed ``StreamState`` decoder of ``stack`` (``_typed``)."""
    return _typed(stack).state


_settings_decoder = msgspec.msgpack.Decoder(StreamSettings)


def _other_version(v: int) -> Conflict:
    return Conflict(f"stored stream state has version {v}, expected {STATE_VERSION} (written by another "
                    "release): the stream state was lost or expired; stream ended", param="stream_state")


class _Version(msgspec.Struct, array_like=True):
    v: int


_version_decoder = msgspec.msgpack.Decoder(_Version)


def _refuse_other_version(data: bytes) -> None:
    """Raise the 409 of ``_other_version`` when ``data`` (which the state decoders refused) is a
    msgpack array whose first item, the version, is an int other than ``STATE_VERSION`` (a state
    of another release whose layout changed); return otherwise (the caller's 400 names it)."""
    try:
        v = _version_decoder.decode(data).v
    except (msgspec.DecodeError, msgspec.ValidationError):
        return
    if v != STATE_VERSION:
        raise _other_version(v)


def request_digest(raw: bytes) -> bytes:
    """blake2b-128 of a stream request's raw JSON bytes (``chat_request`` / ``completion_request``
    as the first chunk carried them); later chunks' requests are compared by it, never decoded.
    ``b""`` for an absent request (no bytes, or ``null``)."""
    if not raw or raw == b"null":
        return b""
    return hashlib.blake2b(raw, digest_size=16).digest()


def check_request_digest(state: StreamState, raw: bytes | None, kind: str) -> None:
    """A later chunk's raw request (``raw``: its JSON bytes, None/empty/``null`` when absent)
    must be byte-identical to the first chunk's (digest compared, the bytes never decoded).
    Raises ``BadRequest`` (400) on a mismatch, also when the first chunk carried none."""
    d = request_digest(raw or b"")
    if d and d != state.req_digest:
        field = "chat_request" if kind == "chat" else "completion_request"
        raise BadRequest(f"{field} differs from the one the stream started with (a later chunk may omit it; "
                         "when present it must be the first chunk's bytes)", param=field)


def decode_state(rt: ModelRuntime, data: bytes) -> StreamState:
    """Decode ``encode_state`` bytes; parser sub-states come out typed for ``rt``'s parser stack
    (one typed decode; bytes it refuses go through the untyped decoder, so the error names what
    it always named: the version or the unreadable part). Raises ``Conflict`` (409, the "lost or
    expired" path) for a state of another ``STATE_VERSION`` (another release wrote it), and
    ``BadRequest`` for bytes that are not a stream state. A state whose settings are stored apart
    comes out with ``settings`` None (``settings_digest`` says which: the caller puts them back)."""
    st = None
    if rt.stack is not None:
        try:
            st = _typed(rt.stack).state.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            st = None
    if st is None:
        try:
            st = _state_decoder.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            _refuse_other_version(data)
            raise BadRequest(f"stored stream state is unreadable: {e}") from None
    if st.v != STATE_VERSION:
        raise _other_version(st.v)
    if (st.settings is None) == (not st.settings_digest):
        raise BadRequest("stored stream state is unreadable: it holds its settings and a settings digest, or "
                         "neither")
    if st.settings is not None and st.settings.v != STATE_VERSION:
        raise _other_version(st.settings.v)
    _check_pieces(st)
    if rt.stack is not None:
        try:  # the parser sub-states are typed here (a corrupted or foreign state fails here)
            for seed in (st.settings.seed if st.settings is not None else None, st.reseed):
                if seed is not None and seed.parser is not None:
                    seed.parser = rt.stack.load_state(seed.parser)
            for c in st.choices.values():
                if c.parser is not None:
                    c.parser = rt.stack.load_state(c.parser)
        except msgspec.ValidationError as e:
            raise BadRequest(f"stored stream state is unreadable: {e}") from None
    return st


def decode_settings(rt: ModelRuntime, data: bytes) -> StreamSettings:
    """Decode ``encode_settings`` bytes (the seed's parser state typed for ``rt``'s stack).
    Raises ``Conflict`` (the 409 "lost or expired") for settings of another ``STATE_VERSION``,
    ``BadRequest`` for bytes that are not stream settings. (The caller checks first that
    ``settings_digest(data)`` is the one its state records.)"""
    s = None
    if rt.stack is not None:
        try:
            s = _typed(rt.stack).settings.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            s = None
    if s is None:
        try:
            s = _settings_decoder.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            _refuse_other_version(data)
            raise BadRequest(f"stored stream settings are unreadable: {e}") from None
    if s.v != STATE_VERSION:
        raise _other_version(s.v)
    if rt.stack is not None and s.seed.parser is not None:
        try:
            s.seed.parser = rt.stack.load_state(s.seed.parser)
        except msgspec.ValidationError as e:
            raise BadRequest(f"stored stream settings are unreadable: {e}") from None
    return s


def _check_pieces(st: StreamState) -> None:
    """Bound every pieces number a stored state records: ``pieces_len`` in [0,
    ``MAX_PIECES_LEN``], each choice's ``spill`` / ``spill_args`` / ``spill_held`` whole ``[offset, length]``
    pairs inside it. Raises ``BadRequest`` ("unreadable", as for other damaged state bytes): a
    state that lies about its pieces is never used to read, write or pad them."""
    n = st.pieces_len
    if not 0 <= n <= MAX_PIECES_LEN:
        raise BadRequest(f"stored stream state is unreadable: pieces length {n} outside [0, {MAX_PIECES_LEN}]")
    for c in st.choices.values():
        if not (c.spill or c.spill_args or c.spill_held):  # (most chunks: nothing spilled)
            continue
        for r in (c.spill, c.spill_args, c.spill_held):
            if len(r) % 2 or any(r[i] < 0 or r[i + 1] < 0 or r[i] + r[i + 1] > n for i in range(0, len(r), 2)):
                raise BadRequest(f"stored stream state is unreadable: spilled ranges {r[:8]} do not lie in "
                                 f"its {n} bytes of pieces")
