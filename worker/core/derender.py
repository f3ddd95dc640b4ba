"""Pure derender: a decoded ``DerenderChatRequest`` / ``DerenderCompletionRequest`` plus the served
model's runtime (tokenizer + parser stack) -> OpenAI ``ChatCompletionResponse`` /
``CompletionResponse``. No I/O.

What each response field comes from (coupled ``vllm serve`` semantics, vLLM 0.32):

* ``id``: ``generate_response.request_id`` (completions: the first response's); ``model``: the
  served name in the body; ``created``: the engine response's ``created`` when it has one, else
  the caller's ``created`` (the Kafka worker passes the input record's timestamp in seconds, so
  a redelivered record gets a byte-identical reply; batch passes nothing: 0, deterministic);
* text: the choice's token ids minus the final stop token (EOS or the int ``stop_reason``) unless
  ``include_stop_str_in_output``, detokenized incrementally, seeded from the prompt tail; the
  request's ``stop`` strings are applied here, as vLLM's detokenizer applies them (cut at the
  first match, ``finish_reason`` ``stop``, ``stop_reason`` the string, ids/logprobs after the
  matching token dropped, usage unchanged); in chat they apply to the answer, never to the
  reasoning (vLLM PR 14550, ``worker.core.answer``);
* chat ``reasoning``/``content``/``tool_calls``: the model's parser stack (worker.parsers.stack);
  tool call ids are deterministic (request_id, choice index, call index);
* ``finish_reason``/``stop_reason``/``kv_transfer_params`` passed through; ``stop`` becomes
  ``tool_calls`` when calls were made (auto/required tool_choice, not a named one);
* ``usage``: ``prompt_tokens`` from the body (default 0), ``completion_tokens`` = sum of the
  choices' ``token_ids`` lengths, ``completion_tokens_details.reasoning_tokens`` when a reasoning
  parser is configured;
* logprobs: token strings/bytes recomputed from ids (worker.core.logprobs).
"""
from __future__ import annotations

from functools import cached_property, lru_cache
from operator import attrgetter
from typing import Annotated, Any

import msgspec

from schemas import (
    ChatCompletionChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprobs,
    ChatMessage,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    CompletionTokensDetails,
    DerenderChatRequest,
    DerenderCompletionRequest,
    FunctionCall,
    GenerateTokensChoice,
    GenerateTokensResponse,
    LogprobsIn,
    TokenLogprobIn,
    ToolCall,
    TopLogprobIn,
    UsageInfo,
)
from worker.config import ServedModelConfig, tokenizer_mode
from worker.core.answer import step_answer
from worker.core.detokenize import (
    IncrementalDetokenizer,
    detokenize_with_stop,
    stop_strings,
    stop_token_trimmed,
)
from worker.core.errors import BadRequest
from worker.core.logprob_completion import completion_logprobs_json
from worker.core.logprobs import (
    SMALL,
    candidates,
    chat_logprobs,
    chat_logprobs_json,
    completion_logprobs,
)
from worker.core.tokenizers import Tokenizer, load_tokenizer
from worker.parsers import make_reasoning_parser, make_tool_parser
from worker.parsers.base import Delta, RequestContext
from worker.parsers.idscan import has_special
from worker.parsers.stack import ParserStack, tool_call_id

_DEFAULT_CHAT_REQUEST = ChatCompletionRequest()
_DEFAULT_COMPLETION_REQUEST = CompletionRequest()


class ModelRuntime:
    """Everything needed to derender for one served model: its config, tokenizer and parser
    stack, built once and reused. Raises ``ValueError`` when the tokenizer or a parser name
    cannot be resolved."""

    def __init__(self, config: ServedModelConfig, tokenizer: Tokenizer | None = None):
        self.config = config
        self.tokenizer = tokenizer or load_tokenizer(config.tokenizer, tokenizer_mode(config.tokenizer_mode))
        self.stack = ParserStack(
            make_reasoning_parser(config.reasoning_parser, self.tokenizer),
            make_tool_parser(config.tool_parser, self.tokenizer),
            config.enable_auto_tool_choice,
            tool_call_streaming=config.tool_call_streaming,
        )

    @cached_property
    def has_parser(self) -> bool:
        """True when a reasoning or tool parser is configured (chat_request then required)."""
        return self.stack.reasoning is not None or self.stack.tool is not None


