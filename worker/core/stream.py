"""Pure streaming derender: one engine chunk (``DerenderChatStreamRequest`` /
``DerenderCompletionStreamRequest``) plus the request's checkpointed ``StreamState`` -> OpenAI
stream chunks plus the next state. No I/O; the state is held by the caller (Redis:
``worker.state.redis_store``; batch mode: in memory).

API
---
* ``derender_chat_chunk(rt, body, state, pieces=None) -> (chunks, state)`` and
  ``derender_completion_chunk(rt, body, state) -> (chunks, state)``: ``state`` is None for the
  first chunk of a request; the returned state is the same object, advanced. Raise
  ``BadRequest`` (state untouched in that case: validation runs before any mutation).
  ``request_raw``: the raw bytes of the body's request (its digest is stored on the first chunk,
  compared on later ones: ``check_request_digest``); ``pieces``: "Bounded state" below.
* ``encode_state(state) -> bytes`` / ``decode_state(rt, data) -> StreamState`` (msgspec
  msgpack; ``decode_state`` retypes the parser sub-states with ``ParserStack.load_state``): the
  state types and their codec live in ``worker.core.stream_state`` (re-exported here).
* ``DerenderService.derender_stream(body, state_bytes, seq=None)`` (worker/core/service.py) wraps
  this for bytes in / bytes out; see its docstring for the transport contract.

State (one per request id; per choice index a ``ChoiceState``)
--------------------------------------------------------------
Per choice: the incremental detokenizer checkpoint (bounded window), the logprob context (<= 4
ids) and completion ``text_offset``, the parser ``StackState``, ``role_sent``, tool-call ids
assigned so far (deterministic: ``tool_call_id(request_id, choice, call_index, fmt)``), running
``completion_tokens``/``reasoning_tokens``, ``finished``. Per request: a compact copy of the
request fields used after the first chunk (``StreamOpts``), the detokenizer/parser seed built from
the prompt (so a choice whose first chunk carries no ``prompt_token_ids`` starts right), prompt
token counts, ``next_seq`` (chunks with a lower sequence number are stale) and ``usage_sent``.
The request-wide part fixed by the first chunk (``StreamSettings``: ``StreamOpts``, the prompt
seed, request id, model, ``created``, request digest) is written once: kept inside the state for
a caller storing one value, or stored apart (``DerenderService.derender_stream(settings_aside=
True)``: the state records its digest); a later chunk opening choices with its own prompt keeps
their seed in ``StreamState.reseed``, never in the settings.
A finished choice keeps only its counters. The size is bounded by the detokenizer window plus
the parser's buffered markup (plus a few ints per choice), never by the stream length; work per
chunk is O(delta). ``req_digest``: blake2b-128 of the first chunk's raw request (later chunks'
requests are compared with it, never decoded); ``v``: ``STATE_VERSION`` (another version is
refused with the 409 "lost or expired", never misread).

Bounded state (issue 13 item 5)
-------------------------------
An open tool call buffers its body in the parser state until it closes (the non-streaming parse
of the whole body decides the answer), so a never-closed or huge call would make the state grow
with it. With ``pieces`` (a ``PieceLog`` over the stream's append-only pieces,
``worker.state.pieces``; ``DerenderService.derender_stream(pieces=True)``), once ``SPILL_CHARS``
of an open call's body are held (``ToolParser.body_held``), the part its parser no longer reads
before the call closes (``ToolParser.spill_point``) is appended to the pieces
(``ChoiceState.spill``: its byte ranges, ``spill_crc`` their bytes' running CRC-32, checked when
read back; ``StreamState.pieces_len``: the pieces' length, which readers truncate to) and leaves
the state. Every engine that buffers an open call does it:

* tagged (``TaggedToolParser``: hermes, qwen3_coder, deepseek, kimi_k2, ...): everything before
  the end-marker search, the JSON lexer and the incremental streamer's offsets; in
  ``incremental`` mode the arguments already sent are not kept in the state, and an open XML
  call's entries already sent (``ArgStream.args``, read again only at the block's close) leave
  it the same way (``spill_args``, ``ChoiceState.spill_args``);
* jsontail (``JsonTailToolParser``: mistral, llama3_json, phi4_mini_json, granite-20b-fc): the
  whole body in ``whole`` mode (parsed only at the end), everything before the incremental
  streamer's head match / JSON lexer offsets in ``incremental`` mode;
* marker (``MarkerToolParser``: pythonic, llama4_pythonic, olmo3, granite, xlam) and Harmony
  (gpt-oss's ``openai``, text and id modes): the whole body, read only when it is parsed
  (``worker.parsers.base.AppendedBody``);
* required / named ``tool_choice``: the content held for JSON parsing (``StackState.held``,
  read only at the end) leaves too (``ParserStack.spill_held``, ``ChoiceState.spill_held``).

When the call closes or the output ends, the parser raises ``BodyNeeded``; the choice's step is
rerun from its state before the step (a snapshot, taken only while something is spilled) with
the spilled text read back (``PiecesNeeded`` when the caller gave no reader). Same reply bytes as
without pieces, whatever the chunking. Streams with stop strings spill the same way (the answer
stepping of ``worker.core.answer`` is rerun as a whole; its held-back tail, ``ChoiceState.held``,
is shorter than the longest stop string). What stays per choice: the detokenizer window, the
parser's lexer positions and short tails (a held-back marker prefix, a call head up to
``incremental.MAX_HEAD``), the ranges, a few ints.

Output rules (same answer as non-streaming for the same tokens, whatever the chunking):

* chat: a first chunk per choice with ``delta = {role: assistant, content: ""}``, then per body
  one chunk per choice carrying ``content`` / ``reasoning`` / ``tool_calls`` deltas (a call's
  first fragment has ``id``, ``type`` and ``function.name``), the chat ``logprobs`` of the
  chunk's tokens (also on parsed streams), and on the choice's last chunk ``finish_reason``
  (``stop`` -> ``tool_calls`` when calls were made for auto/required tool_choice, like
  ``final_finish_reason``) and ``stop_reason``; a chunk with nothing to say is not emitted;
* completion: ``text`` and completion ``logprobs`` (``text_offset`` continuing from the
  streamed text length), ``echo`` prefix on the choice's first chunk;
* the final stop token (EOS or int ``stop_reason``) of the chunk carrying ``finish_reason`` is
  not detokenized unless ``include_stop_str_in_output`` (``stop_token_trimmed``); it is still
  counted in usage and present in logprobs; an EOS id ending a chunk without ``finish_reason``
  starts the next chunk (``ChoiceState.held_stop_id``, docs/streaming.md);
* stop strings (the request's ``stop``, applied here as vLLM's detokenizer applies them: the
  engine behind a derender never sees them): per choice the last ``max(len(s)) - 1`` characters
  of new text are held back (``ChoiceState.held``), each token that adds text is checked with
  ``check_stop_strings`` (once more than ``min_tokens`` ids were seen), exactly as the
  non-streaming ``detokenize_with_stop``; on a match the text up to the cut (through it with
  ``include_stop_str_in_output``) is released, the chunk carries ``finish_reason`` ``stop`` and
  the string as ``stop_reason`` (chat: ``tool_calls`` when calls were made, as non-streaming),
  its logprobs / ``token_ids`` end at the matching token, and the choice is ``stopped``: the
  engine's later tokens of that choice (it keeps generating until it learns) produce no output
  but are counted in usage; the choice finishes (usage chunk) with the engine's own finish.
  Without a match the held-back text is released on the choice's final chunk. Chat: stop
  strings apply to the answer, not to the reasoning (``worker.core.answer.step_answer``, the
  same stepping as non-streaming): each token's text goes through the reasoning parser first,
  only the answer text it emits is held back and checked, reasoning deltas go out at once, and
  released answer text goes through the tool parser, so parsing stays split-independent;
* usage: once every expected choice (chat ``n``; completion ``n`` x prompts) has finished, a last
  chunk with ``choices: []`` and ``usage`` for the whole request (``completion_tokens_details.
  reasoning_tokens`` when a reasoning parser is configured) when ``stream_options.include_usage``
  or ``force_include_usage`` (default on: the parity reference always carries it, as vLLM's
  ``--enable-force-include-usage``). When the expected number of choices cannot be told, a usage
  chunk follows every choice end with the running totals (the last one is the request total).

Accepted although vLLM's render server refuses them: a chunk with several choices (state per
choice), a first chunk without ``prompt_token_ids`` on a parser server (decoded unseeded, as the
non-streaming path). Refused (400): ``stream: false``, duplicate choice indices in a chunk, a
chunk for a finished choice, out-of-vocab ids, logprobs not matching token ids, more than
``max_model_len`` tokens in a choice, more than ``max_logprobs`` candidates, ``prompt_tokens`` !=
len(``prompt_token_ids``), a first chat chunk without ``chat_request`` when a parser is
configured, a model change mid-stream, a chunk of the other kind than the stream's, a later
chunk whose request (``chat_request`` / ``completion_request``) is not byte-identical to the
first chunk's (compared by ``request_digest``; later chunks' requests are never decoded).
"""
from __future__ import annotations

