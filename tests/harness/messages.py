"""Anthropic Messages API parity cases, shared by the Messages test modules
(``tests/test_messages*.py``)."""
from __future__ import annotations

from pathlib import Path

from tests.parity_tools import messages_to_requests as m2r

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "parity"
CASES_PATH = DATA / "messages_public.jsonl"
#: the Messages reference's 5 served configs are the Responses reference's (README: "the same 5
#: served configs"), calls streamed incrementally
MODELS = DATA / "responses_models.json"
CASES = m2r.load_cases(str(CASES_PATH), None)
BY_ID = {c["id"]: c for c in CASES}

#: the golden Messages stream state (issue 26, format version 1): the case, the chunk after which
#: the state was taken, the files (``tests/data/messages_state/``); regenerate only on a format
#: change (with a new version and a reader for the old one): ``python -m tests.harness.messages``
GOLDEN_CASE = "qwen3-tool-use-parallel"
GOLDEN_AT = 20
GOLDEN_DIR = ROOT / "tests" / "data" / "messages_state"


def golden_bytes(service) -> tuple[bytes, bytes]:
    """(state, piece log) after ``GOLDEN_AT`` + 1 chunks of ``GOLDEN_CASE``'s stream."""
    import msgspec

    from worker.core.responses import memory_reader
    state, log = None, bytearray()
    for b in m2r.stream_bodies(BY_ID[GOLDEN_CASE])[:GOLDEN_AT + 1]:
        res = service.derender_messages_stream(msgspec.json.encode(b), state, memory_reader(log))
        assert res.status == 200, res.body
        state, log = res.state, log + res.log_append
    return state, bytes(log)


if __name__ == "__main__":
    from worker.config import load_config_file
    from worker.core.service import DerenderService
    st, lg = golden_bytes(DerenderService(load_config_file(str(MODELS))))
    GOLDEN_DIR.mkdir(parents=True, exist_ok=True)
    (GOLDEN_DIR / "v1.state").write_bytes(st)
    (GOLDEN_DIR / "v1.pieces").write_bytes(lg)
    print(f"{len(st)} + {len(lg)} bytes written to {GOLDEN_DIR}")
