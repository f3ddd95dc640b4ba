"""OpenAI gpt-oss family (Harmony format): ``--reasoning-parser openai_gptoss``,
``--tool-parser openai``.

Format (OpenAI Harmony response format, openai/harmony; vLLM ``openai_gptoss`` /
``openai``, SGLang ``gpt-oss``): the output is a sequence of messages, each a header then
``<|message|>`` then the body, closed by ``<|end|>``, ``<|call|>`` (a tool call) or
``<|return|>`` (end of answer). The prompt ends with ``<|start|>assistant``, so the first header
is usually just ``<|channel|>analysis``; later ones repeat ``<|start|>assistant``. Channels:
``analysis`` (chain of thought), ``commentary`` (tool calls, preambles), ``final`` (the answer).
A tool call names its recipient in the header, ``to=functions.NAME``, optionally with a
``<|constrain|>json`` content type, and its body is the JSON arguments:

    <|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary
    to=functions.get_weather <|constrain|>json<|message|>{"city": "SF"}<|call|>

The parsing is the Harmony engine's (``worker.parsers.harmony``: typed segments, one classifier
from channel and recipient, one apply loop); this module declares the two parsers and documents
what they answer. Two scanners, one per kind of vocabulary:

* **ids** (gpt-oss's own ``o200k_harmony`` vocabulary: every marker a special token at its fixed
  id, ``<|start|>`` 200006, ``<|channel|>`` 200005, ``<|message|>`` 200008, ``<|constrain|>``
  200003, ``<|end|>`` 200007, ``<|call|>`` 200012, ``<|return|>`` 200002; see
  ``worker.core.tiktoken_vocab`` for the tokenizer, ``--tokenizer o200k_harmony``): vLLM parses
  Harmony from the token ids with openai-harmony's ``StreamableParser``, and so does
  ``harmony.scan_ids``, token by token: header ids until ``<|message|>`` (parsed with
  openai-harmony's header rules, ``harmony.parse_header``: ``<|channel|>NAME``, ``to=RECIPIENT``
  before or after the channel, ``<|constrain|>TYPE`` or a bare content type), then body bytes
  decoded as UTF-8 (an incomplete character held in the state) until a stop token
  (``<|end|>``, ``<|call|>``, ``<|return|>``). Only those ids are markup: the same strings
  written as ordinary tokens are text. The parsers read the ids only (the text delta is
  ignored), and the core hands them the final stop token vLLM trims from the text
  (``wants_stop_token``), since ``<|call|>`` both ends generation and completes a call.
* **text** (any other vocabulary, e.g. markers added to another tokenizer, or sent as text as in
  bug-023/bug-117): ``harmony.scan`` finds the same markers in the decoded text.

Output (vLLM's serving for gpt-oss, ``harmony_utils`` + the ``openai`` tool parser and the
streaming delta extraction):

* ``openai_gptoss`` (reasoning): ``analysis`` bodies -> reasoning; ``final``, ``commentary``
  preambles and other bodies -> content, headers removed. Messages to ``functions.NAME``: in
  text mode they pass through as raw Harmony text in the content, for the tool parser; in id
  mode the tool parser reads them from the ids, so with no tool parser (or tools off) they are
  dropped, as vLLM's ``parse_chat_output`` drops them. Text outside any message is content.
* ``openai`` (tool): a message to ``functions.NAME`` (on ``commentary`` or ``analysis``: the
  recipient decides, as vLLM's streaming path) -> a call, arguments re-dumped the way vLLM does
  (``json.dumps(json.loads(body))``, ASCII-escaped; with a content type not naming json, the
  body as it is; ``{}`` for an empty body); a body that is not JSON leaves the message as
  content, verbatim (vLLM passes the raw text on as arguments; the product never emits a call
  with broken JSON). ``final``/``commentary`` bodies -> content; ``analysis`` bodies are dropped
  (they are reasoning). Text mode makes a call only on ``<|call|>``/``<|end|>``; id mode on any
  stop token, as openai-harmony closes a message on any.

Differences from vLLM, deliberate: messages are concatenated (vLLM's non-streaming path joins
several analysis or final messages with ``\n``, its streaming path does not; stream and
non-stream must agree here); vLLM's tool parser keeps only the last of final / preamble text,
here all of it stays, in order. End of output (``finish_reason: length``) mid-message: the text
so far stays reasoning or content; a call cut short is content, verbatim, never a call (vLLM
drops it from the non-streaming answer); in id mode a header cut short is dropped (it carries
no text; vLLM shows nothing for it), unless it never began like a header (no marker, no leading
``to=``: plain text, which is content). Where openai-harmony raises (a token other than
``<|start|>`` between messages, a header it rejects) the id scanner keeps the text as content;
``<|endoftext|>`` (EOS/pad) is skipped.

Per-feed work is O(delta + marker) (O(tokens) in id mode); a header is buffered up to
``MAX_HEADER`` chars / ``MAX_HEADER_TOKENS`` tokens (longer is not a header: it comes back as
text), a call's body until its terminator. ``reasoning_tokens`` are not counted for Harmony.
Source: OpenAI Harmony format (openai/harmony ``docs/format.md``, ``src/encoding.rs``
``StreamableParser``); vLLM ``entrypoints/openai/parser/harmony_utils.py``,
``tool_parsers/openai_tool_parser.py``. Tests: ``tests/test_gptoss_harmony.py`` (vectors on the
real ids, openai-harmony as the reference), ``tests/test_parser_families.py`` (text mode).

``--tool-call-streaming incremental`` does not apply to Harmony calls (text or ids): they go out
whole, when ``<|call|>`` arrives, in both settings.
"""
from __future__ import annotations

from worker.parsers.base import ReasoningParser, ToolParser
from worker.parsers.harmony import HarmonyParser, Role
from worker.parsers.registry import register_reasoning, register_tool


@register_reasoning("openai_gptoss", "OpenAI gpt-oss-20b / gpt-oss-120b",
                    "Harmony: <|channel|>analysis<|message|>…<|end|> = reasoning, final channel = content")
class GptOssReasoningParser(HarmonyParser, ReasoningParser):
    """Harmony channels -> reasoning/content (module docstring for both modes)."""

    role = Role.REASONING


@register_tool("openai", "OpenAI gpt-oss-20b / gpt-oss-120b",
               "Harmony: <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{…}<|call|>")
class GptOssToolParser(HarmonyParser, ToolParser):
    """Harmony tool calls (module docstring for both modes)."""

    role = Role.TOOL