# ------------------------------------------------------------------------------ validation ---
def _check_choice(rt: ModelRuntime, c: GenerateTokensChoice, where: str, allow_empty: bool = False,
                  ids_in_vocab: bool = False) -> None:
    cfg = rt.config
    ids = c.token_ids
    if ids is None or (not ids and not allow_empty):
        raise BadRequest(f"{where} has empty or null token_ids", param=f"{where}.token_ids")
    if cfg.max_model_len is not None and len(ids) > cfg.max_model_len:
        raise BadRequest(f"token_ids length ({len(ids)}) in {where} exceeds max_model_len ({cfg.max_model_len}).",
                         param=f"{where}.token_ids")
    if not ids_in_vocab or c.logprobs is not None:  # (ids already bounded: only logprobs to check)
        check_ids_and_logprobs(rt, ids, c.logprobs, where, in_vocab=ids_in_vocab)


@lru_cache(maxsize=8)
def bounded_generate_response(vocab: int) -> tuple[type, Any]:
    """``(GenerateTokensResponse subtype, id type)``: the engine response whose output and prompt
    ids, and whose logprob entries' sampled and candidate ids (there required, not null), are
    ``Annotated[int, Meta(ge=0, lt=vocab)]``, checked inside the body's one msgspec decode (issue
    13 item 1; ``service._bounded_body_decoders``, ``messages.service``). Built once per size."""
    tid = Annotated[int, msgspec.Meta(ge=0, lt=vocab)]
    ids = list[tid] | None
    top = msgspec.defstruct("BoundedTopLogprobIn", [("token_id", tid)], bases=(TopLogprobIn,), kw_only=True,
                            gc=False)
    entry = msgspec.defstruct("BoundedTokenLogprobIn",
                              [("token_id", tid), ("top_logprobs", list[top], msgspec.field(default_factory=list))],
                              bases=(TokenLogprobIn,), kw_only=True, gc=False)
    lps = msgspec.defstruct("BoundedLogprobsIn", [("content", list[entry] | None, None)], bases=(LogprobsIn,),
                            kw_only=True)
    choice = msgspec.defstruct("BoundedChoice", [("token_ids", ids, None), ("logprobs", lps | None, None)],
                               bases=(GenerateTokensChoice,), kw_only=True)
    resp = msgspec.defstruct("BoundedResponse", [("choices", list[choice], msgspec.field(default_factory=list)),
                                                 ("prompt_token_ids", ids, None)],
                             bases=(GenerateTokensResponse,), kw_only=True)
    return resp, tid


def _check_length(lp: list, ids: list[int], where: str) -> None:
    """One engine logprobs entry per output id (vLLM's engine output shape). Raises
    ``BadRequest`` naming ``where``."""
    if len(lp) != len(ids):
        raise BadRequest(f"logprobs.content length ({len(lp)}) in {where} differs from token_ids "
                         f"length ({len(ids)})", param=f"{where}.logprobs")


def check_ids_and_logprobs(rt: ModelRuntime, ids: list[int], logprobs, where: str, in_vocab: bool = False) -> None:
    """Checks shared by the non-streaming and streaming paths, for one choice's (or chunk's)
    ``ids`` and engine ``logprobs``: every id inside the vocabulary; logprobs, when given, one
    entry per id, at most ``max_logprobs`` candidates each (-1: no limit), every candidate id in the vocabulary.
    ``in_vocab``: the body's decode already bounded ``ids`` and every logprob id (sampled and
    candidate, none null) to the vocabulary (``service._bounded_body_decoders``): only the
    lengths and candidate counts are left to check. Raises ``BadRequest`` naming ``where``."""
    cfg = rt.config
    vocab = rt.tokenizer.vocab_size
    if in_vocab:
        lp = logprobs.content if logprobs is not None else None
        if lp is None:
            return
        _check_length(lp, ids, where)
        if lp and 0 <= cfg.max_logprobs < max(map(len, map(_get_tops, lp))):
            _first_bad_logprob(rt, lp, where)
        return
    if ids and (min(ids) < 0 or max(ids) >= vocab):  # C-level bounds; the loop only names the culprit
        t = next(t for t in ids if t < 0 or t >= vocab)
        raise BadRequest(f"token id {t} in {where} is outside the vocabulary [0, {vocab})",
                         param=f"{where}.token_ids")
    lp = logprobs.content if logprobs is not None else None
    if lp is None:
        return
    _check_length(lp, ids, where)
    if len(lp) <= SMALL:  # a few entries (a stream chunk): checked one by one
        _first_bad_logprob(rt, lp, where)
        return
    c = candidates(lp)  # flattened once, C-level
    max_lp = cfg.max_logprobs
    try:  # a None id makes min/max raise TypeError: then the per-entry pass names the culprit
        bad = (0 <= max_lp < max(c.counts)) or min(c.tids) < 0 or max(c.tids) >= vocab \
            or (bool(c.ids) and (min(c.ids) < 0 or max(c.ids) >= vocab))
    except TypeError:
        bad = True
    if bad:
        _first_bad_logprob(rt, lp, where)


