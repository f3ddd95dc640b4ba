"""Think-style reasoning whose answer is itself wrapped in markers that are not content
(ERNIE 4.5 ``<response>…</response>``, Hunyuan-A13B ``<answer>…</answer>``, Cohere Command
``<|START_RESPONSE|>…<|END_RESPONSE|>``): a ``ThinkReasoningParser`` whose content stream is
filtered once more, dropping the spec's ``drop`` markers wherever they occur (a marker split
across deltas is held back, at most one marker long; the longest marker wins, so a complete
marker that begins a longer one waits for the text that decides) and the ``lstrip`` characters at the very
start of the content. Per-feed work stays O(delta + longest marker).

Framing whitespace (Cohere's, ``families/cohere.py``): ``strip_reasoning`` drops the whitespace
at the start of the reasoning (``WrappedThinkState.rstarted``: reasoning text was emitted) and at
its end (held at the front of ``buf``, which the engine reads again as reasoning text, until
more reasoning follows it); ``rstrip_content`` drops the content whitespace right before a
``drop`` marker or the end of the output (held in ``cbuf`` until other text follows it). Both
holds sit where release e8f2be2 reads them as text still to emit.
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
    #: reasoning text was emitted (``strip_reasoning``)
    rstarted: bool = False


class WrappedThinkReasoningParser(ThinkReasoningParser):
    """Subclasses set ``spec`` plus ``drop`` (content markers to remove) and ``lstrip``."""

    drop: ClassVar[tuple[str, ...]] = ()
    lstrip: ClassVar[str] = ""
    #: framing whitespace (module docstring)
    strip_reasoning: ClassVar[bool] = False
    rstrip_content: ClassVar[bool] = False

    def initial_state(self, ctx: RequestContext) -> WrappedThinkState:
        base = super().initial_state(ctx)
        return WrappedThinkState(mode=base.mode, buf=base.buf, tok_reasoning=base.tok_reasoning)

    def _filter(self, st: WrappedThinkState, text: str, final: bool) -> str:
        s = st.cbuf + text
        st.cbuf = ""
        out = []
        rstrip = self.rstrip_content
        while s:
            i, m = find_first(s, self.drop)
            if i < 0:
                keep = 0 if final else hold_back(s, self.drop)
                t = s[: len(s) - keep]
                if rstrip:  # trailing whitespace: held (dropped at a marker or the end)
                    t = t.rstrip()
                    keep = 0 if final else len(s) - len(t)
                out.append(t)
                st.cbuf = s[len(s) - keep:]
                break
            out.append(s[:i].rstrip() if rstrip else s[:i])
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

    def _frame(self, st: WrappedThinkState, d: Delta, final: bool) -> None:
        """``strip_reasoning``: the reasoning's leading whitespace dropped, its trailing
        whitespace held (at the front of ``buf``) while the reasoning may go on, else dropped."""
        if not self.strip_reasoning or not d.reasoning:
            return
        r = d.reasoning if st.rstarted else d.reasoning.lstrip()
        st.rstarted = st.rstarted or bool(r)
        k = len(r.rstrip())
        if not final and st.mode == "reasoning":
            st.buf = r[k:] + st.buf
        d.reasoning = r[:k]

    def feed(self, state: WrappedThinkState, text: str, token_ids: list[int]) -> Delta:
        d = super().feed(state, text, token_ids)
        self._frame(state, d, final=False)
        if d.content or state.cbuf:
            d.content = self._filter(state, d.content, final=False)
        return d

    def finish(self, state: WrappedThinkState) -> Delta:
        d = super().finish(state)
        self._frame(state, d, final=True)
        d.content = self._filter(state, d.content, final=True)
        return d
