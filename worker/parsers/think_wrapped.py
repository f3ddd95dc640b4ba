"""Think-style reasoning whose answer is itself wrapped in markers that are not content
(ERNIE 4.5 ``<response>…</response>``, Hunyuan-A13B ``<answer>…</answer>``, Cohere Command
``<|START_RESPONSE|>…<|END_RESPONSE|>``): a ``ThinkReasoningParser`` whose content stream is
filtered once more, dropping the spec's ``drop`` markers wherever they occur (a marker split
across deltas is held back, at most one marker long; the longest marker wins, so a complete
marker that begins a longer one waits for the text that decides) and the ``lstrip`` characters at the very
start of the content. Per-feed work stays O(delta + longest marker).
"""
from __future__ import annotations

from typing import ClassVar

from worker.parsers.base import Delta, RequestContext, find_first, hold_back
from worker.parsers.think import ThinkFields, ThinkReasoningParser


class WrappedThinkState(ThinkFields, kw_only=True, array_like=True):
    """``ThinkState``'s fields plus the content filter's held-back text (``cbuf``) and whether
    any content was emitted yet (``cstarted``, for ``lstrip``); ``ThinkState``'s later fields
    come last (release e8f2be2's layout first: ``ThinkFields``)."""

    cbuf: str = ""
    cstarted: bool = False
    closed: bool = False
    held_len: int = 0
    held_in: bool = False


class WrappedThinkReasoningParser(ThinkReasoningParser):
    """Subclasses set ``spec`` plus ``drop`` (content markers to remove) and ``lstrip``."""

    drop: ClassVar[tuple[str, ...]] = ()
    lstrip: ClassVar[str] = ""

    def initial_state(self, ctx: RequestContext) -> WrappedThinkState:
        base = super().initial_state(ctx)
        return WrappedThinkState(mode=base.mode, buf=base.buf, tok_reasoning=base.tok_reasoning)

    def _filter(self, st: WrappedThinkState, text: str, final: bool) -> str:
        s = st.cbuf + text
        st.cbuf = ""
        out = []
        while s:
            i, m = find_first(s, self.drop)
            if i < 0:
                keep = 0 if final else hold_back(s, self.drop)
                out.append(s[: len(s) - keep])
                st.cbuf = s[len(s) - keep:]
                break
            out.append(s[:i])
            if not final and any(len(x) > len(m) and x.startswith(s[i:]) for x in self.drop):
                st.cbuf = s[i:]  # a longer marker may still complete: decide on more text
                break
            s = s[i + len(m):]
        res = "".join(out)
        if not st.cstarted and self.lstrip:
            res = res.lstrip(self.lstrip)
        if res:
            st.cstarted = True
        return res

    def feed(self, state: WrappedThinkState, text: str, token_ids: list[int]) -> Delta:
        d = super().feed(state, text, token_ids)
        if d.content or state.cbuf:
            d.content = self._filter(state, d.content, final=False)
        return d

    def finish(self, state: WrappedThinkState) -> Delta:
        d = super().finish(state)
        d.content = self._filter(state, d.content, final=True)
        return d
