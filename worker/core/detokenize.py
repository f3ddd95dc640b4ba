"""Incremental detokenization with the output of a coupled vLLM 0.32 server.

Two algorithms, chosen by the tokenizer's backend exactly as vLLM chooses them:

* fast tokenizers (``tokenizer.json``): vLLM's ``FastIncrementalDetokenizer``, i.e. tokenizers'
  ``DecodeStream`` primed with the prompt ids. Re-implemented here over a bounded window so the
  state can be checkpointed: ``ids`` = the tokens of the last emitted chunk (``prefix_index`` of
  them, whose text is ``prefix``) followed by tokens not emitted yet. A step appends the id,
  decodes the window and emits the part past ``prefix`` once it is longer and does not end in
  U+FFFD; the emitted tokens then become the new prefix. Priming with the prompt only matters for
  the first emitted chunk, so a short prompt tail (with at least a couple of non-special tokens,
  so SentencePiece's leading-space strip lands inside the prompt) gives the same text as the full
  prompt.
* mistral-common and transformers slow tokenizers: vLLM's ``SlowIncrementalDetokenizer``
  (``detokenize_incrementally`` with ``prefix_offset``/``read_offset`` over token strings, seeded
  with ``convert_prompt_ids_to_tokens`` of the last 7 prompt ids).

Without prompt ids the stream starts empty: the first SentencePiece token loses its leading
space, as vLLM's render server does.
"""
from __future__ import annotations

import msgspec

from .tokenizers import Tokenizer

__all__ = ["DetokState", "IncrementalDetokenizer", "step_text", "detokenize_output", "stop_token_trimmed",
           "stop_strings", "check_stop_strings", "detokenize_with_stop",
           "INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET"]

INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET = 5
_FFFD = "\ufffd"
_PROMPT_TAIL_MIN = 6
_PROMPT_TAIL_MAX = 64
_PROMPT_TAIL_NONSPECIAL = 2


class DetokState(msgspec.Struct, kw_only=True):
    """Checkpoint of an :class:`IncrementalDetokenizer` (bounded: a trailing window only).

    Fast path: ``ids`` (window token ids), ``prefix`` (text of the first ``prefix_index`` window
    ids), ``last_special`` (previous id was an added token; used only when
    ``spaces_between_special_tokens`` is off). Slow path: ``tokens`` (token strings from vLLM's
    ``prefix_offset`` on), ``prefix_offset``/``read_offset`` into that window."""

    ids: list[int] = msgspec.field(default_factory=list)
    prefix: str = ""
    prefix_index: int = 0
    last_special: bool = False
    tokens: list[str] = msgspec.field(default_factory=list)
    prefix_offset: int = 0
    read_offset: int = 0


class _InvalidPrefix(Exception):
    pass


def _prompt_tail(tok: Tokenizer, prompt: list[int], skip_special_tokens: bool) -> list[int]:
    """A suffix of ``prompt`` that primes a decode stream like the whole prompt does: its last
    ``_PROMPT_TAIL_MIN`` ids, extended (up to ``_PROMPT_TAIL_MAX``) until it holds
    ``_PROMPT_TAIL_NONSPECIAL`` ids that are not skipped special tokens. By slicing and C-level
    set tests (issue 13: no per-id Python); a new list."""
    n = len(prompt)
    if n <= _PROMPT_TAIL_MIN:
        return list(prompt)
    tail = prompt[n - _PROMPT_TAIL_MIN:]
    if not skip_special_tokens:
        return tail
    special = tok.special_ids
    if special.isdisjoint(tail) or \
            _PROMPT_TAIL_MIN - sum(map(special.__contains__, tail)) >= _PROMPT_TAIL_NONSPECIAL:
        return tail
    # newest first: is each of the last _PROMPT_TAIL_MAX ids special? The tail ends just before
    # the _PROMPT_TAIL_NONSPECIAL-th non-special one (or at _PROMPT_TAIL_MAX / the prompt's start)
    flags = list(map(special.__contains__, reversed(prompt[max(0, n - _PROMPT_TAIL_MAX):])))
    k = -1
    try:
        for _ in range(_PROMPT_TAIL_NONSPECIAL):
            k = flags.index(False, k + 1)
        size = max(_PROMPT_TAIL_MIN, k + 1)
    except ValueError:
        size = len(flags)
    return prompt[n - size:]


