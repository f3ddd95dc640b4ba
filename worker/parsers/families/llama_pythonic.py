"""Pythonic tool calls of the Llama family: ``--tool-parser pythonic`` (Llama 3.2 / 3.3,
ToolACE and other pythonic fine-tunes) and ``llama4_pythonic`` (Llama 4 Scout / Maverick); and
``llama4_json``, which vLLM maps to its Llama 3 JSON parser (``llama.Llama3JsonToolParser``:
``{"name": …, "parameters": {…}}``, optionally after ``<|python_tag|>``).

Format (vLLM ``tool_chat_template_llama3.2_pythonic`` / Llama 4 templates; vLLM ``pythonic`` and
``llama4_pythonic``, SGLang ``pythonic``): the whole output is a Python list of calls with
keyword arguments, ``[get_weather(city="San Francisco", metric=True), get_time(tz="PST")]``;
Llama 4 may wrap it in ``<|python_start|>…<|python_end|>``. Output that is not exactly such a
list is content, except a ``<|python_start|>`` section cut off before its end, which keeps its
complete calls (``PythonicToolParser.open_section``).
"""
from worker.parsers.families.llama import Llama3JsonToolParser
from worker.parsers.pythonic import PythonicToolParser
from worker.parsers.registry import register_tool


@register_tool("llama4_json", "Llama 4 Scout / Maverick (JSON template)", '<|python_tag|>? {"name", "parameters"}; … (as llama3_json)')
class Llama4JsonToolParser(Llama3JsonToolParser):
    """vLLM registers ``llama4_json`` on the Llama 3 JSON parser class."""


@register_tool("pythonic", "Llama 3.2 / 3.3 (pythonic template), ToolACE", "[f(a=1), g(b=\"x\")] (whole output)")
class PythonicCallsToolParser(PythonicToolParser):
    markers = ("[",)


@register_tool("llama4_pythonic", "Llama 4 Scout / Maverick",
               "[f(a=1), …] or <|python_start|>[…]<|python_end|> (whole output)")
class Llama4PythonicToolParser(PythonicToolParser):
    needs_special_tokens = True
    markers = ("<|python_start|>", "[")
    wrappers = {"<|python_start|>": "<|python_end|>"}
