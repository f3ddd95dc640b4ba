"""Shared helpers for the parity tests: load the copied corpus and served models (tests/data/)."""
from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from tests.parity_tools import compare as compare_mod
from tests.parity_tools import to_requests
from worker.config import load_config_file
from worker.core.service import DerenderService

DATA = Path(__file__).resolve().parent / "data"
PARITY = DATA / "parity"


@cache
def corpus() -> list[dict]:
    """Every case of the public parity corpus (tests/data/parity/corpus_public.jsonl)."""
    with open(PARITY / "corpus_public.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@cache
def service() -> DerenderService:
    """One DerenderService for every served model of the corpus."""
    return DerenderService(load_config_file(PARITY / "models.json"))


def missing_parser(case: dict) -> str | None:
    """Why a case cannot run yet (its served model names a parser that is not registered), or None."""
    from worker.parsers import REASONING_PARSERS, TOOL_PARSERS

    cfg = service().models[case["model"]]
    for kind, name, reg in (("reasoning", cfg.reasoning_parser, REASONING_PARSERS),
                            ("tool", cfg.tool_parser, TOOL_PARSERS)):
        if name and name not in reg:
            return f"{kind} parser {name} not registered"
    return None


def nonstream_cases() -> list[dict]:
    """Cases compare.py checks in non-streaming mode (those with inputs.choices)."""
    return [c for c in corpus() if (c.get("expected_vllm") or {}).get("inputs", {}).get("choices")]


def derender_case(case: dict) -> dict:
    """Run a case's non-streaming body through the service; the parsed JSON answer."""
    body = to_requests.nonstream_body(case)
    res = service().derender(json.dumps(body).encode())
    return json.loads(res.body)


def check_case(case: dict) -> tuple[bool, str]:
    """(matched, reason) of compare.py's non-streaming comparison for this case."""
    ok, _exact, why = compare_mod.compare(case, derender_case(case))
    return ok, why


#: corpus cases with an expected stream and engine inputs (the stream parity set; shared by
#: ``test_stream_parity`` and ``test_stream_pieces``)
STREAM_CASES = [c for c in corpus()
                if (c.get("expected_vllm") or {}).get("inputs", {}).get("choices")
                and (c.get("expected") or {}).get("stream") is not None]
