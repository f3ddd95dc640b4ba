"""Expected replies per release in a rolling scenario, and the detail of every reply that is not
this release's answer (issue 23 item 3; ``tests/chaos/rolling.py``).

While a pool runs two releases, a record may be answered by either. A reply is right when it is
this release's answer (the in-process core, ``harness.make_singles`` / ``make_streams``) or the
earlier release's: its own code, from the worktree the roll already made, runs the same records
uninterrupted (``tests/harness/prev_continue.py``; ``previous_answers``). A chunk whose stream
state the other release wrote is right by the same two answers: ``tests/test_state_golden.py``
defines a continued stream's replies as the continuing release's uninterrupted ones. Bytes
neither release gives stay a wrong reply.

Which release answered: the worker that owned the record's input partition when the reply was
published (``Owners``: the ``assigned partitions`` lines of the workers' logs; the producer's
partitioner maps the key), unknown within ``PAD_S`` of an ownership change. A reply that is only
the other release's bytes from a known owner is a defect too (``other_release_bytes``)."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

from tests.chaos.harness import CREATED_S, REPO, Single, Stream

PREV_CONTINUE = REPO / "tests" / "harness" / "prev_continue.py"
MODELS_JSON = REPO / "tests" / "chaos" / "models.json"
PAD_S = 1.0  # a reply this close to an ownership change of its partition: owner unknown
CLIP = 160  # bytes of a differing reply kept around its first difference
DETAIL_IN_FIGURES = 20  # detail entries in the figures line (the file has all)


def previous_answers(tree: Path, singles: list[Single], streams: list[Stream]) -> float:
    """Set ``alt`` of every single and stream to the answers of the release checked out at
    ``tree`` (its own code, uninterrupted runs of the same bodies); seconds taken. Raises
    ``AssertionError`` with that release's stderr when its run fails."""
    t = time.monotonic()
    values = sorted({s.value for s in singles})
    jobs: list[dict[str, Any]] = [{"name": f"single-{i}", "single": v, "created": CREATED_S}
                                  for i, v in enumerate(values)]
    jobs += [{"name": st.id, "chunks": st.chunks, "start": 0, "kind": None, "created": CREATED_S,
              "model": json.loads(st.chunks[0]).get("model", ""), "checkpoint": None, "settings": None,
              "pieces": None} for st in streams]
    with tempfile.TemporaryDirectory(prefix="chaos-prev-answers-") as d:
        src, dst = Path(d) / "in", Path(d) / "out"
        src.write_bytes(msgspec.msgpack.encode(jobs))
        r = subprocess.run(["nice", "-n", "5", sys.executable, "-P", str(PREV_CONTINUE), str(src), str(dst),
                            str(MODELS_JSON)], cwd=tree, env=dict(os.environ, PYTHONPATH=str(tree)),
                           capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, f"the earlier release's answers ({tree}): {r.stderr[-4000:]}"
        got = msgspec.msgpack.decode(dst.read_bytes())
    by_value = {v: got[f"single-{i}"] for i, v in enumerate(values)}
    for s in singles:
        a = by_value[s.value]
        s.alt = (a["bodies"][0], a["statuses"][0])
    for st in streams:
        a = got[st.id]
        st.alt = list(zip(a["bodies"], a["statuses"]))[:len(st.chunks)]
        assert len(st.alt) == len(st.chunks), (st.id, len(st.alt), len(st.chunks))
    return round(time.monotonic() - t, 1)


def partition_of(key: bytes, partitions: int) -> int:
    """The input partition of a record key, as the load's producer picks it (aiokafka's default
    partitioner: murmur2 of the key)."""
    from aiokafka.partitioner import murmur2
    return (murmur2(key) & 0x7FFFFFFF) % partitions


class Owners:
    """Who owned each input partition when: ``workers`` = ``(name, release label, log lines as
    (monotonic s, text), monotonic exit time or None)``; ``t0_mono`` / ``t0_wall``: one instant on
    both clocks (to place replies' Kafka timestamps)."""

    def __init__(self, workers: list[tuple[str, str, list, float | None]], topic: str, partitions: int,
                 t0_mono: float, t0_wall: float):
        self.partitions, self.off = partitions, t0_mono - t0_wall
        self.release = {name: rel for name, rel, _, _ in workers}
        self.exit = {name: ex for name, _, _, ex in workers}
        self.events: dict[int, list[tuple[float, str]]] = {p: [] for p in range(partitions)}
        for name, _, lines, _ in workers:
            for t, x in lines:
                if "assigned partitions: " not in x:
                    continue
                try:
                    tps = ast.literal_eval(x.split("assigned partitions: ", 1)[1].strip())
                except (ValueError, SyntaxError):
                    continue
                for tp_topic, p in tps:
                    if tp_topic == topic and p in self.events:
                        self.events[p].append((t, name))
        for ev in self.events.values():
            ev.sort()

    def at(self, key: bytes, t_wall: float) -> tuple[str, str] | None:
        """(worker, release label) that owned ``key``'s partition at wall time ``t_wall``; None
        when unknown (no assignment yet, within ``PAD_S`` of a change of owner, owner gone)."""
        t = t_wall + self.off
        ev = self.events[partition_of(key, self.partitions)]
        before = [w for ta, w in ev if ta <= t]
        earlier = [w for ta, w in ev if ta <= t - PAD_S]
        if not earlier:
            return None
        name = before[-1]
        near = {w for ta, w in ev if abs(ta - t) < PAD_S} | {name, earlier[-1]}
        ex = self.exit[name]
        if len(near) > 1 or (ex is not None and ex < t + PAD_S):
            return None
        return name, self.release[name]


def kind_of(chunk: bytes) -> str:
    """The API of a record body: ``messages``, ``responses``, ``chat`` or ``completion``."""
    try:
        body = json.loads(chunk)
    except ValueError:
        return "?"
    for k in ("messages", "responses", "chat"):
        if isinstance(body, dict) and f"{k}_request" in body:
            return k
    return "completion"


def clip(value: bytes | None, at: int) -> str | None:
    """``CLIP`` bytes of ``value`` from a little before offset ``at`` (its first difference)."""
    if value is None:
        return None
    a = max(0, at - CLIP // 4)
    return ("..." if a else "") + value[a:a + CLIP].decode(errors="replace") + ("..." if a + CLIP < len(value) else "")


def first_difference(a: bytes, b: bytes | None) -> int:
    """Offset of the first byte where ``a`` and ``b`` differ (their common length when one is a
    prefix of the other)."""
    if b is None:
        return 0
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def save_detail(scenario: str, detail: list[dict], figures: dict) -> str:
    """Write ``{figures, detail}`` to ``$CHAOS_DETAIL_DIR`` (default ``<tmp>/chaos-detail``) as
    ``<scenario>-<unix s>.json``; returns the path."""
    d = Path(os.environ.get("CHAOS_DETAIL_DIR") or Path(tempfile.gettempdir()) / "chaos-detail")
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{scenario}-{int(time.time())}.json"
    path.write_text(json.dumps({"figures": figures, "detail": detail}, indent=1))
    return str(path)
