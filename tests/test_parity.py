"""Parity with coupled ``vllm serve``: every non-streaming case of the public corpus through the
core, compared by the corpus' own ``compare.py`` rules (tests/parity_tools/compare.py)."""
from __future__ import annotations

import pytest

from tests.parity import check_case, nonstream_cases, service
from worker.parsers import REASONING_PARSERS, TOOL_PARSERS


def _supported(case: dict) -> str | None:
    cfg = service().models[case["model"]]
    for kind, name, reg in (("reasoning", cfg.reasoning_parser, REASONING_PARSERS),
                            ("tool", cfg.tool_parser, TOOL_PARSERS)):
        if name and name not in reg:
            return f"{kind} parser {name} not registered"
    return None


CASES = nonstream_cases()


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_nonstream_parity(case):
    missing = _supported(case)
    if missing:
        pytest.skip(missing)
    ok, why = check_case(case)
    assert ok, why