_get_tops = attrgetter("top_logprobs")


def _first_bad_logprob(rt: ModelRuntime, lp: list, where: str) -> None:
    """Raise ``BadRequest`` for the first entry of ``lp`` that fails a check of
    ``check_ids_and_logprobs``, in entry order (candidate count, sampled id, candidate ids);
    return when none does."""
    cfg = rt.config
    vocab = rt.tokenizer.vocab_size
    max_lp = cfg.max_logprobs
    for e in lp:
        tops = e.top_logprobs
        if 0 <= max_lp < len(tops):
            raise BadRequest(f"top_logprobs count ({len(tops)}) in {where} exceeds max_logprobs "
                             f"({cfg.max_logprobs}).", param=f"{where}.logprobs")
        t = e.token_id
        if t is None or t < 0 or t >= vocab:
            _bad_logprob_id(t, where)
        if tops:
            cids = [c.token_id for c in tops]
            if None in cids or min(cids) < 0 or max(cids) >= vocab:
                _bad_logprob_id(next(t for t in cids if t is None or t < 0 or t >= vocab), where)


def _bad_logprob_id(t: int | None, where: str) -> None:
    raise BadRequest(f"logprob token_id {t} in {where} is missing or outside the vocabulary",
                     param=f"{where}.logprobs")


#: most ``stop`` strings, and most characters over all of them, a request may carry: every
#: streamed chunk is checked against each of them and the stream state keeps them (OpenAI's API
#: takes at most 4; vLLM sets no limit)
MAX_STOP_STRINGS = 1024
MAX_STOP_CHARS = 65536


def check_prompt_ids(rt: ModelRuntime, ids: list[int] | None, where: str) -> None:
    """Every prompt token id inside the tokenizer's vocabulary ``[0, vocab_size)``, as vLLM's
    input processor requires of a prompt ("Token id ... is out of vocabulary"). ``ids`` None
    passes. Raises ``BadRequest`` naming ``where`` (the field's path)."""
    if not ids:
        return
    vocab = rt.tokenizer.vocab_size
    lo, hi = min(ids), max(ids)
    if lo < 0 or hi >= vocab:
        bad = lo if lo < 0 else hi
        raise BadRequest(f"prompt token id {bad} in {where} is outside the vocabulary [0, {vocab})", param=where)


#: the largest integer the core keeps from a body (the stream state is msgpack: 64-bit ints)
INT64_MAX = 2**63 - 1