#: decoded text of recent prompt-tail windows: ``(tokenizer, skip_special_tokens, *ids)`` ->
#: text (a chat template's generation prompt repeats across requests, so most records find
#: their window here instead of decoding it); FIFO-bounded
_WINDOW_TEXT: dict[tuple, str] = {}
_WINDOW_TEXT_MAX = 4096


def _window_text(tok: Tokenizer, ids: list[int], skip: bool) -> str:
    """``tok.raw_decode(ids, skip)`` through ``_WINDOW_TEXT`` (the decode is a pure function of
    its key)."""
    key = (tok, skip, *ids)
    text = _WINDOW_TEXT.get(key)
    if text is None:
        text = tok.raw_decode(ids, skip)
        if len(_WINDOW_TEXT) >= _WINDOW_TEXT_MAX:
            try:
                del _WINDOW_TEXT[next(iter(_WINDOW_TEXT))]
            except (KeyError, StopIteration, RuntimeError):  # another thread evicted it first
                pass
        _WINDOW_TEXT[key] = text
    return text


class IncrementalDetokenizer:
    """Token ids in, text out, as vLLM streams it. ``add`` returns the text for the new ids
    (possibly ``""`` while a multi-byte character is incomplete); ``state()`` checkpoints."""

    def __init__(self, tok: Tokenizer, *, skip_special_tokens: bool = True,
                 spaces_between_special_tokens: bool = True, prompt_token_ids: list[int] | None = None,
                 state: DetokState | None = None):
        self.tok = tok
        self.skip_special_tokens = bool(skip_special_tokens)
        self.fast = tok.backend == "fast"
        self._window_text: str | None = None  # decode of the prompt-primed window, once
        if self.fast:
            # vLLM: spaces are only suppressed when special tokens are kept and the flag is off
            self._suppress_spaces = (not skip_special_tokens and not spaces_between_special_tokens
                                     and bool(tok.added_token_ids))
        else:
            self.spaces_between_special_tokens = bool(spaces_between_special_tokens)
        if state is not None:
            self._ids = list(state.ids)
            self._prefix = state.prefix
            self._prefix_index = state.prefix_index
            self._last_special = state.last_special
            self._tokens = list(state.tokens)
            self._prefix_offset = state.prefix_offset
            self._read_offset = state.read_offset
            return
        self._ids: list[int] = []
        self._prefix = ""
        self._prefix_index = 0
        self._last_special = False
        self._tokens: list[str] = []
        self._prefix_offset = 0
        self._read_offset = 0
        prompt = prompt_token_ids
        if not prompt:
            return
        if self.fast:
            self._ids = _prompt_tail(tok, prompt, self.skip_special_tokens)
            p = self._window_text = _window_text(tok, self._ids, self.skip_special_tokens)
            if p.endswith(_FFFD):
                # the prompt ends inside a multi-byte character: its dangling bytes belong to
                # the prompt, so they are part of the prefix (never emitted as output text);
                # vLLM falls back to an earlier prefix and leaks U+FFFD / prompt text
                self._prefix = p
                self._prefix_index = len(self._ids)
        else:
            toks = self._ids_to_tokens(prompt[-INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET - 2:])
            self._tokens = toks
            self._read_offset = len(toks)
            self._prefix_offset = max(len(toks) - INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET, 0)

    # --------------------------------------------------------------------------------- api ---
    def add(self, token_ids: list[int]) -> str:
        if self.fast:
            step = self._fast_step
        else:
            step = self._slow_step
        if len(token_ids) == 1:
            return step(token_ids[0])
        return "".join([step(t) for t in token_ids])

    def state(self) -> DetokState:
        if self.fast:
            return DetokState(ids=list(self._ids), prefix=self._prefix, prefix_index=self._prefix_index,
                              last_special=self._last_special)
        return DetokState(tokens=list(self._tokens), prefix_offset=self._prefix_offset,
                          read_offset=self._read_offset)

    def whole_output(self, token_ids: list[int]) -> str | None:
        """Text of a whole output in one decode call, or None when that shortcut could differ
        from stepping the ids one by one (then use ``add``).

        For a fast tokenizer, stepping the decode stream emits, chunk by chunk, exactly
        ``decode(window + ids)`` past ``decode(window)`` whenever no step hits an invalid prefix
        and the final text holds no U+FFFD (incomplete bytes are held back, then completed):
        byte-level and Metaspace decoders are prefix-stable on complete characters. Out-of-vocab
        ids are skipped by the decode as by stepping (``FastTokenizer.raw_decode``); an id that
        is not even a 32-bit token id, any U+FFFD, prefix mismatch or space suppression falls
        back to ``add``. Does not change the detokenizer's state; meant for one-shot
        (non-streaming) use."""
        if not self.fast or self._suppress_spaces or self._prefix:
            return None
        tok = self.tok
        window = self._ids
        p = "" if not window else self._window_text if self._window_text is not None \
            else tok.raw_decode(window, self.skip_special_tokens)
        try:
            s = tok.raw_decode(window + token_ids if window else token_ids, self.skip_special_tokens)
        except OverflowError:  # a negative or > 32-bit id: stepping skips it, one id at a time
            return None
        if _FFFD in s or not s.startswith(p):
            return None
        return s[len(p):]

    # ------------------------------------------------------------------------- fast path ---
    def _stream_step(self, token_id: int) -> str | None:
        tok = self.tok
        skip = self.skip_special_tokens
        ids = self._ids
        if not self._prefix and ids:
            p = tok.raw_decode(ids, skip)
            if not p.endswith(_FFFD):
                self._prefix = p
                self._prefix_index = len(ids)
        ids.append(token_id)
        s = tok.raw_decode(ids, skip)
        prefix = self._prefix
        if prefix.endswith(_FFFD) and not s.startswith(prefix):
            # only a prompt-primed prefix ends in U+FFFD (dangling prompt bytes): output bytes
            # that complete that character emit the whole character
            clean = prefix.rstrip(_FFFD)
            if s.startswith(clean) and len(s) > len(clean) and not s.endswith(_FFFD):
                prefix = clean
        if s.startswith(prefix):
            if len(s) <= len(prefix) or s.endswith(_FFFD):
                return None
        else:
            if len(s.encode("utf-8", "surrogatepass")) <= len(prefix.encode("utf-8", "surrogatepass")) \
                    or s.endswith(_FFFD):
                return None
            raise _InvalidPrefix()
        new_text = s[len(prefix):]
        del ids[:self._prefix_index]
        self._prefix = tok.raw_decode(ids, skip)
        self._prefix_index = len(ids)
        return new_text

    def _fast_step(self, token_id: int) -> str:
        if not self.tok.is_valid_id(token_id):
            # vLLM logs and returns no text for ids the tokenizer cannot decode
            return ""
        try:
            text = self._stream_step(token_id)
        except _InvalidPrefix:
            # vLLM resets the decode stream (no prompt) and steps the id again
            self._ids = []
            self._prefix = ""
            self._prefix_index = 0
            text = self._stream_step(token_id)
        if self._suppress_spaces:
            content = self.tok.added_token_ids.get(token_id)
            is_special = content is not None
            if is_special and self._last_special:
                text = content
            self._last_special = is_special
        return text or ""

    # ------------------------------------------------------------------------- slow path ---
    def _ids_to_tokens(self, ids: list[int]) -> list[str]:
        return self.tok.incremental_ids_to_tokens(ids, self.skip_special_tokens)

    def _tokens_to_string(self, tokens: list[str]) -> str:
        return self.tok.incremental_tokens_to_string(tokens, self.skip_special_tokens,
                                                     self.spaces_between_special_tokens)

    def _slow_step(self, token_id: int) -> str:
        tok = self.tok
        if tok.is_valid_id(token_id):
            new_tokens = self._ids_to_tokens([token_id])
        else:
            new_tokens = [""]
        tokens = self._tokens
        tokens.extend(new_tokens)
        po, ro = self._prefix_offset, self._read_offset
        prefix_text = self._tokens_to_string(tokens[po:ro])
        new_text = self._tokens_to_string(tokens[po:])
        if len(new_text) <= len(prefix_text) or new_text.endswith(_FFFD):
            return ""
        out = new_text[len(prefix_text):]
        # new offsets: prefix_offset = read_offset, read_offset = len(tokens); trim the window
        del tokens[:ro]
        self._prefix_offset = 0
        self._read_offset = len(tokens)
        return out


