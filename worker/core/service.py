"""Entry point of the pure derender core, shared by the Kafka worker, batch mode and tests.

No I/O happens here: JSON bytes in, JSON bytes out. Decoders and encoders are built once.
Every failure becomes an OpenAI error object; only a bug in the core itself yields a 500 (logged
with its traceback), never an exception out of ``derender``.
"""
from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from functools import lru_cache

import msgspec

from schemas import (
    CompletionRequest,
    DerenderChatRequest,
    DerenderChatStreamRequest,
    DerenderCompletionRequest,
    DerenderCompletionStreamRequest,
    ErrorResponse,
)
from schemas.responses import DerenderResponsesRequest
from worker.config import ServedModelConfig
from worker.core import stream as core_stream
from worker.core.derender import (
    ModelRuntime,
    bounded_generate_response,
    derender_chat,
    derender_completion,
    validate_chat,
    validate_completion,
)
from worker.core.errors import (
    BadRequest,
    Conflict,
    DerenderError,
    ModelNotFound,
    decode_or_400,
)
from worker.core.errors import error_body as error_body
from worker.core.messages import service as messages_service  # issue 26: the Messages kinds
from worker.core.responses import service as responses_service  # issue 14: the Responses kinds
from worker.core.responses.log import PieceLog, PiecesLost, PiecesNeeded

log = logging.getLogger(__name__)

KINDS = ("chat", "completion")  # the chat stream API's kinds; ``responses``: worker.core.responses (issue 14)
#: the kind headers of a chat/completion stream chunk (``_api_stream`` needs no probe for them)
_CHAT_STREAM_KINDS = frozenset(("chat", "completion", "chat-stream", "completion-stream"))


class _Probe(msgspec.Struct):
    """Just enough of a body to route it: model name, shape keys and a request id."""

    model: str | None = None
    generate_response: msgspec.Raw = msgspec.Raw()
    generate_responses: msgspec.Raw = msgspec.Raw()
    generate_chunk: msgspec.Raw = msgspec.Raw()
    responses_request: msgspec.Raw = msgspec.Raw()  # issue 14: tells a Responses body by shape

    @staticmethod
    def present(raw: msgspec.Raw) -> bool:
        """A Raw field counts as given unless missing or JSON null."""
        return len(raw) > 0 and bytes(raw) != b"null"


class _RidProbe(msgspec.Struct):
    request_id: str | None = None


class _ChatBody(DerenderChatRequest, kw_only=True):
    """A chat body in one decode, plus the other shapes' keys (Raw, so ``kind_of``'s rule can be
    applied without a routing pre-decode)."""

    generate_responses: msgspec.Raw = msgspec.Raw()
    generate_chunk: msgspec.Raw = msgspec.Raw()


class _CompletionBody(DerenderCompletionRequest, kw_only=True):
    """A completion body in one decode, plus the other shapes' keys (see ``_ChatBody``)."""

    generate_response: msgspec.Raw = msgspec.Raw()
    generate_chunk: msgspec.Raw = msgspec.Raw()


@lru_cache(maxsize=8)
def _bounded_body_decoders(vocab: int) -> tuple[msgspec.json.Decoder, msgspec.json.Decoder, msgspec.json.Decoder]:
    """``(chat, completion, responses)`` one-decode decoders whose output and prompt token ids are typed
    ``Annotated[int, Meta(ge=0, lt=vocab)]`` (issue 13 item 1: the id bounds checked inside the
    one msgspec decode, no per-id Python and no ``min``/``max`` pass), and so are the engine
    logprobs' sampled and candidate ids, there also required (not null). A body with an id
    outside ``[0, vocab)`` (or a null / missing logprob id) fails this decode and takes the probe
    path, whose validation names the id exactly as before (``derender.check_ids_and_logprobs`` /
    ``check_prompt_ids``). Built once per vocabulary size."""
    resp, tid = bounded_generate_response(vocab)
    ids = list[tid] | None
    chat = msgspec.defstruct("BoundedChatBody", [("generate_response", resp), ("prompt_token_ids", ids, None)],
                             bases=(_ChatBody,), kw_only=True)
    completion = msgspec.defstruct("BoundedCompletionBody", [("generate_responses", list[resp]),
                                                             ("prompt_token_ids", list[list[tid]] | None, None)],
                                   bases=(_CompletionBody,), kw_only=True)
    responses = msgspec.defstruct("BoundedResponsesBody", [("generate_response", resp), ("prompt_token_ids", ids, None)],
                                  bases=(DerenderResponsesRequest,), kw_only=True)
    return msgspec.json.Decoder(chat), msgspec.json.Decoder(completion), msgspec.json.Decoder(responses)