from typing import Any

import msgspec

from schemas import (
    ChatCompletionStreamChoice,
    ChatCompletionStreamResponse,
    ChatLogprobs,
    CompletionStreamChoice,
    CompletionStreamResponse,
    CompletionTokensDetails,
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    DerenderChatStreamRequest,
    DerenderCompletionStreamRequest,
    GenerateTokensStreamChoice,
    UsageInfo,
)
from worker.core.answer import step_answer
from worker.core.derender import (
    _DEFAULT_CHAT_REQUEST,
    _DEFAULT_COMPLETION_REQUEST,
    ModelRuntime,
    check_ids_and_logprobs,
    check_prompt_ids,
    check_request_numbers,
    effective_skip_special_tokens,
    final_finish_reason,
    request_context,
)
from worker.core.detokenize import (
    DetokState,
    IncrementalDetokenizer,
    check_stop_strings,
    held_stop_step,
    step_text,
    stop_strings,
)
from worker.core.errors import BadRequest
from worker.core.logprobs import chat_logprobs, completion_logprobs, next_context
from worker.core.responses.log import PieceLog
from worker.core.stream_spill import clear_spills as _clear_spills
from worker.core.stream_spill import need_every_spill as _need_every_spill
from worker.core.stream_spill import spill as _spill
from worker.core.stream_spill import unspill as _unspill
from worker.core.stream_state import (
    STATE_VERSION,
    ChoiceState,
    LaterChunkBody,
    StreamOpts,
    StreamSeed,
    StreamSettings,
    StreamState,
    _state_encoder,
    _typed,
    check_request_digest,
    decode_settings,
    decode_state,
    encode_settings,
    encode_state,
    request_digest,
    settings_digest,
)
from worker.parsers.base import BodyNeeded, Delta
from worker.parsers.stack import tool_call_id

