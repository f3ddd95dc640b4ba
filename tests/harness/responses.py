"""Responses API parity cases and their pinned pass/fail sets, shared by the Responses test
modules (``tests/test_responses*.py``, ``tests/test_batch_ray.py``)."""
from __future__ import annotations

from pathlib import Path

from tests.parity_tools import responses_to_requests as r2r

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "parity"
CASES_PATH = DATA / "responses_public.jsonl"
MODELS = DATA / "responses_models.json"
CASES = r2r.load_cases(str(CASES_PATH), None)
BY_ID = {c["id"]: c for c in CASES}

#: The 4 streams whose delta boundaries came from engine timing (vLLM's
#: ``RequestOutputCollector.put`` merging engine outputs the server had not consumed yet) are fed
#: the same merged outputs: the reference's ``stream_chunks`` lists them (README "Responses API"),
#: ``responses_to_requests.chunk_sizes`` reads it, so no case is pinned (issue 26 item 6).