def step_text(tok: Tokenizer, state: DetokState | None, ids: list[int], skip_special_tokens: bool = True,
              spaces_between_special_tokens: bool = True) -> tuple[str, DetokState]:
    """``(text, next state)`` of stepping ``ids`` from ``state``: what
    ``IncrementalDetokenizer(tok, ..., state=state)`` gives by ``add(ids)`` then ``state()``
    (``state`` itself is never changed).

    A stream's common step, one id after a step that emitted text, takes a shortcut on a
    tokenizer that decodes by byte tables (``decodes_by_table``): the window then holds only the
    prefix's ids, whose text ``prefix`` does not end in U+FFFD, so their bytes end on a complete
    UTF-8 character and the window's decode with the id is ``prefix`` + the decode of the id
    alone (the UTF-8 decoder restarts at a character boundary): one single-id table decode
    instead of two window decodes, and the same text and state. Anything else (several ids, a
    pending id, a U+FFFD prefix, space suppression, an id outside the vocabulary, a slow
    tokenizer) steps the detokenizer."""
    if len(ids) == 1 and state is not None:
        prefix = state.prefix
        window = state.ids
        if prefix and state.prefix_index == len(window) and prefix[-1] != _FFFD and \
                tok.decodes_by_table and \
                (skip_special_tokens or spaces_between_special_tokens or not tok.added_token_ids):
            i = ids[0]
            if type(i) is int and 0 <= i < tok.vocab_size:
                new = tok.raw_decode(ids, skip_special_tokens)
                if not new or new[-1] == _FFFD:  # no text yet: the id waits in the window
                    return "", DetokState(ids=[*window, i], prefix=prefix, prefix_index=len(window),
                                          last_special=state.last_special)
                return new, DetokState(ids=[i], prefix=new, prefix_index=1, last_special=state.last_special)
    d = IncrementalDetokenizer(tok, skip_special_tokens=skip_special_tokens,
                               spaces_between_special_tokens=spaces_between_special_tokens, state=state)
    text = d.add(ids)
    return text, d.state()


