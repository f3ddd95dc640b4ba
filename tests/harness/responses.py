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

#: streaming cases whose expected delta boundaries differ from ours while the joined events
#: match (``test_stream_events_match_when_deltas_are_joined``): ENGINE TIMING, not a function of
#: the ids (a reference artefact, README "Responses API", parity table). vLLM's
#: ``RequestOutputCollector.put`` (vllm/v1/engine/output_processor.py: "When streaming deltas,
#: RequestOutputs are merged if the producer gets ahead of the consumer": ``self.output.add``)
#: joins engine steps the API server has not consumed yet into one output, so one parser step
#: and one delta. It hits where the server is slowest, at the start of a stream (events
#: created / in_progress / item added / part added are built then). No deterministic rule
#: gives these splits: the Responses API has no ``stop`` (no stop-string hold-back), the tokens
#: are ASCII (the detokenizer's ``DecodeStream`` holds only incomplete UTF-8), there is no
#: reasoning / tool marker in reach, and the same streams split inside words later (mistral
#: `` conver|ts``, `` gl|uc|ose``; qwen3 `` E|iff|el``), so no word-boundary hold-back either;
#: ``stream_interval`` > 1 would merge every N steps all along, not once at the start.
#:
#: - qwen3-plain: tokens 2-3 `` capital``+`` of`` -> `` capital of``;
#: - qwen3-noparser-plain: tokens 2-3 `` is``+`` the`` -> `` is the``;
#: - mistral-7b-v0.3-plain: tokens 2-5 ``os y nt hesis`` -> ``osynthesis``;
#: - llama3-call-incomplete: one delta ``{"city": "Pa"}`` where vLLM's own llama3_json rule
#:   (argshape.py) gives ``{"city": "`` at the last token ``Pa`` and the auto-closed rest
#:   ``Pa"}`` at the close; one delta results only if ``' "'`` and ``Pa`` reached the parser
#:   as one output (prev arguments {} -> nothing sent; the close sends the whole value).
#:
#: The vLLM 0.32 parser rules the other streams show are reproduced (hermes: trailing
#: whitespace held, ``JsonArgs.hold_ws``; qwen3_coder: the parser engine's safe-prefix
#: boundaries, ``XmlArgs.safe_prefix``, and its cut call left as streamed; mistral with
#: ``tool_choice: none``: call markup held and sent at the close, R6:
#: ``worker/core/responses/argshape.py``), so every case passes non-streaming and every other
#: case passes streaming event by event.
DELTA_BOUNDARIES = {"qwen3-plain", "qwen3-noparser-plain", "mistral-7b-v0.3-plain", "llama3-call-incomplete"}
