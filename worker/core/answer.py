"""Stop strings on a chat choice: they apply to the answer, not to the reasoning.

vLLM's maintainers made stop strings skip the reasoning for their earlier engine (vLLM PR 14550,
issue 14399: a stop word the chain of thought happens to contain cut the response inside the
think block); vLLM 0.32's V1 detokenizer regressed to matching the whole output. The product
follows the fix, for every reasoning parser, non-streaming and streamed alike.

How (one code path for both modes, so a stream equals the non-streaming answer under any
chunking): the choice's ids are detokenized one by one, as vLLM's detokenizer steps them; each
token's text goes through the reasoning parser (``ParserStack.feed_reasoning``); the answer text
it emits (``content``: everything the reasoning parser does not classify as reasoning, tool-call
markup included) is checked with vLLM's ``check_stop_strings`` (once more than ``min_tokens`` ids
were seen), holding back the last ``max(len(stop)) - 1`` answer characters across tokens and
chunks (``scan_stop``). On a match the answer is cut before the stop string (after it with
``include_stop_str_in_output``) and ends there: the matching token is the last one whose ids,
logprobs and reasoning count, exactly as a match in plain text ends a choice today
(``detokenize_with_stop``): ``finish_reason`` ``stop``, ``stop_reason`` the string, usage still
counting every engine token. Released answer text then goes through the tool parser / tool_choice
mode (``ParserStack.feed_answer``). Reasoning is never held back nor cut.

Without a reasoning parser the answer is the whole text, so chat behaves as before (and
completions keep ``detokenize_with_stop`` / the stream's ``_detok``).
"""
from __future__ import annotations

from worker.core.detokenize import IncrementalDetokenizer, check_stop_strings
from worker.parsers.base import Delta
from worker.parsers.stack import ParserStack, StackState

__all__ = ["scan_stop", "step_answer", "answer_has_stop"]


def scan_stop(held: str, new: str, stop: tuple[str, ...] | list[str], include: bool,
              check: bool) -> tuple[str, str, str | None]:
    """One step of stop-string matching over a text stream: ``held`` (the held-back tail, shorter
    than the longest stop string) plus ``new`` text. Returns ``(release, held, matched)``: the
    text that can go out now, the new held-back tail, and the matched stop string (then
    ``release`` ends at the cut and ``held`` is ``""``). ``check`` false (``min_tokens`` not
    reached) only holds back. Same results as ``check_stop_strings`` over the whole stream."""
    keep = max(len(s) for s in stop) - 1
    buf = held + new
    if check:
        hit = check_stop_strings(buf, len(new), tuple(stop), include)
        if hit is not None:
            s, cut = hit
            return (buf if cut == -1 else buf[:cut]), "", s
    if len(buf) > keep:
        return buf[: len(buf) - keep], buf[len(buf) - keep:], None
    return "", buf, None


def answer_has_stop(stack: ParserStack, st: StackState, text: str, token_ids: list[int],
                    stop: tuple[str, ...]) -> bool:
    """Whether the answer text of a whole output (``text``/``token_ids`` through the reasoning
    parser, on the fresh state ``st``, which is consumed) contains one of ``stop``: when it does
    not, no stop string can match and the choice is parsed in one step."""
    if stack.reasoning is None:
        return any(s in text for s in stop)
    r = stack.feed_reasoning(st, text, token_ids)
    answer = r.content + stack.finish_reasoning(st).content
    return any(s in answer for s in stop)


def step_answer(stack: ParserStack | None, st: StackState | None, detok: IncrementalDetokenizer,
                ids: list[int], skipped: frozenset[int] | None, stop: tuple[str, ...] | list[str],
                include: bool, min_tokens: int, seen: int, held: str,
                final: bool, stop_token_ids: list[int] | None = None) -> tuple[Delta, int, str | None, str]:
    """Detokenize and parse ``ids`` (one chunk, or a whole output with ``final``) with the
    request's stop strings applied to the answer (module docstring).

    ``st``: the choice's parser state (None: no parser, the answer is the text); ``skipped``:
    ids the parsers never see (skipped special tokens) or None; ``seen``: ids of this choice
    before ``ids`` (for ``min_tokens``); ``held``: the answer tail held back so far; ``final``:
    the engine finished the choice with these ids (flush everything); ``stop_token_ids``: the
    final stop token trimmed from ``ids``, for parsers that read it
    (``ParserStack.wants_stop_token``), fed with no text after the last id when no stop string
    matched.

    Returns ``(delta, used, matched, held)``: the parsed delta (reasoning, content, tool calls,
    reasoning_tokens), the number of ``ids`` consumed (up to and including the matching token
    on a match, else all), the matched stop string or None, and the new held-back tail."""
    out = Delta()
    answer: list[str] = []
    fed: list[int] = []
    matched: str | None = None
    used = len(ids)
    for j, t in enumerate(ids):
        new = detok.add([t])
        pid = [] if skipped is not None and t in skipped else [t]
        if not new and not pid:
            continue
        fed.extend(pid)
        if st is None:
            content = new
        else:
            r = stack.feed_reasoning(st, new, pid)
            out.reasoning += r.reasoning
            out.reasoning_tokens += r.reasoning_tokens
            content = r.content
        if content:
            rel, held, matched = scan_stop(held, content, stop, include, seen + j + 1 > min_tokens)
            answer.append(rel)
            if matched is not None:
                used = j + 1
                break
    if final and matched is None:
        if st is not None:
            check = seen + len(ids) > min_tokens
            if stop_token_ids:
                fed.extend(stop_token_ids)
                r = stack.feed_reasoning(st, "", stop_token_ids)
                out.reasoning += r.reasoning
                out.reasoning_tokens += r.reasoning_tokens
                if r.content:
                    rel, held, matched = scan_stop(held, r.content, stop, include, check)
                    answer.append(rel)
            if matched is None:
                r = stack.finish_reasoning(st)
                out.reasoning += r.reasoning
                if r.content:
                    rel, held, matched = scan_stop(held, r.content, stop, include, check)
                    answer.append(rel)
        if matched is None:
            answer.append(held)
            held = ""
    text = "".join(answer)
    if st is None:
        out.content = text
        return out, used, matched, held
    a = stack.feed_answer(st, text, fed) if (text or fed) else Delta()
    if final or matched is not None:
        a.extend(stack.finish_answer(st))
    out.content, out.tool_calls = a.content, a.tool_calls
    return out, used, matched, held