def stop_token_trimmed(token_ids: list[int], finish_reason: str | None, stop_reason: int | str | None,
                       eos_token_ids, include_stop_str_in_output: bool = False) -> list[int]:
    """The ids vLLM detokenizes: the final stop token (an EOS id or the int ``stop_reason`` of a
    ``stop`` finish) is left out unless ``include_stop_str_in_output``."""
    ids = token_ids or []
    if include_stop_str_in_output or finish_reason != "stop" or not ids:
        return list(ids)
    last = ids[-1]
    is_stop_tok = (isinstance(stop_reason, int) and not isinstance(stop_reason, bool) and last == stop_reason) \
        or (not isinstance(stop_reason, str) and eos_token_ids is not None and last in eos_token_ids)
    return ids[:-1] if is_stop_tok else list(ids)



def held_stop_step(token_ids: list[int] | None, held: int, finish_reason: str | None, stop_reason: int | str | None,
                   eos_token_ids, include_stop: bool = False) -> tuple[list[int], list[int], int, int]:
    """One stream chunk's ids with the held-back EOS id: ``(seq, kept, lead, held)``: ``seq`` the
    chunk's ids after ``lead`` (0 or 1) held ones (``held`` in, -1: none), ``kept`` those to
    detokenize (on a finish ``stop_token_trimmed``; else all but an EOS id ending ``seq``, unless
    ``include_stop``), ``held`` out the id the next chunk starts with (-1: none). vLLM never
    decodes a stop-terminated sequence's last id, and the finish may come in a later, empty chunk
    (docs/streaming.md)."""
    seq = list(token_ids or [])
    lead = 0
    if held >= 0:
        seq.insert(0, held)
        lead = 1
    if finish_reason is not None:
        return seq, stop_token_trimmed(seq, finish_reason, stop_reason, eos_token_ids, include_stop), lead, -1
    if seq and not include_stop and seq[-1] in eos_token_ids:
        return seq, seq[:-1], lead, seq[-1]
    return seq, seq, lead, -1

def detokenize_output(tok: Tokenizer, token_ids: list[int], *, skip_special_tokens: bool = True,
                      spaces_between_special_tokens: bool = True, prompt_token_ids: list[int] | None = None,
                      finish_reason: str | None = None, stop_reason: int | str | None = None,
                      eos_token_ids=None, include_stop_str_in_output: bool = False) -> str:
    """Whole-output text as coupled vLLM returns it (stop token dropped, seeded from the prompt)."""
    if eos_token_ids is None:
        eos_token_ids = tok.eos_token_ids
    ids = stop_token_trimmed(token_ids, finish_reason, stop_reason, eos_token_ids, include_stop_str_in_output)
    d = IncrementalDetokenizer(tok, skip_special_tokens=skip_special_tokens,
                               spaces_between_special_tokens=spaces_between_special_tokens,
                               prompt_token_ids=prompt_token_ids)
    text = d.whole_output(ids)
    return text if text is not None else d.add(ids)