def check_request_numbers(rt: ModelRuntime, *, n: int | None, top_logprobs: int | None, min_tokens: int | None,
                          prompt_tokens: list[int | None], logprobs_param: str,
                          stop: str | list[str] | None = None) -> None:
    """Bound the numbers of an OpenAI request (and the body's ``prompt_tokens``) before use, as
    vLLM's request validation does: ``n`` in [1, ``max_n``] (``n must be at least 1``; more
    choices than ``max_n`` can never arrive, so a stream would never end); ``top_logprobs``
    (chat) / ``logprobs`` (completion) in [0, ``max_logprobs``] (vLLM: ``Requested sample
    logprobs of N, which is greater than max allowed``; ``max_logprobs`` -1: no limit but
    ``INT64_MAX``); ``min_tokens`` in [0, ``max_model_len``] (vLLM: ``min_tokens`` <=
    ``max_tokens`` <= ``max_model_len``); ``prompt_tokens`` in [0, ``max_model_len``]. Without
    ``max_model_len`` the bound is ``INT64_MAX``. ``stop``: at most ``MAX_STOP_STRINGS`` strings
    of ``MAX_STOP_CHARS`` chars in all. ``logprobs_param``: the field name to report. Raises
    ``BadRequest``."""
    cfg = rt.config
    max_len = cfg.max_model_len if cfg.max_model_len is not None else INT64_MAX
    max_lp = cfg.max_logprobs if cfg.max_logprobs >= 0 else INT64_MAX
    if n is not None and not 1 <= n <= cfg.max_n:
        raise BadRequest(f"n ({n}) must be between 1 and the maximum n ({cfg.max_n})", param="n")
    if top_logprobs is not None and top_logprobs < 0:
        raise BadRequest(f"{logprobs_param} ({top_logprobs}) must not be negative", param=logprobs_param)
    if top_logprobs is not None and top_logprobs > max_lp:
        raise BadRequest(f"{logprobs_param} ({top_logprobs}) exceeds max_logprobs ({cfg.max_logprobs})",
                         param=logprobs_param)
    if min_tokens is not None and not 0 <= min_tokens <= max_len:
        raise BadRequest(f"min_tokens ({min_tokens}) must be between 0 and {max_len}", param="min_tokens")
    for v in prompt_tokens:
        if v is not None and not 0 <= v <= max_len:
            raise BadRequest(f"prompt_tokens ({v}) must be between 0 and {max_len}", param="prompt_tokens")
    if not stop:
        return
    stops = [stop] if isinstance(stop, str) else stop
    if len(stops) > MAX_STOP_STRINGS or sum(len(s) for s in stops if isinstance(s, str)) > MAX_STOP_CHARS:
        raise BadRequest(f"stop: at most {MAX_STOP_STRINGS} strings of {MAX_STOP_CHARS} characters in all",
                         param="stop")


def check_choice_index(rt: ModelRuntime, index: int, seen: set[int], where: str) -> None:
    """A choice index in [0, ``max_n``) (vLLM's indexes are 0..n-1) and not repeated within one
    response (``seen``: the indexes so far, updated). Raises ``BadRequest``."""
    if not 0 <= index < rt.config.max_n:
        raise BadRequest(f"choice index {index} in {where} is outside [0, {rt.config.max_n})", param=where)
    if index in seen:
        raise BadRequest(f"choice index {index} appears twice in {where}", param=where)
    seen.add(index)


def validate_chat(rt: ModelRuntime, body: DerenderChatRequest, ids_in_vocab: bool = False) -> None:
    """Reject a chat body before any decode (vLLM render-server semantics): ``stream: true``,
    too many choices, empty/oversized/out-of-vocab ``token_ids``, oversized logprobs, a missing
    ``chat_request`` when a parser is configured, ``prompt_tokens`` != len(``prompt_token_ids``).
    ``ids_in_vocab``: the body's decode already bounded every output and prompt id to the
    vocabulary (``service._bounded_body_decoders``), so those bounds are not scanned again.
    Raises ``BadRequest``."""
    if body.stream:
        raise BadRequest("stream=true is not valid on a non-streaming derender body (use generate_chunk)",
                         param="stream")
    choices = body.generate_response.choices
    if not choices:
        raise BadRequest("generate_response.choices must not be empty", param="generate_response.choices")
    if len(choices) > rt.config.max_n:
        raise BadRequest(f"{len(choices)} choices exceed the maximum n ({rt.config.max_n})",
                         param="generate_response.choices")
    if rt.has_parser and body.chat_request is None:
        raise BadRequest("chat_request is required when a tool or reasoning parser is configured "
                         "(plain detokenization would leak parser markup into content)", param="chat_request")
    if body.prompt_token_ids is not None and body.prompt_tokens is not None \
            and body.prompt_tokens != len(body.prompt_token_ids):
        raise BadRequest(f"prompt_tokens ({body.prompt_tokens}) != len(prompt_token_ids) "
                         f"({len(body.prompt_token_ids)})", param="prompt_tokens")
    req = body.chat_request
    check_request_numbers(rt, n=req.n if req else None, top_logprobs=req.top_logprobs if req else None,
                          min_tokens=req.min_tokens if req else None, prompt_tokens=[body.prompt_tokens],
                          logprobs_param="top_logprobs", stop=req.stop if req else None)
    if not ids_in_vocab:
        check_prompt_ids(rt, body.prompt_token_ids, "prompt_token_ids")
        check_prompt_ids(rt, body.generate_response.prompt_token_ids, "generate_response.prompt_token_ids")
    seen: set[int] = set()
    max_len = rt.config.max_model_len
    for i, c in enumerate(choices):
        check_choice_index(rt, c.index, seen, "generate_response.choices")
        ids = c.token_ids
        if ids_in_vocab and ids and c.logprobs is None and (max_len is None or len(ids) <= max_len):
            continue  # (nothing ``_check_choice`` checks can fail: its message is not built)
        _check_choice(rt, c, f"choice {c.index if c.index is not None else i}", ids_in_vocab=ids_in_vocab)


