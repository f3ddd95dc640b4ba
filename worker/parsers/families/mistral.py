"""Mistral family: ``--tool-parser mistral`` (Mistral 7B Instruct v0.3 with the HF tokenizer,
and the v7 tokenizer through ``--tokenizer-mode mistral``).

Format (mistral-common tokenizers v3/v7 and the v0.3 chat template; vLLM
``mistral_tool_parser``): the ``[TOOL_CALLS]`` control token, then a JSON list of
``{"name": ..., "arguments": {...}}`` running to the end of the output. The marker is a special
token, so the parser needs ``skip_special_tokens`` off (vLLM's ``adjust_request``). Tool call ids
are 9 alphanumerics (the v0.3 template rejects any other shape).

Parity rules (corpus ``mistral-tool-*``): text before the marker is content, as written
(``" Let me check. "``); a body that is not such a list (``mistral-tool-malformed-v0``) is
content, stripped and without the marker (coupled's non-stream answer).
"""
from __future__ import annotations

import json

from worker.parsers.jsontail import JsonTailToolParser, call_of
from worker.parsers.registry import register_tool


def parse_mistral_body(body: str) -> list[tuple[str, str]] | None:
    """Calls of a ``[TOOL_CALLS]`` body: a JSON list of call objects (a lone object accepted)."""
    try:
        obj = json.loads(body.strip())
    except ValueError:
        return None
    items = obj if isinstance(obj, list) else [obj]
    calls = [call_of(x) for x in items]
    if not calls or any(c is None for c in calls):
        return None
    return calls  # type: ignore[return-value]


@register_tool("mistral", "Mistral 7B v0.3, Mistral v7 tokenizers", "[TOOL_CALLS] [{\"name\", \"arguments\"}, …]")
class MistralToolParser(JsonTailToolParser):
    """``[TOOL_CALLS]`` + JSON list."""

    markers = ("[TOOL_CALLS]",)
    needs_special_tokens = True
    id_format = "alnum9"

    def parse_body(self, body: str) -> list[tuple[str, str]] | None:
        return parse_mistral_body(body)

    def malformed_content(self, body: str) -> str:
        return body.strip()