__all__ = ["StreamOpts", "ChoiceState", "StreamSeed", "StreamSettings", "StreamState", "derender_chat_chunk",
           "derender_completion_chunk", "encode_state", "decode_state", "encode_settings", "decode_settings",
           "settings_digest", "STATE_VERSION", "request_digest", "check_request_digest", "LaterChunkBody"]

# ------------------------------------------------------------------------------ validation ---
def _check_stream_choice(rt: ModelRuntime, c: GenerateTokensStreamChoice, prior: int, where: str) -> None:
    cfg = rt.config
    ids = c.token_ids or []
    if cfg.max_model_len is not None and prior + len(ids) > cfg.max_model_len:
        raise BadRequest(f"{where}: {prior + len(ids)} output tokens exceed max_model_len ({cfg.max_model_len}).",
                         param=f"{where}.token_ids")
    check_ids_and_logprobs(rt, ids, c.logprobs, where)


def _validate_common(rt: ModelRuntime, body, state: StreamState | None, kind: str,
                     request_raw: bytes | None = None) -> None:
    if body.stream is False:
        raise BadRequest("stream=false on a streaming chunk body (generate_chunk)", param="stream")
    if state is not None:
        if state.kind != kind:
            raise BadRequest(f"chunk of a {kind} stream for a {state.kind} stream state")
        if state.model != body.model:
            raise BadRequest(f"model changed mid-stream ({state.model!r} -> {body.model!r})", param="model")
        rid = body.generate_chunk.request_id or ""
        if rid != state.request_id:
            raise BadRequest(f"request_id {rid!r} does not match the stream state's {state.request_id!r}",
                             param="generate_chunk.request_id")
    if body.prompt_token_ids is not None and body.prompt_tokens is not None \
            and body.prompt_tokens != len(body.prompt_token_ids):
        raise BadRequest(f"prompt_tokens ({body.prompt_tokens}) != len(prompt_token_ids) "
                         f"({len(body.prompt_token_ids)})", param="prompt_tokens")
    if state is not None:  # a later chunk's request: compared with the first one's, never decoded
        if request_raw:  # (none: nothing to compare)
            check_request_digest(state, request_raw, kind)
        req = None
    else:
        req = body.chat_request if kind == "chat" else body.completion_request
    if req is not None:  # (a later chunk without prompt_tokens has no number to bound)
        check_request_numbers(rt, n=req.n, top_logprobs=req.top_logprobs if kind == "chat" else req.logprobs,
                              min_tokens=req.min_tokens, prompt_tokens=[body.prompt_tokens],
                              logprobs_param="top_logprobs" if kind == "chat" else "logprobs", stop=req.stop)
    elif body.prompt_tokens is not None:
        check_request_numbers(rt, n=None, top_logprobs=None, min_tokens=None, prompt_tokens=[body.prompt_tokens],
                              logprobs_param="")
    if body.prompt_token_ids:
        check_prompt_ids(rt, body.prompt_token_ids, "prompt_token_ids")
    if body.generate_chunk.prompt_token_ids:
        check_prompt_ids(rt, body.generate_chunk.prompt_token_ids, "generate_chunk.prompt_token_ids")
    choices = body.generate_chunk.choices
    seen: set[int] | None = set() if len(choices) > 1 else None  # (one choice: no duplicate)
    known = state.choices if state is not None else {}
    n_known = len(known)
    cfg = rt.config
    max_n = cfg.max_n
    vocab = rt.tokenizer.vocab_size
    for c in choices:
        i = c.index
        if seen is not None:
            if i in seen:
                raise BadRequest(f"choice index {i} appears twice in one chunk", param="generate_chunk.choices")
            seen.add(i)
        if i < 0:
            raise BadRequest(f"negative choice index {i}", param="generate_chunk.choices")
        if i >= max_n:
            raise BadRequest(f"choice index {i} is outside [0, {max_n})", param="generate_chunk.choices")
        cs = known.get(i)
        if cs is not None and cs.finished:
            raise BadRequest(f"choice {i} already finished; no chunk may follow its finish_reason",
                             param="generate_chunk.choices")
        if cs is None:
            n_known += 1
        ids = c.token_ids
        if ids and c.logprobs is None and cfg.max_model_len is None and min(ids) >= 0 and max(ids) < vocab:
            continue  # (a plain chunk: what _check_stream_choice checks, in line)
        _check_stream_choice(rt, c, cs.completion_tokens if cs is not None else 0, f"choice {i}")
    if n_known > max_n:
        raise BadRequest(f"{n_known} choices exceed the maximum n ({max_n})", param="generate_chunk.choices")