def validate_completion(rt: ModelRuntime, body: DerenderCompletionRequest, ids_in_vocab: bool = False) -> None:
    """Reject a completion body before any decode (see ``validate_chat``, ``ids_in_vocab``
    included), plus: empty ``generate_responses``, ``prompt_tokens``/``prompt_token_ids`` list
    length mismatch."""
    if body.stream:
        raise BadRequest("stream=true is not valid on a non-streaming derender body", param="stream")
    grs = body.generate_responses
    if not grs:
        raise BadRequest("generate_responses must not be empty", param="generate_responses")
    for name in ("prompt_tokens", "prompt_token_ids"):
        v = getattr(body, name)
        if v is not None and len(v) != len(grs):
            raise BadRequest(f"{name} length ({len(v)}) must equal generate_responses length ({len(grs)})",
                             param=name)
    if body.prompt_tokens is not None and body.prompt_token_ids is not None:
        for i, (n, p) in enumerate(zip(body.prompt_tokens, body.prompt_token_ids)):
            if n != len(p):
                raise BadRequest(f"prompt_tokens[{i}] ({n}) != len(prompt_token_ids[{i}]) ({len(p)})",
                                 param="prompt_tokens")
    for i, p in enumerate(() if ids_in_vocab else body.prompt_token_ids or ()):
        check_prompt_ids(rt, p, f"prompt_token_ids[{i}]")
    for i, g in enumerate(grs):
        if not ids_in_vocab:
            check_prompt_ids(rt, g.prompt_token_ids, f"generate_responses[{i}].prompt_token_ids")
        seen: set[int] = set()
        for c in g.choices:
            check_choice_index(rt, c.index, seen, f"generate_responses[{i}].choices")
    req = body.completion_request
    check_request_numbers(rt, n=req.n if req else None, top_logprobs=req.logprobs if req else None,
                          min_tokens=req.min_tokens if req else None, prompt_tokens=list(body.prompt_tokens or []),
                          logprobs_param="logprobs", stop=req.stop if req else None)
    total = sum(len(g.choices) for g in grs)
    if total > rt.config.max_n:
        raise BadRequest(f"{total} choices exceed the maximum n ({rt.config.max_n})", param="generate_responses")
    max_len = rt.config.max_model_len
    for pi, g in enumerate(grs):
        if not g.choices:
            raise BadRequest(f"generate_responses[{pi}].choices must not be empty", param="generate_responses")
        for c in g.choices:
            ids = c.token_ids
            if ids_in_vocab and ids is not None and c.logprobs is None and (max_len is None or len(ids) <= max_len):
                continue  # (nothing ``_check_choice`` checks can fail: its message is not built)
            # an empty completion is valid OpenAI output (text ""); chat keeps vLLM's rejection
            _check_choice(rt, c, f"generate_responses[{pi}] choice {c.index}", allow_empty=True,
                          ids_in_vocab=ids_in_vocab)


# -------------------------------------------------------------------------------- assembly ---
def request_context(req: ChatCompletionRequest, prompt_ids: list[int] | None) -> RequestContext:
    """The parser-facing view of an OpenAI chat request."""
    return RequestContext(
        tools=req.tools, tool_choice=req.tool_choice,
        parallel_tool_calls=req.parallel_tool_calls is not False,
        include_reasoning=req.include_reasoning is not False,
        chat_template_kwargs=req.chat_template_kwargs, prompt_token_ids=prompt_ids,
    )