_probe_decoder = msgspec.json.Decoder(_Probe)
_chat_body_decoder = msgspec.json.Decoder(_ChatBody)
_completion_body_decoder = msgspec.json.Decoder(_CompletionBody)
_UNBOUNDED = (_chat_body_decoder, _completion_body_decoder, responses_service.body_decoder)
_rid_decoder = msgspec.json.Decoder(_RidProbe)
_list_rid_decoder = msgspec.json.Decoder(list[_RidProbe])
_chat_decoder = msgspec.json.Decoder(DerenderChatRequest)
_completion_decoder = msgspec.json.Decoder(DerenderCompletionRequest)
_chat_stream_decoder = msgspec.json.Decoder(DerenderChatStreamRequest)
_completion_stream_decoder = msgspec.json.Decoder(DerenderCompletionStreamRequest)
_encoder = msgspec.json.Encoder()


#: what a JSON decoder raises for a value that is not a valid body: malformed or wrongly typed
#: (``DecodeError``/``ValidationError``), or nested deeper than the interpreter's recursion limit
#: (``RecursionError``: msgspec checks the C stack, e.g. ``{"a":`` x 100,000)
_BAD_JSON = (msgspec.DecodeError, msgspec.ValidationError, RecursionError)


_decode_or_400 = decode_or_400  # (errors.decode_or_400: shared with the Responses and Messages services)


class DerenderResult:
    """Outcome of one derender call: ``body`` (JSON bytes of an OpenAI response or error object),
    ``status`` (HTTP-like: 200, 400, 404, 500), ``is_error``, ``request_id`` (when readable) and
    ``kind`` (``chat``/``completion`` when it could be told)."""

    __slots__ = ("body", "is_error", "status", "request_id", "kind")

    def __init__(self, body: bytes, status: int = 200, request_id: str | None = None, kind: str | None = None):
        self.body = body
        self.status = status
        self.is_error = status != 200
        self.request_id = request_id
        self.kind = kind

    def __repr__(self) -> str:
        return f"DerenderResult(status={self.status}, request_id={self.request_id!r}, kind={self.kind!r})"


def kind_of(probe: _Probe) -> str:
    """Tell a body's kind by its shape: ``generate_response`` -> chat (``responses`` when it
    carries ``responses_request``), ``generate_responses`` -> completion. Raises ``BadRequest``
    when neither or both are present, or for a streaming body. A Responses body without
    ``responses_request`` (no parser configured) has chat's shape: it needs the kind header."""
    has_one, has_many = _Probe.present(probe.generate_response), _Probe.present(probe.generate_responses)
    if _Probe.present(probe.generate_chunk):
        raise BadRequest("streaming chunk bodies (generate_chunk) go to the stream path, not here",
                         param="generate_chunk")
    if has_one == has_many:
        raise BadRequest("body must carry exactly one of generate_response (chat) or "
                         "generate_responses (completion)")
    if has_one and _Probe.present(probe.responses_request):
        return "responses"
    return "chat" if has_one else "completion"


class StreamResult(DerenderResult):
    """Outcome of one ``derender_stream`` call: ``body`` is a JSON list of OpenAI stream chunks
    (possibly empty) or, on failure, an OpenAI error object; plus ``done`` (every choice of the
    request finished: delete the stored state), ``seq`` (the sequence number this chunk was
    given; the store fences writes on it) and ``kind`` (``chat-stream``/``completion-stream``)."""

    __slots__ = ("done", "seq", "append", "pieces_len", "needs_pieces", "settings", "needs_settings")

    def __init__(self, body: bytes, status: int = 200, request_id: str | None = None, kind: str | None = None,
                 done: bool = False, seq: int | None = None):
        super().__init__(body, status, request_id, kind)
        self.done = done
        self.seq = seq
        #: with ``pieces=True``: bytes to write to the stream's pieces at offset
        #: ``pieces_len - len(append)`` with the returned state (one fenced write:
        #: ``worker.state.pieces``), and the pieces' length the state records
        self.append = b""
        self.pieces_len = 0
        #: ``(start, end)``: called with ``pieces=True`` and no reader, the chunk needs those
        #: stored piece bytes (nothing was derendered, ``body`` is empty: call again with a reader)
        self.needs_pieces: tuple[int, int] | None = None
        #: with ``settings_aside=True``: the stream's write-once settings to store with this
        #: chunk's state (its first chunk; ``b""`` otherwise), and whether the chunk needs the
        #: stored ones (not in this service's cache and not given: nothing was derendered,
        #: ``body`` is empty: call again with ``settings``)
        self.settings = b""
        self.needs_settings = False


class _StreamProbe(msgspec.Struct):
    model: str | None = None
    generate_chunk: msgspec.Raw = msgspec.Raw()
    chat_request: msgspec.Raw = msgspec.Raw()
    completion_request: msgspec.Raw = msgspec.Raw()


_stream_probe_decoder = msgspec.json.Decoder(_StreamProbe)


class _StreamBody(DerenderChatStreamRequest, kw_only=True):
    """A chat or completion stream chunk body in one typed decode (both request fields typed, so
    it validates at least what the kind's own decoder does); ``derender_stream`` falls back to
    the probe path, and its exact error messages, when this decode fails."""

    completion_request: CompletionRequest | None = None


