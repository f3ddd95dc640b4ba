"""Checks of streams answered through Kafka, shared by the Kafka stream test modules: the stream
headers, the non-streaming answer in ``stream_view`` terms (``expected_view``), the joined deltas
of a stream (``joined_view``), and ``assert_complete`` (every seq once, identical duplicates, the
end marker on the last, joined deltas == the non-streaming answer)."""
from __future__ import annotations

import json
from collections import defaultdict

from tests.harness.kafka import headers as _h
from tests.parity_tools.compare import stream_view
from worker.core.service import DerenderService
from worker.transport.records import HDR_STATUS

SEQ, END = "derender-seq", "derender-stream-end"


def expected_view(service: DerenderService, full_body: bytes) -> dict:
    """The non-streaming answer in ``stream_view`` terms (plus the tool call ids)."""
    res = service.derender(full_body)
    assert res.status == 200, res.body
    r = json.loads(res.body)
    ch = r["choices"][0]
    m = ch["message"]
    return {"content": m.get("content") or None, "reasoning": m.get("reasoning") or None,
            "tool_calls": [(t["function"]["name"], t["function"]["arguments"], t["id"]) for t in m.get("tool_calls") or []],
            "finish_reason": ch["finish_reason"],
            "usage": {k: v for k, v in r["usage"].items() if v is not None}}


def joined_view(chunks: list[dict]) -> dict:
    """The joined deltas of a stream (``stream_view``) in ``expected_view`` terms."""
    v = stream_view(chunks)
    assert v["error"] is None, v["error"]
    c = v["choices"]["0"]
    ids = [t["id"] for ck in chunks for cc in ck.get("choices") or []
           for t in (cc.get("delta") or {}).get("tool_calls") or [] if t.get("id")]
    return {"content": c["content"], "reasoning": c["reasoning"],
            "tool_calls": [(t["name"], t["arguments"], i) for t, i in zip(c["tool_calls"], ids, strict=True)],
            "finish_reason": c["finish_reason"], "usage": v["usage"]}


def by_seq(records) -> dict[int, list]:
    out: dict[int, list] = defaultdict(list)
    for r in records:
        out[int(_h(r)[SEQ])].append(r)
    return out


def assert_complete(records, n: int, want: dict, label: str) -> int:
    """Every seq 0..n-1 present, copies identical (value and stream headers), end marker only on
    the last, joined deltas == the non-streaming answer. Returns the number of duplicates."""
    groups = by_seq(records)
    assert sorted(groups) == list(range(n)), f"{label}: seqs {sorted(groups)[:5]}... missing {set(range(n)) - set(groups)}"
    dups = 0
    for seq, recs in groups.items():
        first = recs[0]
        for r in recs[1:]:
            dups += 1
            assert r.value == first.value, f"{label} seq {seq}: non-identical duplicate"
            assert [(k, v) for k, v in r.headers if k in (SEQ, END, HDR_STATUS)] == \
                [(k, v) for k, v in first.headers if k in (SEQ, END, HDR_STATUS)]
        assert _h(first)[HDR_STATUS] == b"200", (label, seq, first.value[:300])
        assert (_h(first).get(END) == b"1") == (seq == n - 1), (label, seq)
    chunks = [c for seq in range(n) for c in json.loads(groups[seq][0].value)]
    assert joined_view(chunks) == want, label
    return dups