def _prompt_ids(body) -> list[int] | None:
    return body.prompt_token_ids if body.prompt_token_ids is not None else body.generate_chunk.prompt_token_ids


def _prompt_count(prompt: Any) -> int | None:
    """Number of prompts of an OpenAI completion ``prompt`` (None when it cannot be told)."""
    if prompt is None:
        return None
    if isinstance(prompt, str):
        return 1
    if isinstance(prompt, list):
        if not prompt:
            return None
        if all(isinstance(x, int) for x in prompt):
            return 1
        return len(prompt)
    return None


# -------------------------------------------------------------------------------- chat ---
def _new_chat_state(rt: ModelRuntime, body: DerenderChatStreamRequest) -> StreamState:
    req = body.chat_request
    if rt.has_parser and req is None:
        raise BadRequest("chat_request is required on the first chunk when a tool or reasoning parser is "
                         "configured", param="chat_request")
    req = req or _DEFAULT_CHAT_REQUEST
    pids = _prompt_ids(body)
    ctx = request_context(req, pids)
    mode = rt.stack.tool_mode(ctx)
    so = req.stream_options
    n = req.n if req.n and req.n > 0 else 1
    opts = StreamOpts(
        skip_special=effective_skip_special_tokens(rt, req.skip_special_tokens, mode),
        spaces=req.spaces_between_special_tokens, include_stop=req.include_stop_str_in_output,
        logprobs=bool(req.logprobs), top_logprobs=req.top_logprobs or 0,
        return_token_ids=bool(req.return_token_ids),
        include_usage=bool(so and so.include_usage), n=n, expected_choices=n, tool_mode=mode,
        stop=list(stop_strings(req.stop)), min_tokens=req.min_tokens or 0,
    )
    st = StreamState(settings=StreamSettings(kind="chat", request_id=body.generate_chunk.request_id or "",
                                             model=body.model, opts=opts))
    st.settings.seed = _seed(rt, st, body, ctx)
    return st


def _seed(rt: ModelRuntime, st: StreamState, body, ctx=None) -> StreamSeed:
    """Seed for new choices from this body's prompt (detokenizer window, parser initial state)."""
    pids = _prompt_ids(body)
    o = st.opts
    seed = StreamSeed(detok=IncrementalDetokenizer(rt.tokenizer, skip_special_tokens=o.skip_special,
                                                   spaces_between_special_tokens=o.spaces,
                                                   prompt_token_ids=pids).state())
    if st.kind == "chat":
        if ctx is None:
            req = body.chat_request or _DEFAULT_CHAT_REQUEST
            ctx = request_context(req, pids)
        seed.parser = rt.stack.initial_state(ctx, streaming=True) if rt.has_parser else None
    seed.prompt_tokens = body.prompt_tokens if body.prompt_tokens is not None else len(pids or [])
    return seed


def _reseed(rt: ModelRuntime, st: StreamState, body) -> None:
    """A later chunk opening choices with its own prompt: their seed (``StreamState.reseed``;
    the write-once settings are never changed)."""
    st.reseed = _seed(rt, st, body)


def _choice_state(rt: ModelRuntime, st: StreamState, index: int) -> ChoiceState:
    cs = st.choices.get(index)
    if cs is None:
        parser = None
        sd = st.seed
        if sd.parser is not None:
            parser = msgspec.msgpack.decode(msgspec.msgpack.encode(sd.parser))  # deep copy
            parser = rt.stack.load_state(parser)
        seed = sd.detok or DetokState()
        cs = ChoiceState(detok=msgspec.structs.replace(seed, ids=list(seed.ids), tokens=list(seed.tokens)),
                         parser=parser, prompt_tokens=sd.prompt_tokens)
        st.choices[index] = cs
    return cs


