"""Parity with coupled ``vllm serve``: every non-streaming case of the public corpus through the
core, compared by the corpus' own ``compare.py`` rules (tests/parity_tools/compare.py)."""
from __future__ import annotations

import pytest

from tests.parity import check_case, missing_parser, nonstream_cases

CASES = nonstream_cases()


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_nonstream_parity(case):
    missing = missing_parser(case)
    if missing:
        pytest.skip(missing)
    ok, why = check_case(case)
    assert ok, why