def effective_skip_special_tokens(rt: ModelRuntime, requested: bool, tool_mode: str) -> bool:
    """skip_special_tokens as the engine applied it: parsers that need special tokens turn it
    off (vLLM's ``adjust_request``), for tool parsers only when tools are in play."""
    st = rt.stack
    if st.reasoning is not None and st.reasoning.needs_special_tokens:
        return False
    if st.tool is not None and st.tool.needs_special_tokens and tool_mode != "off":
        return False
    return requested


class _Text:
    """A choice's detokenized output: ``text``, ``ids`` (for the parsers), ``used`` (engine ids
    kept: all of them unless a stop string cut the output), ``stop`` (that stop string)."""

    __slots__ = ("text", "ids", "used", "stop", "stop_token")

    def __init__(self, text: str, ids: list[int], used: int, stop: str | None, stop_token: int | None = None):
        self.text, self.ids, self.used, self.stop = text, ids, used, stop
        self.stop_token = stop_token  # the final stop token vLLM left out of the text, if any

    def parser_ids(self, stack: ParserStack) -> list[int]:
        """The ids fed to the parsers: ``ids``, plus the trimmed stop token for parsers that
        want it (``ParserStack.wants_stop_token``)."""
        if self.stop_token is not None and stack.wants_stop_token:
            return self.ids + [self.stop_token]
        return self.ids

    def __iter__(self):  # ``text, ids = _text_of(...)``
        return iter((self.text, self.ids))

    def finish(self, c: GenerateTokensChoice) -> tuple[str | None, int | str | None]:
        """(finish_reason, stop_reason): a matched stop string finishes with ``stop``."""
        if self.stop is not None:
            return "stop", self.stop
        return c.finish_reason, c.stop_reason

    def token_ids(self, c: GenerateTokensChoice) -> list[int]:
        return list(c.token_ids[: self.used]) if self.stop is not None else list(c.token_ids)

    def logprob_entries(self, c: GenerateTokensChoice):
        lp = c.logprobs.content
        return lp[: self.used] if self.stop is not None else lp


def _text_of(rt: ModelRuntime, c: GenerateTokensChoice, prompt_ids, skip_special: bool,
             spaces: bool, include_stop: bool, stop: str | list[str] | None = None,
             min_tokens: int = 0) -> _Text:
    """Detokenize a choice as vLLM's output processor does: final stop token dropped, then the
    request's stop strings applied (vLLM checks them in its detokenizer, not in the engine, so
    an engine behind a derender never stopped on them: text after the first match is cut,
    finish_reason becomes ``stop`` with the string as ``stop_reason``, and the ids/logprobs
    after the matching token are dropped; usage still counts every engine token)."""
    ids = stop_token_trimmed(c.token_ids, c.finish_reason, c.stop_reason, rt.tokenizer.eos_token_ids,
                             include_stop)
    text, used, matched = detokenize_with_stop(
        rt.tokenizer, ids, stop_strings(stop), include_stop_str_in_output=include_stop,
        min_tokens=min_tokens or 0, skip_special_tokens=skip_special,
        spaces_between_special_tokens=spaces, prompt_token_ids=prompt_ids)
    stop_token = c.token_ids[-1] if len(ids) < len(c.token_ids) else None
    if matched is not None:
        ids = ids[:used]
        stop_token = None
    if skip_special:  # skipped special tokens never reach the parsers (nor reasoning_tokens)
        special = rt.tokenizer.special_ids
        if has_special(rt.tokenizer, ids):
            ids = [t for t in ids if t not in special]
        stop_token = None if stop_token in special else stop_token
    return _Text(text, ids, used, matched, stop_token)