def _step_ids(rt: ModelRuntime, st: StreamState, cs: ChoiceState,
              c: GenerateTokensStreamChoice) -> tuple[list[int], int, list[int]]:
    """``(ids to detokenize, lead, trimmed)`` (``held_stop_step``, with the request's
    ``include_stop``; the held id: ``ChoiceState.held_stop_id``): ``trimmed`` the stop token
    left out on a finish."""
    seq, kept, lead, cs.held_stop_id = held_stop_step(c.token_ids, cs.held_stop_id, c.finish_reason, c.stop_reason,
                                                       rt.tokenizer.eos_token_ids, st.opts.include_stop)
    return kept, lead, seq[len(kept):] if c.finish_reason is not None else []


def _parser_ids(rt: ModelRuntime, st: StreamState, ids: list[int]) -> list[int]:
    """The ids fed to the parsers (skipped special tokens never reach them)."""
    if st.opts.skip_special:
        special = rt.tokenizer.special_ids
        if not special.isdisjoint(ids):
            return [t for t in ids if t not in special]
    return ids


def _stop_token_ids(rt: ModelRuntime, st: StreamState, trimmed: list[int]) -> list[int]:
    """The final stop token trimmed by ``_step_ids``, as parser ids, for parsers that read it
    (``ParserStack.wants_stop_token``); else ``[]``."""
    if rt.stack.wants_stop_token and trimmed:
        return _parser_ids(rt, st, trimmed)
    return []


def _detok(rt: ModelRuntime, st: StreamState, cs: ChoiceState, ids: list[int],
           final: bool, lead: int = 0) -> tuple[str, int, str | None]:
    """Detokenize a chunk's ids with the request's stop strings applied (module docstring):
    ``(text to release, ids used, matched stop string or None)``. ``ids used`` is ``len(ids)``
    unless a stop string matched (then up to and including the matching id). ``lead``: held ids."""
    opts = st.settings.opts
    stop = opts.stop
    if not stop:
        if not ids:
            return "", 0, None
        text, cs.detok = step_text(rt.tokenizer, cs.detok, ids, opts.skip_special, opts.spaces)
        return text, len(ids), None
    keep = max(len(s) for s in stop) - 1
    held = cs.held
    out: list[str] = []
    if ids:
        d = IncrementalDetokenizer(rt.tokenizer, skip_special_tokens=st.opts.skip_special,
                                   spaces_between_special_tokens=st.opts.spaces, state=cs.detok)
        base = cs.completion_tokens - lead
        min_tokens = st.opts.min_tokens
        include = st.opts.include_stop
        for j, t in enumerate(ids):
            new = d.add([t])
            if not new:
                continue
            buf = held + new  # ends with the last len(held) + len(new) chars of the output
            if base + j + 1 > min_tokens:
                hit = check_stop_strings(buf, len(new), stop, include)
                if hit is not None:
                    s, cut = hit
                    out.append(buf if cut == -1 else buf[:cut])
                    cs.held = ""
                    return "".join(out), j + 1, s
            if len(buf) > keep:
                out.append(buf[: len(buf) - keep])
                held = buf[len(buf) - keep:]
            else:
                held = buf
        cs.detok = d.state()
    if final:
        out.append(held)
        held = ""
    cs.held = held
    return "".join(out), len(ids), None


_NONE: list[int] = []  # (never mutated: the trimmed ids of a plain step)


def _kept(xs, used: int, matched: str | None):
    """A chunk's token ids / logprob entries as sent: up to the matching id after a stop string."""
    if xs is None:
        return None
    return list(xs[:used]) if matched is not None else list(xs)


def _end_choice(cs: ChoiceState, c: GenerateTokensStreamChoice) -> bool:
    """The choice's OpenAI stream ends with this chunk (engine finish or stop-string match):
    drop its decoding state. Returns whether the engine finished it (``finished``); a stop
    string match before that only marks it ``stopped``."""
    cs.detok = None
    cs.parser = None
    cs.lp_ctx = []
    cs.held = ""
    cs.held_stop_id = -1
    _clear_spills(cs)
    if c.finish_reason is None:
        cs.stopped = True
        return False
    cs.finished = True
    return True


def _count_after_stop(cs: ChoiceState, c: GenerateTokensStreamChoice) -> bool:
    """A chunk for a choice a stop string already ended: its tokens are only counted (usage);
    returns whether the engine finished the choice with it."""
    cs.completion_tokens += len(c.token_ids or [])
    if c.finish_reason is not None:
        cs.finished = True
        return True
    return False