# ------------------------------------------------------------------------- stop strings ---
def stop_strings(stop: str | list[str] | None) -> tuple[str, ...]:
    """The request's ``stop`` as a tuple of non-empty strings."""
    if not stop:
        return ()
    if isinstance(stop, str):
        return (stop,)
    return tuple(x for x in stop if isinstance(x, str) and x)


def check_stop_strings(output_text: str, new_char_count: int, stop: tuple[str, ...],
                       include_in_output: bool) -> tuple[str, int] | None:
    """vLLM's ``check_stop_strings``: ``(stop string, truncate-to index or -1)`` when one of
    ``stop`` ends in the last ``new_char_count`` chars of ``output_text`` (list order wins)."""
    if not new_char_count or not stop:
        return None
    for s in stop:
        n = len(s)
        i = output_text.find(s, max(0, len(output_text) + 1 - new_char_count - n))
        if i == -1:
            continue
        if include_in_output:
            i += n
            if i >= len(output_text):
                return s, -1
        return s, i
    return None


def _whole_text(tok: Tokenizer, token_ids: list[int], skip_special_tokens, spaces_between_special_tokens,
                prompt_token_ids: list[int] | None) -> str | None:
    """``IncrementalDetokenizer(tok, ...).whole_output(token_ids)`` of a fresh detokenizer
    without building one (the non-streaming path's one call): the same window, the same decode,
    the same None whenever ``whole_output`` would refuse the shortcut (the caller then steps a
    real detokenizer)."""
    if tok.backend != "fast":
        return None
    skip = bool(skip_special_tokens)
    if not skip and not spaces_between_special_tokens and tok.added_token_ids:  # (``_suppress_spaces``)
        return None
    if prompt_token_ids:
        window = _prompt_tail(tok, prompt_token_ids, skip)
        p = _window_text(tok, window, skip)
        if p.endswith(_FFFD):  # (a prompt-primed prefix: ``whole_output`` refuses)
            return None
        try:
            s = tok.raw_decode(window + token_ids, skip)
        except OverflowError:
            return None
    else:
        p = ""
        try:
            s = tok.raw_decode(token_ids, skip)
        except OverflowError:
            return None
    if _FFFD in s or not s.startswith(p):
        return None
    return s[len(p):]


def detokenize_with_stop(tok: Tokenizer, token_ids: list[int], stop: tuple[str, ...], *,
                         include_stop_str_in_output: bool = False, min_tokens: int = 0,
                         skip_special_tokens: bool = True, spaces_between_special_tokens: bool = True,
                         prompt_token_ids: list[int] | None = None) -> tuple[str, int, str | None]:
    """Whole-output text with the request's stop strings applied as vLLM's detokenizer applies
    them (the engine behind a derender never sees them): ``(text, ids used, stop string)``.

    The ids are stepped one by one; after each step that adds text (and once more than
    ``min_tokens`` ids were seen) the new text is checked for a stop string ending in it; on a
    match the text is cut before it (after it with ``include_stop_str_in_output``) and the ids
    after the matching one are dropped (``ids used``). No match: the whole text, all ids, None.
    ``token_ids`` are the ids to detokenize (stop token already trimmed)."""
    text = _whole_text(tok, token_ids, skip_special_tokens, spaces_between_special_tokens, prompt_token_ids)
    if text is None:
        text = IncrementalDetokenizer(tok, skip_special_tokens=skip_special_tokens,
                                      spaces_between_special_tokens=spaces_between_special_tokens,
                                      prompt_token_ids=prompt_token_ids).add(token_ids)
    if not stop or not any(s in text for s in stop):
        return text, len(token_ids), None
    d = IncrementalDetokenizer(tok, skip_special_tokens=skip_special_tokens,
                               spaces_between_special_tokens=spaces_between_special_tokens,
                               prompt_token_ids=prompt_token_ids)
    out = ""
    for k, t in enumerate(token_ids):
        new = d.add([t])
        if not new:
            continue
        out += new
        if k + 1 <= min_tokens:
            continue
        hit = check_stop_strings(out, len(new), stop, include_stop_str_in_output)
        if hit is not None:
            s, cut = hit
            return (out if cut == -1 else out[:cut]), k + 1, s
    return out, len(token_ids), None
