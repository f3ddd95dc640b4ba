"""Split independence and checkpointing of the parser stack over the parity corpus.

For every chat case (with a non-streaming answer) of the models with parsers, each choice's
output is run through the stack as one delta (what the non-streaming path does) and as
token-aligned text deltas from the core's ``IncrementalDetokenizer`` in chunks of 1 token,
3 tokens and random sizes. The final reasoning / content / tool calls / reasoning_tokens must be
the same, also when the stack state is round-tripped through ``msgspec.json`` after every
chunk (``ParserStack.load_state``), as a streaming worker checkpoints it.
"""
from __future__ import annotations

import json
import random

import msgspec
import pytest

from tests.harness import parsers as fam
from tests.harness.parsers import CASES
from tests.harness.parsers import chunks as _chunks
from tests.harness.parsers import outcome as _outcome
from tests.harness.parsers import run_ids as _run
from tests.harness.parsers import setup as _setup
from worker.core import derender as D
from worker.core.detokenize import stop_token_trimmed


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_split_and_roundtrip(case):
    rt, req, gr, prompt_ids, ctx, skip = _setup(case)
    rng = random.Random(case["id"])
    for c in gr.choices:
        # reference: the non-streaming path (whole text as one delta)
        text, pids = D._text_of(rt, c, prompt_ids, skip, req.spaces_between_special_tokens,
                                req.include_stop_str_in_output)
        st = rt.stack.initial_state(ctx)
        ref = rt.stack.feed(st, text, pids)
        ref.extend(rt.stack.finish(st))
        expected = _outcome(ref)
        ids = stop_token_trimmed(c.token_ids, c.finish_reason, c.stop_reason, rt.tokenizer.eos_token_ids,
                                 req.include_stop_str_in_output)
        for how in ("one", "1", "3", "rand", "rand"):
            chunks = _chunks(ids, how, rng)
            for roundtrip in (False, True):
                got, streamed = _run(rt, ctx, req, prompt_ids, skip, ids, chunks, roundtrip)
                assert streamed == text, f"detokenizer: split {how} text differs from the whole-output text"
                assert got == expected, f"split {how} roundtrip={roundtrip}: {got!r} != {expected!r}"


# ----------------------------------------- reasoning framing whitespace (nemotron_v3, minimax_m2) ---
def _framing_vectors():
    return [v for v in fam.VECTORS if v.reasoning_parser in ("nemotron_v3", "minimax_m2")]


FRAMING = _framing_vectors()


@pytest.mark.parametrize("v", FRAMING, ids=[v.id for v in FRAMING])
def test_reasoning_framing_token_aligned_splits(v):
    """The family vectors whose reasoning loses its trailing whitespace (template framing, as
    vLLM), encoded with the family's test tokenizer and fed as token-aligned deltas from the
    core's detokenizer in 1-token, 3-token and random chunks with the state round-tripped: the
    same reasoning / content / calls as the whole output, and the vector's answer."""
    from schemas import ChatCompletionRequest
    from worker.config import ServedModelConfig

    tok = fam.tokenizer(v.family)
    rt = D.ModelRuntime(ServedModelConfig(name="m", tokenizer="<test>", reasoning_parser=v.reasoning_parser,
                                          tool_parser=v.tool_parser, enable_auto_tool_choice=bool(v.tool_parser)),
                        tokenizer=tok)
    req = msgspec.convert({"skip_special_tokens": False, "chat_template_kwargs": v.kwargs,
                           "tools": v.tools if v.tool_parser else None}, ChatCompletionRequest)
    ctx = D.request_context(req, None)
    ids = tok.encode(v.text)
    ref, text = _run(rt, ctx, req, None, False, ids, [ids], False)
    assert text == v.text
    assert ref[:2] == (v.reasoning, v.content)
    assert [(n, json.loads(a)) for n, a in ref[2]] == v.calls
    rng = random.Random(v.id)
    for how in ("1", "3", "rand", "rand"):
        got, _ = _run(rt, ctx, req, None, False, ids, _chunks(ids, how, rng), True)
        assert got == ref, how