def _usage(rt: ModelRuntime, st: StreamState, with_reasoning: bool) -> UsageInfo:
    comp = sum(c.completion_tokens for c in st.choices.values())
    if st.kind == "completion" and st.opts.n > 0:
        groups: dict[int, int] = {}
        for i, c in st.choices.items():
            groups.setdefault(i // st.opts.n, c.prompt_tokens)
        prompt = sum(groups.values())
    else:
        prompt = next(iter(st.choices.values())).prompt_tokens if st.choices else st.seed_prompt_tokens
    details = None
    if with_reasoning:
        details = CompletionTokensDetails(reasoning_tokens=sum(c.reasoning_tokens for c in st.choices.values()))
    return UsageInfo(prompt_tokens=prompt, completion_tokens=comp, total_tokens=prompt + comp,
                     completion_tokens_details=details)


def _want_usage(st: StreamState, force: bool, any_finished: bool) -> bool:
    if not (st.opts.include_usage or force) or st.usage_sent:
        return False
    if st.opts.expected_choices is None:
        return any_finished
    return st.done


# ------------------------------------------------------------------------ bounded state ---
def _snapshot(cs: ChoiceState) -> bytes:
    """A choice state as bytes, to run a step again from it (``_restore``)."""
    return _state_encoder.encode(cs)


def _restore(rt: ModelRuntime, snap: bytes) -> ChoiceState:
    return _typed(rt.stack).choice.decode(snap)


def _chat_choice(rt: ModelRuntime, st: StreamState, c: GenerateTokensStreamChoice,
                 out: list[ChatCompletionStreamResponse]) -> bool:
    """One choice of a chat chunk: its OpenAI chunks appended to ``out``; returns whether the
    engine finished the choice with it."""
    settings = st.settings  # (read once: ``StreamState.opts`` & co. are properties)
    opts = settings.opts
    rid = settings.request_id
    stack = rt.stack
    fmt = stack.id_format
    finished = False
    cs = st.choices.get(c.index)
    if cs is None:
        cs = _choice_state(rt, st, c.index)
    if cs.stopped:
        finished |= _count_after_stop(cs, c)
        return finished
    if not cs.role_sent:
        cs.role_sent = True
        out.append(ChatCompletionStreamResponse(id=rid, created=settings.created, model=settings.model, choices=[
            ChatCompletionStreamChoice(index=c.index, delta=DeltaMessage(role="assistant", content=""))]))
    tids = c.token_ids
    if cs.held_stop_id == -1 and c.finish_reason is None and tids and \
            (opts.include_stop or tids[-1] not in rt.tokenizer.eos_token_ids):
        ids, lead, trimmed = tids, 0, _NONE  # (held_stop_step's plain case, in line)
    else:
        ids, lead, trimmed = _step_ids(rt, st, cs, c)
    if opts.stop:  # stop strings apply to the answer (worker.core.answer)
        detok = IncrementalDetokenizer(rt.tokenizer, skip_special_tokens=opts.skip_special,
                                       spaces_between_special_tokens=opts.spaces, state=cs.detok)
        d, used, matched, cs.held = step_answer(
            stack if cs.parser is not None else None, cs.parser, detok, ids,
            rt.tokenizer.special_ids if opts.skip_special else None, opts.stop,
            opts.include_stop, opts.min_tokens, cs.completion_tokens - lead, cs.held,
            c.finish_reason is not None, _stop_token_ids(rt, st, trimmed))
        cs.detok = detok.state()
    else:
        if ids:  # (``_detok`` without stop strings, in line)
            text, cs.detok = step_text(rt.tokenizer, cs.detok, ids, opts.skip_special, opts.spaces)
        else:
            text = ""
        used, matched = len(ids), None
        pids = _parser_ids(rt, st, ids) + _stop_token_ids(rt, st, trimmed) if trimmed else \
            _parser_ids(rt, st, ids)[:]
        d = None
        if cs.parser is not None:
            d = stack.feed(cs.parser, text, pids) if (text or pids) else None
            if c.finish_reason is not None:
                f = stack.finish(cs.parser)
                d = f if d is None else d.extend(f)
        else:
            d = Delta(content=text)
    used -= lead  # (a stop string match is at or after the held id: ``used >= lead``)
    final = c.finish_reason is not None or matched is not None
    content = d.content if d is not None else ""
    reasoning = d.reasoning if d is not None else ""
    calls = d.tool_calls if d is not None else []
    cs.reasoning_tokens += d.reasoning_tokens if d is not None else 0
    cs.completion_tokens += len(c.token_ids or [])
    tcs = None
    if calls:
        tcs = []
        for tc in calls:
            while len(cs.tool_ids) <= tc.index:
                cs.tool_ids.append(tool_call_id(rid, c.index, len(cs.tool_ids), fmt))
            first = tc.name is not None
            tcs.append(DeltaToolCall(
                index=tc.index, id=cs.tool_ids[tc.index] if first else None,
                type="function" if first else None,
                function=DeltaFunctionCall(name=tc.name, arguments=tc.arguments)))
    lp = None
    entries = _kept(c.logprobs.content, used, matched) if c.logprobs is not None else None
    if opts.logprobs and entries:
        lp = ChatLogprobs(content=chat_logprobs(rt.tokenizer, entries, opts.top_logprobs, cs.lp_ctx,
                                                as_token_ids=rt.config.return_tokens_as_token_ids))
    if c.token_ids and opts.logprobs:  # the context is read only when logprobs are on
        cs.lp_ctx = next_context(cs.lp_ctx, c.token_ids)
    finish = stop_reason = None
    if final:
        finish_reason, stop_reason = ("stop", matched) if matched is not None else (c.finish_reason,
                                                                                   c.stop_reason)
        finish = final_finish_reason(finish_reason, bool(cs.tool_ids), opts.tool_mode)
        finished |= _end_choice(cs, c)
    kept = _kept(c.token_ids or [], used, matched) if opts.return_token_ids else None
    # with return_token_ids a chunk is sent for every chunk of ids, text or not (vLLM: the
    # ids must all reach the client, e.g. while text is held back)
    if content or reasoning or tcs or lp is not None or final or kept:
        out.append(ChatCompletionStreamResponse(id=rid, created=settings.created, model=settings.model, choices=[ChatCompletionStreamChoice(
            index=c.index,
            delta=DeltaMessage(content=content or None, reasoning=reasoning or None, tool_calls=tcs),
            logprobs=lp, finish_reason=finish, stop_reason=stop_reason, token_ids=kept)]))
    return finished


def derender_chat_chunk(rt: ModelRuntime, body: DerenderChatStreamRequest, state: StreamState | None,
                        force_include_usage: bool = True, created: int | None = None,
                        request_raw: bytes | None = None, pieces: PieceLog | None = None
                        ) -> tuple[list[ChatCompletionStreamResponse], StreamState]:
    """Derender one chat stream chunk (see module docstring). ``state``: None on the request's
    first chunk. ``created``: Unix seconds for every chunk of the request, read on its first chunk
    only (the state keeps it, as OpenAI streams repeat the first chunk's value; None = 0).
    ``request_raw``: the raw JSON bytes of the body's ``chat_request`` (None/``null``: absent).
    On the first chunk their ``request_digest`` is stored; on a later chunk ``body.chat_request``
    is not read: ``request_raw``, when present, must have the stored digest (else a 400).
    ``pieces``: the stream's append-only pieces (``PieceLog`` over ``state.pieces_len`` stored
    bytes; module docstring, "Bounded state"); None: nothing is spilled (the state holds an open
    call's body, as before). Raises ``PiecesNeeded`` when it has no reader and a spilled body
    must come back (nothing to keep: call again with a reader), ``PiecesLost`` when the reader
    returns fewer bytes than the state records.
    Returns the OpenAI chunks to send (possibly none) and the advanced state.
    Raises ``BadRequest`` before touching ``state``."""
    _validate_common(rt, body, state, "chat", request_raw)
    if state is None:
        state = _new_chat_state(rt, body)
        state.settings.created = created or 0
        state.settings.req_digest = request_digest(request_raw or b"")
    elif _prompt_ids(body) is not None and any(c.index not in state.choices for c in body.generate_chunk.choices):
        _reseed(rt, state, body)
    st = state
    rid = st.settings.request_id
    out: list[ChatCompletionStreamResponse] = []
    any_finished = False
    for c in body.generate_chunk.choices:
        if pieces is None:
            any_finished |= _chat_choice(rt, st, c, out)
            continue
        cs = st.choices.get(c.index)
        snap = _snapshot(cs) if cs is not None and (cs.spill or cs.spill_args or cs.spill_held) else None
        mark = len(out)
        try:
            any_finished |= _chat_choice(rt, st, c, out)
        except BodyNeeded:  # the open call closes: its spilled start comes back, the step is rerun
            del out[mark:]
            cs = st.choices[c.index] = _restore(rt, snap)
            _need_every_spill(st, pieces)
            _unspill(rt, cs, pieces)
            any_finished |= _chat_choice(rt, st, c, out)
        _spill(rt, st.choices[c.index], pieces)
    st.next_seq += 1
    if pieces is not None:
        st.pieces_len = len(pieces)
    # (no choice finished with this chunk: usage is not due, or went out with the chunk that
    # finished the last one, ``usage_sent``)
    if any_finished and _want_usage(st, force_include_usage, any_finished):
        st.usage_sent = st.done
        out.append(ChatCompletionStreamResponse(id=rid, created=st.created, model=st.model, choices=[],
                                                usage=_usage(rt, st, rt.stack.reasoning is not None)))
    return out, st


# -------------------------------------------------------------------------- completion ---
def _new_completion_state(rt: ModelRuntime, body: DerenderCompletionStreamRequest) -> StreamState:
    req = body.completion_request or _DEFAULT_COMPLETION_REQUEST
    so = req.stream_options
    n = req.n if req.n and req.n > 0 else 1
    prompts = _prompt_count(req.prompt) if body.completion_request is not None else None
    if prompts is not None and n * prompts > rt.config.max_n:
        # more choices than can ever arrive: the stream would never end
        raise BadRequest(f"n ({n}) x {prompts} prompts exceed the maximum n ({rt.config.max_n})", param="n")
    opts = StreamOpts(
        skip_special=req.skip_special_tokens, spaces=req.spaces_between_special_tokens,
        include_stop=req.include_stop_str_in_output, logprobs=req.logprobs is not None,
        top_logprobs=req.logprobs or 0, return_token_ids=bool(req.return_token_ids),
        include_usage=bool(so and so.include_usage), echo=bool(req.echo), n=n,
        expected_choices=n * prompts if prompts is not None else None,
        stop=list(stop_strings(req.stop)), min_tokens=req.min_tokens or 0,
    )
    st = StreamState(settings=StreamSettings(kind="completion", request_id=body.generate_chunk.request_id or "",
                                             model=body.model, opts=opts))
    st.settings.seed = _seed(rt, st, body)
    return st


def derender_completion_chunk(rt: ModelRuntime, body: DerenderCompletionStreamRequest, state: StreamState | None,
                              force_include_usage: bool = True, created: int | None = None,
                              request_raw: bytes | None = None
                              ) -> tuple[list[CompletionStreamResponse], StreamState]:
    """Derender one completion stream chunk (see ``derender_chat_chunk``, ``created`` and
    ``request_raw``, the raw ``completion_request``, included)."""
    _validate_common(rt, body, state, "completion", request_raw)
    new = state is None
    if new:
        state = _new_completion_state(rt, body)
        state.settings.created = created or 0
        state.settings.req_digest = request_digest(request_raw or b"")
    elif _prompt_ids(body) is not None and any(c.index not in state.choices for c in body.generate_chunk.choices):
        _reseed(rt, state, body)
    st = state
    rid = st.request_id
    tok = rt.tokenizer
    out: list[CompletionStreamResponse] = []
    any_finished = False
    pids_prompt = _prompt_ids(body)
    for c in body.generate_chunk.choices:
        fresh = c.index not in st.choices
        cs = _choice_state(rt, st, c.index)
        if cs.stopped:
            any_finished |= _count_after_stop(cs, c)
            continue
        prefix = ""
        if fresh and st.opts.echo and pids_prompt:
            prefix = tok.decode(pids_prompt, skip_special_tokens=st.opts.skip_special)
        ids, lead, _ = _step_ids(rt, st, cs, c)
        text, used, matched = _detok(rt, st, cs, ids, c.finish_reason is not None, lead)
        used -= lead
        text = prefix + text
        cs.completion_tokens += len(c.token_ids or [])
        lp = None
        entries = _kept(c.logprobs.content if c.logprobs is not None else None, used, matched)
        if st.opts.logprobs and entries:
            lp = completion_logprobs(tok, entries, st.opts.top_logprobs,
                                     text_offset_start=cs.text_offset + len(prefix), context_token_ids=cs.lp_ctx,
                                     as_token_ids=rt.config.return_tokens_as_token_ids)
        cs.text_offset += len(text)
        if c.token_ids and st.opts.logprobs:  # the context is read only when logprobs are on
            cs.lp_ctx = next_context(cs.lp_ctx, c.token_ids)
        final = c.finish_reason is not None or matched is not None
        finish = stop_reason = None
        if final:
            finish, stop_reason = ("stop", matched) if matched is not None else (c.finish_reason, c.stop_reason)
            any_finished |= _end_choice(cs, c)
        kept = _kept(c.token_ids or [], used, matched) if st.opts.return_token_ids else None
        if text or lp is not None or final or kept:
            out.append(CompletionStreamResponse(id=rid, created=st.created, model=st.model, choices=[CompletionStreamChoice(
                index=c.index, text=text, logprobs=lp, finish_reason=finish, stop_reason=stop_reason,
                token_ids=kept)]))
    st.next_seq += 1
    if _want_usage(st, force_include_usage, any_finished):
        st.usage_sent = st.done
        out.append(CompletionStreamResponse(id=rid, created=st.created, model=st.model, choices=[], usage=_usage(rt, st, False)))
    return out, st