def _parse_choice(rt: ModelRuntime, ctx: RequestContext, c: GenerateTokensChoice, prompt_ids,
                  skip: bool, req: ChatCompletionRequest, stops: tuple[str, ...],
                  mode: str | None = None) -> tuple[Delta, _Text]:
    """A chat choice through the parser stack: ``(delta, text)``. The request's stop strings
    apply to the answer, not to the reasoning (``worker.core.answer``): when the answer holds
    one, the ids are stepped one by one as the streaming path steps them; otherwise the whole
    text is parsed in one step. ``mode``: ``stack.tool_mode(ctx)`` when the caller has it."""
    stack = rt.stack
    out = _text_of(rt, c, prompt_ids, skip, req.spaces_between_special_tokens, req.include_stop_str_in_output)
    pids = out.parser_ids(stack)
    st = stack.initial_state(ctx, mode=mode)
    if not stops:
        d = stack.feed(st, out.text, pids)
        return d.extend(stack.finish(st)), out
    # ``answer_has_stop``'s test on the same state, kept when no stop string is in the answer:
    # the halves of ``feed`` then ``finish`` (reasoning / answer halves touch disjoint parts of
    # the state, so finishing the reasoning before feeding the answer gives the same deltas)
    if stack.reasoning is None:
        r, fr = Delta(content=out.text), Delta()
    else:
        r = stack.feed_reasoning(st, out.text, pids)
        fr = stack.finish_reasoning(st)
    if not any(s in r.content + fr.content for s in stops):
        d = stack.feed_answer(st, r.content, pids)
        d.reasoning = r.reasoning
        d.reasoning_tokens = r.reasoning_tokens
        f = stack.finish_answer(st, fr.content)
        f.reasoning = fr.reasoning
        return d.extend(f), out
    ids = stop_token_trimmed(c.token_ids, c.finish_reason, c.stop_reason, rt.tokenizer.eos_token_ids,
                             req.include_stop_str_in_output)
    detok = IncrementalDetokenizer(rt.tokenizer, skip_special_tokens=skip,
                                   spaces_between_special_tokens=req.spaces_between_special_tokens,
                                   prompt_token_ids=prompt_ids)
    extra = [out.stop_token] if out.stop_token is not None and stack.wants_stop_token else []
    d, used, matched, _ = step_answer(stack, stack.initial_state(ctx, mode=mode), detok, ids,
                                      rt.tokenizer.special_ids if skip else None, stops,
                                      req.include_stop_str_in_output, req.min_tokens or 0, 0, "", True,
                                      extra)
    return d, _Text("", [], used, matched)


def merge_tool_calls(request_id: str, choice_index: int, d: Delta, fmt: str) -> list[ToolCall]:
    """Join tool-call fragments by index into complete ``ToolCall``s with deterministic ids."""
    tcs = d.tool_calls
    if not tcs:
        return []
    names: dict[int, str] = {}
    args: dict[int, list[str]] = {}
    for tc in tcs:
        if tc.name is not None and tc.index not in names:
            names[tc.index] = tc.name
        args.setdefault(tc.index, []).append(tc.arguments)
    return [ToolCall(id=tool_call_id(request_id, choice_index, i, fmt),
                     function=FunctionCall(name=names.get(i, ""), arguments="".join(args[i])))
            for i in sorted(args)]


def final_finish_reason(finish_reason: str | None, has_calls: bool, tool_mode: str) -> str | None:
    """``stop`` -> ``tool_calls`` when calls were returned for auto/required tool_choice."""
    if has_calls and tool_mode in ("auto", "required") and finish_reason in ("stop", None):
        return "tool_calls"
    return finish_reason


def _created(engine: int | None, fallback: int | None) -> int:
    """Response ``created``: the engine's value when the body has one, else ``fallback``, else 0."""
    if engine is not None:
        return engine
    return fallback or 0


