"""DeepSeek-V3.2 tool calls: ``--tool-parser deepseek_v32`` (DSML).

Format (DeepSeek-V3.2 encoding; vLLM ``deepseek_v32``, SGLang ``deepseekv32``): one block of
DSML invokes; each parameter says whether its value is a raw string (``string="true"``) or JSON
(``string="false"``):

    <｜DSML｜function_calls>
    <｜DSML｜invoke name="get_weather">
    <｜DSML｜parameter name="location" string="true">杭州</｜DSML｜parameter>
    <｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜function_calls>

The invoke grammar is DeepSeek V4's DSML inside a ``function_calls`` fence, so the body is parsed
by ``deepseek.parse_dsml_body`` (``string="false"`` values typed by the request schema, else
JSON). A block left open at the end of the output keeps its complete invokes
(``TaggedToolParser.call_ends``: ``</｜DSML｜invoke>``), the cut-off invoke after them is dropped;
with no complete invoke it is content. A parameter missing its ``</｜DSML｜parameter>`` ends where the
next parameter opens (or at its invoke's end), as vLLM PR 54838 does for V3.2 and V4
(``deepseek.dsml_param_values``). Orphan invokes (no fence), a parameter without ``string=``
and the schema typing of values: the ``deepseek`` module docstring, as for V4.
"""
from worker.parsers.families.deepseek import BARE_INVOKE, BARE_INVOKE_END, parse_dsml_body
from worker.parsers.registry import register_tool
from worker.parsers.tagged import TaggedState, TaggedToolParser


@register_tool("deepseek_v32", "DeepSeek-V3.2, V3.2-Speciale",
               '<｜DSML｜function_calls><｜DSML｜invoke name="f"><｜DSML｜parameter name="k" string="true">v'
               "</｜DSML｜parameter></｜DSML｜invoke></｜DSML｜function_calls>",
               "a parameter without its closer ends at the next parameter or the invoke's end (vLLM PR 54838); "
               "invokes without the fence; a parameter without `string=` (vLLM 0.33 tests)")
class DeepSeekV32ToolParser(TaggedToolParser):
    needs_special_tokens = True
    starts = ("<｜DSML｜function_calls>",)
    ends = ("</｜DSML｜function_calls>",)
    call_ends = ("</｜DSML｜invoke>",)
    param_types = True
    #: an invoke without the ``function_calls`` fence is a call (``deepseek`` module docstring)
    bare_start = BARE_INVOKE
    bare_end = BARE_INVOKE_END

    def parse_partial(self, st: TaggedState, body: str):
        if st.bare:  # an orphan invoke cut off at the end of the output: content
            return None
        return super().parse_partial(st, body)

    def parse_call(self, st: TaggedState, body: str):
        return parse_dsml_body(body, st.types, complete=True)
