"""vLLM 0.32's Messages-stream behaviours that the shared parsers do not have (the chat and
Responses streams keep theirs), each seen in the Messages reference
(``tests/data/parity/messages_public.jsonl``, README "What the derender must reproduce") and
applied to the parser deltas before the event builder (``worker.core.messages.derender``):

* ``plain_text_first`` (``llama3_json`` / ``llama4_json``): vLLM's ``Llama3JsonToolParser``
  streams the output as content as soon as its text starts with neither ``<|python_tag|>`` nor
  ``{`` (``extract_tool_calls_streaming``: ``if not (current_text.startswith(self.bot_token)
  or current_text.startswith("{")): return DeltaMessage(content=delta_text)``; the non-streaming
  ``extract_tool_calls`` has the same test): the tool parser is turned off for that output
  (``llama3-multiturn-tool-result``; our shared parser holds the whole text to parse it at the end);
* ``merge_final_arguments`` (same parsers): vLLM's chat stream generator, on the output's last
  step, replaces that step's argument delta with what the call still lacks of
  ``json.dumps(partial parse)`` (``_should_check_for_unstreamed_tool_arg_tokens``: "autocomplete"
  the JSON): one delta ``{"city": "Pa"}`` (``llama3-tool-use-max-tokens``); a last step without an
  argument delta sends nothing (``llama3-tool-use-noinput``: ``input`` stays ``{}``);
* ``TEXT_DROPPED_AFTER_CALL`` (``hermes``): text after a tool call is dropped in both paths
  (vLLM's ``Hermes2ProToolParser``: content is the text before the first ``<tool_call>``;
  ``qwen3-tool-use-then-text``);
* ``TEXT_HELD_AFTER_CALL`` (``qwen3_coder`` / ``qwen3_xml``, vLLM's parser engine): text that
  arrives after a call is sent as one text block after the call's block, its leading ``"\\n"``
  dropped (``qwen3-coder-tool-use-then-text``): the builder holds it (``OpenItem.held``);
* ``TagHold`` (``qwen3`` reasoning parser with ``thinking: disabled``): the answer's trailing
  ``"<"`` (a possible tag start: a proper prefix of ``<think>`` / ``</think>``) is held and sent
  with the next text (``qwen3-stop-sequence``: ``"<an"``), flushed at the end.
"""
from __future__ import annotations

from worker.parsers.base import Delta

__all__ = ["PLAIN_TEXT_PARSERS", "TEXT_DROPPED_AFTER_CALL", "TEXT_HELD_AFTER_CALL", "TAG_PREFIXES",
           "plain_text_first", "tag_hold"]

#: tool parsers whose streaming parser is vLLM's ``Llama3JsonToolParser``
PLAIN_TEXT_PARSERS = frozenset({"llama3_json", "llama4_json"})
TEXT_DROPPED_AFTER_CALL = frozenset({"hermes"})
TEXT_HELD_AFTER_CALL = frozenset({"qwen3_coder", "qwen3_xml"})
#: the reasoning tags whose proper prefixes the Qwen3 path holds at the end of the answer text
TAG_PREFIXES = tuple(sorted({t[:i] for t in ("<think>", "</think>") for i in range(1, len(t))}, key=len,
                            reverse=True))

_CALL_STARTS = ("<|python_tag|>", "{")


def plain_text_first(text: str) -> bool | None:
    """For ``PLAIN_TEXT_PARSERS``: True when the output whose text starts with ``text`` is plain
    content (vLLM's test), False when it may be a call, None while ``text`` is empty or a
    proper prefix of ``<|python_tag|>`` (undecided)."""
    if not text:
        return None
    if text.startswith(_CALL_STARTS):
        return False
    if "<|python_tag|>".startswith(text):
        return None
    return True


def tag_hold(held: str, d: Delta, final: bool) -> str:
    """Apply the Qwen3 tag hold to ``d.content`` in place: ``held`` (the text held so far) goes
    first; a trailing proper prefix of a reasoning tag is held again unless ``final``. Returns
    the new held text (at most 8 characters)."""
    text = held + d.content
    keep = ""
    if not final:
        for p in TAG_PREFIXES:
            if text.endswith(p):
                keep = p
                break
    d.content = text[:len(text) - len(keep)]
    return keep