_stream_body_decoder = msgspec.json.Decoder(_StreamBody)
_later_body_decoder = msgspec.json.Decoder(core_stream.LaterChunkBody)


class _RawRequests(msgspec.Struct):
    """The first chunk's request fields as raw bytes (their digest is stored in the state)."""

    chat_request: msgspec.Raw = msgspec.Raw(b"")
    completion_request: msgspec.Raw = msgspec.Raw(b"")


_raw_requests_decoder = msgspec.json.Decoder(_RawRequests)


class _SettingsNeeded(Exception):
    """A later chunk's stream settings are stored apart, neither cached nor given."""


#: the stream settings cache of a ``DerenderService``: most entries, most bytes (their encoded size;
#: decoded, a plain request's entry takes ~1.1 KB of Python objects, ~4.5 MB for 4,096 of them, and
#: one with 64 KiB of stop strings ~1.85x its 68 KB: ~15 MB per process at most)
SETTINGS_CACHE_ENTRIES = 4096
SETTINGS_CACHE_BYTES = 8 << 20


class SettingsCache:
    """A small bounded LRU of decoded stream settings (issue 13 item 4), keyed by ``(request id,
    settings digest)``: the digest is of the settings' stored bytes (``stream_state.
    settings_digest``), so an entry is exactly what decoding those bytes gives, never a stale one
    (a stream restarted under the same id has other settings bytes, hence another key: its
    ``created``, prompt seed or request differ; same bytes decode the same). At most
    ``entries`` entries and ``max_bytes`` of their encoded size (least recently used dropped
    first). Thread-safe; read-only entries (a stream never mutates its settings)."""

    def __init__(self, entries: int = SETTINGS_CACHE_ENTRIES, max_bytes: int = SETTINGS_CACHE_BYTES):
        self.entries = max(1, entries)
        self.max_bytes = max(1, max_bytes)
        self._d: OrderedDict[tuple[str, bytes], tuple[core_stream.StreamSettings, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._d)

    def get(self, rid: str, digest: bytes) -> core_stream.StreamSettings | None:
        """The cached settings of ``(rid, digest)``, or None (counted in ``hits`` / ``misses``,
        approximately under threads)."""
        key = (rid, digest)
        with self._lock:
            hit = self._d.get(key)
            if hit is not None:
                self._d.move_to_end(key)
        if hit is None:
            self.misses += 1
            return None
        self.hits += 1
        return hit[0]

    def put(self, rid: str, digest: bytes, settings: core_stream.StreamSettings, size: int) -> None:
        """Keep ``settings`` (``size``: their encoded bytes) under ``(rid, digest)``; settings
        larger than the whole budget are not kept."""
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._d.pop((rid, digest), None)
            if old is not None:
                self._bytes -= old[1]
            self._d[(rid, digest)] = (settings, size)
            self._bytes += size
            while len(self._d) > self.entries or self._bytes > self.max_bytes:
                _, (_, n) = self._d.popitem(last=False)
                self._bytes -= n


class DerenderService:
    """Derenders request bodies for a set of served models, routing by the body's ``model``.

    ``models``: served-model configs; each is served under its ``name`` and its ``aliases`` (one
    runtime shared by all its names; a response's ``model`` is the name the request used, as in
    vLLM). Runtimes (tokenizer + parsers) are built on first use (``preload()`` builds them all up
    front). Raises ``ValueError`` when two models claim the same name. Thread-safe."""

    def __init__(self, models: list[ServedModelConfig]):
        self.models: dict[str, ServedModelConfig] = {}
        for m in models:
            for name in (m.name, *m.aliases):
                if name in self.models and self.models[name] is not m:
                    raise ValueError(f"served model name {name!r} is given to two models")
                self.models[name] = m
        self._runtimes: dict[str, ModelRuntime] = {}
        self._lock = threading.Lock()
        #: decoded write-once stream settings of the streams this process derendered lately
        self.settings_cache = SettingsCache()
        #: ``(vocab bound, (chat, completion) one-decode decoders)``: ids are bounded in the one
        #: decode by the largest vocabulary among the loaded runtimes (None: none loaded yet)
        self._one: tuple[int | None, tuple[msgspec.json.Decoder, msgspec.json.Decoder]] = (None, _UNBOUNDED)

    def preload(self) -> None:
        """Load every model's tokenizer and parsers now. Raises ``ValueError`` on a bad config."""
        for cfg in {id(m): m for m in self.models.values()}.values():
            self.runtime(cfg.name)

    def runtime(self, name: str) -> ModelRuntime:
        """The runtime of served model ``name``. Raises ``ModelNotFound`` for an unknown name."""
        rt = self._runtimes.get(name)
        if rt is not None:
            return rt
        cfg = self.models.get(name)
        if cfg is None:
            shown = name if len(name) <= 256 else name[:256] + "..."  # a name from the body: bounded
            raise ModelNotFound(f"The model `{shown}` does not exist. Served models: {', '.join(self.models)}",
                                param="model", status=404)
        with self._lock:
            rt = self._runtimes.get(cfg.name)
            if rt is None:
                rt = ModelRuntime(cfg)
                self._runtimes[cfg.name] = rt
                vocab = max(r.tokenizer.vocab_size for r in self._runtimes.values())
                self._one = (vocab, _bounded_body_decoders(vocab))
            self._runtimes[name] = rt
        return rt

    def derender(self, body: bytes, kind: str | None = None, created: int | None = None) -> DerenderResult:
        """Derender one non-streaming body. ``kind``: ``chat``/``completion`` (e.g. from the
        message's ``derender-kind`` header) or None to tell by the body's shape. ``created``:
        the response's ``created`` (Unix seconds) when the engine response has none; the Kafka
        worker passes the input record's timestamp, batch passes None (= 0).

        Returns a ``DerenderResult``; never raises for bad input (400/404 error objects)."""
        if kind in (messages_service.KIND, messages_service.STREAM_KIND) or (
                kind is None and messages_service.is_messages_body(body)):  # issue 26: the Messages kind
            out, status, rid = messages_service.derender(self.runtime, body)
            return DerenderResult(out, status, rid, messages_service.KIND)
        request_id = None
        try:
            bound, decoders = self._one
            rq = _responses_decode(body, kind, decoders[2])
            if rq is not None:  # a Responses body in one typed decode (same outcome as the probe path)
                request_id = rq.generate_response.request_id
                rt = self._runtimes.get(rq.model) or self.runtime(rq.model)
                # bounded (the decoder's own type) by the largest vocabulary: inside this model's too?
                in_vocab = type(rq) is not DerenderResponsesRequest and bound is not None \
                    and bound <= rt.tokenizer.vocab_size
                resp = responses_service.derender(rt, rq, created, ids_in_vocab=in_vocab)
                return DerenderResult(_encoder.encode(resp), 200, request_id, responses_service.KIND)
            one = _one_decode(body, kind, decoders)
            if one is not None:  # the common case: one typed decode, same outcome as the probe path
                kind, req = one
                request_id = req.generate_response.request_id if kind == "chat" else \
                    req.generate_responses[0].request_id
                rt = self._runtimes.get(req.model) or self.runtime(req.model)
                # the decode bounded every id by ``bound``: inside this model's vocabulary too?
                in_vocab = bound is not None and bound <= rt.tokenizer.vocab_size
                if kind == "chat":
                    validate_chat(rt, req, ids_in_vocab=in_vocab)
                    resp = derender_chat(rt, req, created, json_logprobs=True)
                else:
                    validate_completion(rt, req, ids_in_vocab=in_vocab)
                    resp = derender_completion(rt, req, created, json_logprobs=True)
                return DerenderResult(_encoder.encode(resp), 200, request_id, kind)
            probe = _decode_or_400(_probe_decoder, body)
            request_id = _request_id(probe)
            shape = kind_of(probe)
            if kind == "responses" and shape == "chat":  # same shape without responses_request
                shape = "responses"
            if kind is not None and kind != shape:
                raise BadRequest(f"message kind {kind!r} does not match the body's shape ({shape})")
            kind = shape
            if probe.model is None:
                raise BadRequest("model is required", param="model")
            rt = self.runtime(probe.model)
            if kind == "chat":
                req = _decode_or_400(_chat_decoder, body)
                validate_chat(rt, req)
                resp = derender_chat(rt, req, created, json_logprobs=True)
            elif kind == "responses":
                resp = responses_service.derender(rt, _decode_or_400(responses_service.body_decoder, body), created)
            else:
                req = _decode_or_400(_completion_decoder, body)
                validate_completion(rt, req)
                resp = derender_completion(rt, req, created, json_logprobs=True)
            return DerenderResult(_encoder.encode(resp), 200, request_id, kind)
        except DerenderError as e:
            return DerenderResult(_encoder.encode(e.to_response(request_id)), e.status, request_id, kind)
        except Exception as e:  # a core bug: report it as a 500 without losing the worker
            log.exception("derender failed for request_id=%s", request_id)
            err = DerenderError(f"internal error: {type(e).__name__}: {e}", status=500)
            return DerenderResult(_encoder.encode(err.to_response(request_id)), 500, request_id, kind)

    #: streams end with a usage chunk even without ``stream_options.include_usage`` (vLLM's
    #: ``--enable-force-include-usage``; the parity reference always carries usage)
    force_include_usage: bool = True

    def derender_responses_stream(self, body: bytes, state_bytes: bytes | None, reader=None, seq: int | None = None,
                                  created: int | None = None) -> responses_service.ResponsesStreamResult:
        """One streaming Responses chunk (issue 14): see ``worker.core.responses.service.derender_stream``
        (``reader(start, end)`` reads the stream's piece log; the result carries the state to
        store and the bytes to append to the log). Never raises for bad input."""
        return responses_service.derender_stream(self.runtime, body, state_bytes, reader, seq, created)

    def derender_messages_stream(self, body: bytes, state_bytes: bytes | None, reader=None
                                 ) -> messages_service.MessagesStreamResult:
        """One streaming Messages chunk (issue 26): see ``worker.core.messages.service.derender_stream``
        (``reader(start, end)`` reads the stream's piece log; the result carries the state to
        store and the bytes to append to the log). Never raises for bad input."""
        return messages_service.derender_stream(self.runtime, body, state_bytes, reader)

    def _api_stream(self, body: bytes, state_bytes: bytes | None, seq: int | None, kind: str | None,
                    created: int | None, pieces: bool, reader) -> tuple[StreamResult, bytes | None] | None:
        """``derender_stream`` of a Responses stream (``responses_service.is_responses_stream``) or
        a Messages stream (``messages_service.is_messages_stream``); None for a chat/completion one."""
        if kind in _CHAT_STREAM_KINDS:  # (the Kafka worker's header: no probe of either API)
            return None
        if messages_service.is_messages_stream(body, state_bytes, kind):  # issue 26: Messages streams
            return self._messages_stream(body, state_bytes, seq, pieces, reader)
        if responses_service.is_responses_stream(body, state_bytes, kind):  # issue 14: Responses streams
            if pieces:
                return self._responses_with_pieces(body, state_bytes, seq, created, reader)
            rres, packed = responses_service.derender_stream_packed(self.runtime, body, state_bytes, seq, created)
            return StreamResult(rres.body, rres.status, rres.request_id, rres.kind, rres.done, rres.seq), packed
        return None

    def _messages_stream(self, body: bytes, state_bytes: bytes | None, seq: int | None, pieces: bool,
                         reader) -> tuple[StreamResult, bytes | None]:
        """``derender_stream`` for a Messages stream (issue 26): with ``pieces`` its piece log is
        the stream's pieces and its state ``PIECES_MAGIC`` + the core's state; without, the
        stored value packs both (``PACKED_MAGIC``). A state of the other layout or kind: 400."""
        magic = messages_service.PIECES_MAGIC if pieces else messages_service.PACKED_MAGIC
        if state_bytes and state_bytes[:len(magic)] != magic:
            err = messages_service.error_body("stored Messages stream state is unreadable: not a Messages "
                                              "stream state of this layout", 400)
            return StreamResult(err, 400, None, messages_service.STREAM_KIND), None
        if not pieces:
            mres, packed = messages_service.derender_stream_packed(self.runtime, body, state_bytes)
            res = StreamResult(mres.body, mres.status, mres.request_id, mres.kind, mres.done)
            return res, packed
        mres = messages_service.derender_stream(self.runtime, body, state_bytes[len(magic):] if state_bytes else None,
                                                reader, seq)
        res = StreamResult(mres.body, mres.status, mres.request_id, mres.kind, mres.done, seq)
        res.needs_pieces = mres.needs_pieces
        if mres.state is None:
            return res, None
        res.append, res.pieces_len = mres.log_append, mres.log_len
        return res, magic + mres.state

    def _responses_with_pieces(self, body: bytes, state_bytes: bytes | None, seq: int | None, created: int | None,
                               reader) -> tuple[StreamResult, bytes | None]:
        """``derender_stream(pieces=True)`` for a Responses stream: its piece log goes to the
        stream's pieces (``result.append`` / ``pieces_len``), its state is ``PIECES_MAGIC`` + the
        core's state. A packed state (``PACKED_MAGIC``: the log inside the value, as a caller without
        pieces stores it) is another layout: refused with the 409 "lost or expired"."""
        magic = responses_service.PIECES_MAGIC
        if state_bytes and state_bytes[:len(magic)] != magic:
            if state_bytes[:len(magic)] == responses_service.PACKED_MAGIC:
                err: DerenderError = Conflict(
                    "stored Responses stream state has another layout (its log packed inside it: written by "
                    "another release): the stream state was lost or expired; stream ended", param="stream_state")
            else:  # (as the packed path answers a state of another kind)
                err = BadRequest("stored Responses stream state is unreadable: not a Responses stream state")
            return (StreamResult(_encoder.encode(err.to_response(None)), err.status, None,
                                 responses_service.STREAM_KIND), None)
        rres = responses_service.derender_stream(self.runtime, body, state_bytes[len(magic):] if state_bytes else None,
                                                 reader, seq, created)
        res = StreamResult(rres.body, rres.status, rres.request_id, rres.kind, rres.done, rres.seq)
        res.needs_pieces = rres.needs_pieces
        if rres.state is None:
            return res, None
        res.append, res.pieces_len = rres.log_append, rres.log_len
        return res, magic + rres.state

    def stream_settings(self, rt: ModelRuntime, request_id: str, digest: bytes,
                        given: bytes | None) -> core_stream.StreamSettings:
        """The write-once settings of a stream whose state records ``digest`` (settings stored
        apart): from ``settings_cache`` (keyed by ``request_id`` and ``digest``: never another
        stream's), else decoded from ``given`` (the stored settings bytes) and cached. Raises
        ``_SettingsNeeded`` when neither (``given`` None), ``Conflict`` (409, the "lost or
        expired" path) when ``given`` is not the settings the state was written with (lost,
        expired or overwritten: empty or another digest), what ``decode_settings`` raises."""
        got = self.settings_cache.get(request_id, digest)
        if got is not None:
            return got
        if given is None:
            raise _SettingsNeeded()
        if not given or core_stream.settings_digest(given) != digest:
            raise Conflict("the stream's settings (stored once, with its first chunk) are " +
                           ("missing" if not given else "not the ones its state was written with") +
                           ": the stream state was lost or expired, or overwritten; stream ended",
                           param="stream_state")
        got = core_stream.decode_settings(rt, given)
        self.settings_cache.put(got.request_id, digest, got, len(given))
        return got

    def _settings_out(self, rt: ModelRuntime, state, res: StreamResult, aside: bool) -> None:
        """Where the settings of ``state`` go after a chunk: with ``aside``, stored apart (on the
        stream's first chunk, or a state that held them inside: ``res.settings`` carries their
        bytes once, cached here); without it, inside the state again."""
        if not aside:
            state.settings_digest = b""
            return
        if state.settings_digest:
            return
        data = core_stream.encode_settings(state.settings)
        state.settings_digest = core_stream.settings_digest(data)
        res.settings = data
        # (cached as decoded from its bytes: a hit and a miss give the same object)
        self.settings_cache.put(state.request_id, state.settings_digest, core_stream.decode_settings(rt, data),
                                len(data))

    def derender_stream(self, body: bytes, state_bytes: bytes | None, seq: int | None = None,
                        kind: str | None = None, created: int | None = None, pieces: bool = False,
                        reader=None, settings_aside: bool = False,
                        settings: bytes | None = None) -> tuple[StreamResult, bytes | None]:
        """Derender one streaming chunk body (``generate_chunk``) against the request's stored state.

        ``state_bytes``: what the previous call returned for this request id (None/empty for the
        first chunk); ``seq``: the chunk's sequence number within the request when the transport
        has one (any increasing number, e.g. the Kafka offset), else the state's own counter is used;
        a chunk whose ``seq`` is below the state's ``next_seq`` is stale (409, state unchanged).
        ``kind``: ``chat``/``completion`` (or ``chat-stream``/``completion-stream``) or None to tell
        by the body (``completion_request`` -> completion, else chat; a stored state's kind wins).
        A Responses stream (kind ``responses``/``responses-stream``, a Responses state, or a first
        chunk carrying ``responses_request``; replies are JSON lists of Responses events, issue 14)
        goes to ``responses_service``: with ``pieces`` its log is the stream's pieces
        (``_responses_with_pieces``), without them the stored value packs it
        (``derender_stream_packed``).
        ``created``: Unix seconds for every chunk of the request, taken on its first chunk (the
        state keeps it; the Kafka worker passes the first chunk record's timestamp; None = 0).

        Returns ``(result, new_state_bytes)``: ``result.body`` is the JSON list of OpenAI chunks to
        publish (or an error object, status 400/404/409/500); ``new_state_bytes`` is the state to store
        under ``result.seq`` (None on error: keep the stored state); when ``result.done`` the stream
        is complete and the stored state should be deleted. Never raises for bad input.

        ``pieces``: the caller keeps the stream's append-only pieces (``worker.state.pieces``):
        a chat stream's open tool call then keeps only what its parser still reads in the state
        (``worker.core.stream``, "Bounded state"); ``result.append`` / ``result.pieces_len`` say
        what to write with the state; ``reader(start, end)`` reads the stored pieces (None: a
        chunk that needs them returns ``result.needs_pieces``; fewer bytes than recorded: 409).
        Without ``pieces`` the state holds everything (a caller that stores one value).

        ``settings_aside``: the caller stores a chat/completion stream's write-once settings apart
        (issue 13 item 4): the first chunk returns them in ``result.settings`` (store them once,
        with its state; states then hold only their digest); a later chunk takes them from
        ``settings_cache``, else from ``settings`` (``stream_settings``), else returns
        ``result.needs_settings`` (nothing derendered: call again with ``settings``)."""
        if kind not in _CHAT_STREAM_KINDS:  # (the Kafka worker's chat header: no call)
            api = self._api_stream(body, state_bytes, seq, kind, created, pieces, reader)
            if api is not None:  # a Responses (issue 14) or Messages (issue 26) stream
                return api
        request_id = None
        kind_used = None
        later = bool(state_bytes)  # after the first chunk only generate_chunk is decoded
        try:
            try:  # one typed decode; on failure the probe path below names the error as always
                typed = (_later_body_decoder if later else _stream_body_decoder).decode(body)
            except _BAD_JSON:
                typed = None
            if typed is not None:
                request_id = typed.generate_chunk.request_id
                model = typed.model
                has_completion_request = _Probe.present(typed.completion_request_raw) if later \
                    else typed.completion_request is not None
            else:
                request_id, model, has_completion_request = _probe_stream(body)
                if model is None:
                    raise BadRequest("model is required", param="model")
            rt = self.runtime(model)
            state = core_stream.decode_state(rt, state_bytes) if state_bytes else None
            if state is not None and state.settings is None:  # stored apart: cached, given or needed
                state.settings = self.stream_settings(rt, request_id or "", state.settings_digest, settings)
            if kind is not None:
                kind = kind.removesuffix("-stream")
                if kind not in KINDS:
                    raise BadRequest(f"unknown kind {kind!r}")
            if state is not None:
                skind = state.settings.kind
                if kind is not None and kind != skind:
                    raise BadRequest(f"message kind {kind!r} does not match the stream's kind ({skind})")
                kind = skind
            elif kind is None:
                kind = "completion" if has_completion_request else "chat"
            kind_used = kind + "-stream"
            if seq is not None and not 0 <= seq <= 2**63 - 2:  # next_seq = seq + 1 must fit an int64
                raise BadRequest(f"sequence number {seq} outside [0, 2**63 - 2]", param="seq")
            if seq is not None and state is not None and seq < state.next_seq:
                raise Conflict(f"stale chunk: sequence number {seq} < next expected {state.next_seq}", param="seq")
            if later:
                req = typed if typed is not None else _decode_or_400(_later_body_decoder, body)
                raw = req.request_raw(kind)
            else:
                req = typed if typed is not None else \
                    _decode_or_400(_chat_stream_decoder if kind == "chat" else _completion_stream_decoder, body)
                raws = _raw_requests_decoder.decode(body)  # (valid JSON: the typed decode passed)
                raw = bytes(raws.chat_request if kind == "chat" else raws.completion_request)
            log_ = None
            if kind == "chat":
                if pieces:
                    log_ = PieceLog(reader, state.pieces_len if state is not None else 0)
                chunks, state = core_stream.derender_chat_chunk(
                    rt, req, state, force_include_usage=self.force_include_usage, created=created,
                    request_raw=raw, pieces=log_)
            else:
                chunks, state = core_stream.derender_completion_chunk(
                    rt, req, state, force_include_usage=self.force_include_usage, created=created,
                    request_raw=raw)
            if seq is not None:
                state.next_seq = seq + 1
            done = state.done
            res = StreamResult(_encoder.encode(chunks), 200, request_id, kind_used, done, state.next_seq - 1)
            if pieces:
                res.append = bytes(log_.new) if log_ is not None else b""
                res.pieces_len = state.pieces_len
            if not (settings_aside and state.settings_digest):  # (else they stay apart: nothing to do)
                self._settings_out(rt, state, res, settings_aside)
            return res, core_stream.encode_state(state)
        except _SettingsNeeded:
            return _needing(request_id, kind_used, None), None
        except PiecesNeeded as e:
            return _needing(request_id, kind_used, (e.start, e.end)), None
        except PiecesLost as e:
            err = Conflict(f"{e}; stream ended", param="stream_state")
            return StreamResult(_encoder.encode(err.to_response(request_id)), 409, request_id, kind_used), None
        except DerenderError as e:
            return StreamResult(_encoder.encode(e.to_response(request_id)), e.status, request_id, kind_used), None
        except Exception as e:  # a core bug: report it as a 500 without losing the worker
            log.exception("derender_stream failed for request_id=%s", request_id)
            err = DerenderError(f"internal error: {type(e).__name__}: {e}", status=500)
            return StreamResult(_encoder.encode(err.to_response(request_id)), 500, request_id, kind_used), None


def _needing(request_id: str | None, kind: str | None, pieces: tuple[int, int] | None) -> StreamResult:
    """The result of a chunk that needs what the caller keeps before it can be derendered
    (nothing derendered, empty body): the stored piece bytes ``pieces`` (``(start, end)``), or,
    with None, the stream's stored settings."""
    res = StreamResult(b"", 0, request_id, kind)
    if pieces is None:
        res.needs_settings = True
    else:
        res.needs_pieces = pieces
    return res


def _probe_stream(body: bytes) -> tuple[str | None, str | None, bool]:
    """``(request id, model, has a completion_request)`` of a stream chunk body the typed decode
    refused, by the probe (the error messages it always gave: 400 for bytes that are no JSON
    object, or without ``generate_chunk``)."""
    probe = _decode_or_400(_stream_probe_decoder, body)
    if not _Probe.present(probe.generate_chunk):
        raise BadRequest("streaming body must carry generate_chunk", param="generate_chunk")
    try:
        request_id = _rid_decoder.decode(probe.generate_chunk).request_id
    except _BAD_JSON:
        request_id = None
    return request_id, probe.model, _Probe.present(probe.completion_request)


def _one_decode(body: bytes, kind: str | None, decoders=_UNBOUNDED):
    """``(kind, typed body)`` when ``body`` decodes as a chat (or completion) body in one typed
    decode and has exactly that shape (``kind_of``'s rule: the other shapes' keys absent or
    null; ``kind``, when given, agrees); None otherwise: the caller then takes the probe path,
    which reports the same error message it always did. Which shape is tried is guessed from the
    bytes (``"generate_responses"`` present: completion); a wrong guess only costs the fallback.
    A body that may be a Responses body (``"responses_request"`` in its bytes, or the kind says
    so) always takes the probe path, which tells the Responses shape. ``decoders``: the
    ``(chat, completion)`` decoders (``_bounded_body_decoders``: an id outside their bound also
    takes the probe path)."""
    if kind == "responses" or b'"responses_request"' in body:
        return None
    want = kind if kind is not None else ("completion" if b'"generate_responses"' in body else "chat")
    try:
        if want == "chat":
            req = decoders[0].decode(body)
            # (``_Probe.present`` of the other shapes' keys, inlined: a missing key is empty)
            if (req.generate_responses and bytes(req.generate_responses) != b"null") or \
                    (req.generate_chunk and bytes(req.generate_chunk) != b"null"):
                return None
        elif want == "completion":
            req = decoders[1].decode(body)
            if _Probe.present(req.generate_response) or _Probe.present(req.generate_chunk) \
                    or not req.generate_responses:
                return None
        else:
            return None
    except _BAD_JSON:
        return None
    return want, req


def _responses_decode(body: bytes, kind: str | None, decoder: msgspec.json.Decoder = responses_service.body_decoder):
    """The ``DerenderResponsesRequest`` of a body that has the Responses shape in one typed
    decode (``kind`` ``responses``, or None and a non-null ``responses_request``; no
    ``generate_responses`` / ``generate_chunk`` key in its bytes, so ``kind_of`` would say
    ``responses`` too), else None: the caller takes the probe path, whose error messages stay.
    ``decoder``: ``_bounded_body_decoders``' third (its own Struct type: ids bounded); a body it
    refuses (an id outside its bound) is decoded again unbounded (a ``DerenderResponsesRequest``:
    the derender's checks name the id, the reply as before)."""
    if kind != responses_service.KIND and (kind is not None or b'"responses_request"' not in body):
        return None  # (a chat / completion body: no byte scan beyond the one ``_one_decode`` makes)
    if b'"generate_responses"' in body or b'"generate_chunk"' in body:
        return None
    try:
        req = decoder.decode(body)
    except _BAD_JSON:
        if decoder is responses_service.body_decoder:
            return None
        try:
            req = responses_service.body_decoder.decode(body)
        except _BAD_JSON:
            return None
    return req if kind is not None or req.responses_request is not None else None


def _request_id(probe: _Probe) -> str | None:
    """request_id of the (first) engine response, when it can be read."""
    try:
        if _Probe.present(probe.generate_response):
            return _rid_decoder.decode(probe.generate_response).request_id
        if _Probe.present(probe.generate_responses):
            rids = _list_rid_decoder.decode(probe.generate_responses)
            return rids[0].request_id if rids else None
        if _Probe.present(probe.generate_chunk):
            return _rid_decoder.decode(probe.generate_chunk).request_id
    except _BAD_JSON:
        return None
    return None


#: the APIs a record can speak (its kinds without ``-stream``; ``record_api``)
APIS = ("chat", "completion", responses_service.KIND, messages_service.KIND)


def record_api(kind: str | None, body: bytes = b"", state: bytes | None = None) -> str | None:
    """The API a record speaks, for an error object built outside the core (issue 26 item 5):
    its kind (the ``derender-kind`` header or the core's result kind, ``-stream`` dropped) when
    one of ``APIS``; else a stream's stored ``state`` (the Messages / Responses magic); else the
    body's shape (a non-null ``messages_request`` / ``responses_request``); None when nothing
    tells (a chat or completion body: OpenAI's error object either way)."""
    api = kind.removesuffix("-stream") if kind else None
    if api in APIS:
        return api
    if messages_service.is_messages_stream(body, state, None):
        return messages_service.KIND
    if responses_service.is_responses_stream(body, state, None):
        return responses_service.KIND
    return None


def error_body_for(api: str | None, message: str, status: int = 400, request_id: str | None = None) -> bytes:
    """JSON bytes of the error object of ``api`` (``record_api``) with ``status``: Anthropic's
    ``{"type": "error", "error": {"type", "message"}}`` for ``messages``
    (``messages_service.error_body``: the status travels beside it, no request id inside),
    else OpenAI's (``errors.error_body``, with ``request_id``)."""
    if api == messages_service.KIND:
        return messages_service.error_body(message, status)
    return error_body(message, status, request_id)


__all__ = ["DerenderService", "DerenderResult", "StreamResult", "SettingsCache", "error_body", "ErrorResponse", "KINDS",
           "APIS", "record_api", "error_body_for"]