def derender_chat(rt: ModelRuntime, body: DerenderChatRequest, created: int | None = None,
                  json_logprobs: bool = False) -> ChatCompletionResponse:
    """Derender a validated chat body (call ``validate_chat`` first). ``created``: Unix seconds
    used when the engine response has no ``created`` (None = 0). ``json_logprobs``: each
    choice's ``logprobs.content`` is its encoded JSON array (``msgspec.Raw``,
    ``chat_logprobs_json``: same bytes once encoded, for callers that only encode the response)
    instead of Structs. Returns the response."""
    gr = body.generate_response
    req = body.chat_request or _DEFAULT_CHAT_REQUEST
    prompt_ids = body.prompt_token_ids if body.prompt_token_ids is not None else gr.prompt_token_ids
    request_id = gr.request_id or ""
    ctx = request_context(req, prompt_ids)
    stack = rt.stack
    mode = stack.tool_mode(ctx)
    skip = effective_skip_special_tokens(rt, req.skip_special_tokens, mode)
    want_lp = bool(req.logprobs)
    top_k = req.top_logprobs or 0
    lp_content = chat_logprobs_json if json_logprobs else chat_logprobs
    choices = []
    completion_tokens = reasoning_tokens = 0
    stops = stop_strings(req.stop)
    for c in gr.choices:
        d, out = _parse_choice(rt, ctx, c, prompt_ids, skip, req, stops, mode)
        finish_reason, stop_reason = out.finish(c)
        calls = merge_tool_calls(request_id, c.index, d, stack.id_format)
        content = d.content or None
        if mode in ("required", "named") and content is None:
            content = ""
        msg = ChatMessage(content=content, reasoning=d.reasoning or None, tool_calls=calls or None)
        logprobs = None
        if want_lp and c.logprobs is not None and c.logprobs.content is not None:
            logprobs = ChatLogprobs(content=lp_content(rt.tokenizer, out.logprob_entries(c), top_k,
                                                       as_token_ids=rt.config.return_tokens_as_token_ids))
        choices.append(ChatCompletionChoice(
            index=c.index, message=msg, logprobs=logprobs,
            finish_reason=final_finish_reason(finish_reason, bool(calls), mode),
            stop_reason=stop_reason,
            token_ids=out.token_ids(c) if req.return_token_ids else None,
        ))
        completion_tokens += len(c.token_ids)
        reasoning_tokens += d.reasoning_tokens
    prompt_tokens = body.prompt_tokens or 0
    usage = UsageInfo(
        prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        completion_tokens_details=(CompletionTokensDetails(reasoning_tokens=reasoning_tokens)
                                   if stack.reasoning is not None else None),
    )
    return ChatCompletionResponse(
        id=request_id, created=_created(gr.created, created), model=body.model, choices=choices, usage=usage,
        prompt_token_ids=prompt_ids if req.return_token_ids else None,
        kv_transfer_params=gr.kv_transfer_params,
    )


def derender_completion(rt: ModelRuntime, body: DerenderCompletionRequest,
                        created: int | None = None, json_logprobs: bool = False) -> CompletionResponse:
    """Derender a validated completion body: one choice per engine choice, flat ``index``
    across prompts (prompt p's choices follow those of prompts < p). ``created``: as in
    ``derender_chat`` (the first engine response's value wins). ``json_logprobs``: each
    choice's ``logprobs`` is its encoded JSON object (``msgspec.Raw``,
    ``completion_logprobs_json``: same bytes once encoded) instead of a Struct."""
    req = body.completion_request or _DEFAULT_COMPLETION_REQUEST
    want_lp = req.logprobs is not None
    lp_block = completion_logprobs_json if json_logprobs else completion_logprobs
    choices = []
    completion_tokens = 0
    offset = 0
    tok = rt.tokenizer
    for pi, gr in enumerate(body.generate_responses):
        prompt_ids = body.prompt_token_ids[pi] if body.prompt_token_ids is not None else gr.prompt_token_ids
        for c in gr.choices:
            out = _text_of(rt, c, prompt_ids, req.skip_special_tokens, req.spaces_between_special_tokens,
                           req.include_stop_str_in_output, req.stop, req.min_tokens)
            text = out.text
            finish_reason, stop_reason = out.finish(c)
            prefix = ""
            if req.echo and prompt_ids:
                prefix = tok.decode(prompt_ids, skip_special_tokens=req.skip_special_tokens)
            logprobs = None
            if want_lp and c.logprobs is not None and c.logprobs.content is not None:
                logprobs = lp_block(tok, out.logprob_entries(c), req.logprobs or 0,
                                               text_offset_start=len(prefix),
                                               as_token_ids=rt.config.return_tokens_as_token_ids)
            choices.append(CompletionChoice(
                index=offset + c.index, text=prefix + text, logprobs=logprobs,
                finish_reason=finish_reason, stop_reason=stop_reason,
                token_ids=out.token_ids(c) if req.return_token_ids else None,
                prompt_token_ids=prompt_ids if req.return_token_ids else None,
            ))
            completion_tokens += len(c.token_ids)
        offset += len(gr.choices)
    prompt_tokens = sum(body.prompt_tokens or [])
    first = body.generate_responses[0]
    return CompletionResponse(
        id=first.request_id or "", created=_created(first.created, created), model=body.model, choices=choices,
        usage=UsageInfo(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                        total_tokens=prompt_tokens + completion_tokens),
        kv_transfer_params=first.kv_transfer_params,
    )
