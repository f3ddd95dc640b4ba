"""Rolling upgrade and rollback under mixed load (issue 23): a pool of two workers of release A
rolled to release B as the shipped Deployment does it (``ops/k8s/deployment.yaml``: RollingUpdate,
maxSurge 1, maxUnavailable 0, minReadySeconds): start one B worker, wait until its ``/readyz``
has answered 200 for minReadySeconds, SIGTERM one A worker and wait for its exit, start the next
B, wait until it is available, SIGTERM the last A.

``rolling-upgrade``: A = the previous release (``tests/chaos/releases.py``, a detached git
worktree), B = this tree; ``rolling-rollback``: the reverse. The load is the ``redis-stall-*``
producer (``load.mixed_load``): 40 live streams of 1-4 token chunks (one chunk per 0.5 s
per stream, streams of 20+ chunks) over 4 partitions plus non-streaming records at a steady
120/s, from before the first step to after the last one.

Figures (``roll_figures``): records lost (no reply at all), error replies by status (replies
that are not the core's answer), duplicates (byte-identical / differing), replies per second of
the load (all, non-streaming), the seconds with none and the longest pause between non-streaming
replies, the slowest reply (non-streaming and stream chunk: first reply's Kafka timestamp minus
the time it was published), streams lost and streams ended by a 409, each worker's exit status
and its ERROR / traceback lines, the group's rebalances. Asserted (issue 23's "Done when"): 0
lost, 0 streams lost, 0 error replies, no pause of ``MAX_REPLY_GAP_S`` without a non-streaming
reply while load was offered, slowest reply < 5 s, every SIGTERM'd worker exits 0, none exits on
its own, no rollout stalled; then the suite's ledger (every reply the core's bytes).

Expected replies per release (``tests/chaos/replies.py``): a reply is right when it is this
release's answer or the earlier release's (its own code runs the same records uninterrupted),
from the worker of the release whose bytes it carries (partition owners from the workers' logs);
every reply that is not this release's answer is recorded (``detail``: record, seq, API, who
answered, got / expected bytes around the first difference), the first ones in the figures and
all in a JSON file (``detail_file``, ``$CHAOS_DETAIL_DIR``)."""
from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.chaos.harness import (
    CORR,
    END,
    REPO,
    SEQ,
    STATUS,
    Ledger,
    Stream,
    WorkerProc,
    h,
    make_singles,
    make_streams,
    messages_streams,
)
from tests.chaos.load import mixed_load
from tests.chaos.releases import previous_release, previous_serves, release_tree
from tests.chaos.replies import (
    DETAIL_IN_FIGURES,
    Owners,
    clip,
    first_difference,
    kind_of,
    previous_answers,
    save_detail,
)
from tests.chaos.scenarios import Rig, free_port

LIVE_STREAMS = 40
CHUNK_EVERY_S = 0.5
MIN_CHUNKS = 20  # streams of 20+ chunks: each lives 10-25 s, across roll steps
SINGLES_PER_S = 120.0
PRE_S, POST_S, MAX_LOAD_S = 4.0, 4.0, 120.0  # load before the first step / after the last one; cap
READY_TIMEOUT_S = 120.0
SIGTERM_TIMEOUT_S = 25.0  # the Rig's --drain-timeout (10 s) + margin (the Deployment: 30 s / 45 s grace)
QUIET_S, COLLECT_MAX_S = 10.0, 120.0  # after the load: wait until all answered, or no reply for QUIET_S
SLOWEST_LIMIT_S = 5.0
#: "no second without a reply" as a pause bound that does not depend on where a pause falls on the
#: clock. The embedded broker (Tansu 0.6.0) holds every JoinGroup in 1 s sleeps until half the
#: session timeout has passed (at least one: ~1.0 s at --session-timeout-ms 2000 or 1000, 5.0 s
#: at 10000; the client's rebalance_timeout_ms does not change it), and a follower's SyncGroup
#: that arrives before the leader's one more second. Every member revokes before it joins
#: (aiokafka's eager protocol), so each of a roll's four rebalances stops the leader's partitions
#: for >= 1.0 s, the others' for >= 2.0 s, the whole pool for >= 1.0 s (measured: longest gap
#: 1.05-1.25 s) and such a pause empties a calendar second in about half the rolls (figure
#: ``zero_single_reply_seconds``, not asserted; docs/delivery.md)
MAX_REPLY_GAP_S = 2.5


def min_ready_seconds(manifest: Path = REPO / "ops" / "k8s" / "deployment.yaml") -> float:
    """``spec.minReadySeconds`` of the shipped Deployment (0 when absent): how long a new worker
    stays ready before the roll stops the next old one."""
    import yaml
    return float((yaml.safe_load(manifest.read_text())["spec"]).get("minReadySeconds", 0))


#: the Deployment's minReadySeconds, mirrored by every roll step (``RollingPool.hold_ready``)
MIN_READY_S = min_ready_seconds()


def _readyz(port: int) -> int:
    """HTTP status of a worker's ``/readyz`` (0 when its port does not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


class RollingPool:
    """The workers of a roll: each with its release's tree, its health port, and (once stopped)
    its exit status. ``start`` / ``wait_ready`` / ``terminate`` are the Deployment's steps."""

    def __init__(self, rig: Rig, trees: dict[str, Path]):
        self.rig, self.trees = rig, trees
        self.ports: dict[str, int] = {}
        self.release: dict[str, str] = {}
        self.exits: dict[str, int | None] = {}
        self.unbidden: list[str] = []  # workers that exited without being asked

    def start(self, release: str) -> WorkerProc:
        port = free_port()
        w = WorkerProc(f"{self.rig.name}-{release}{sum(r == release for r in self.release.values())}",
                       self.rig.args(metrics_port=port), tree=self.trees[release])
        self.rig.workers.append(w)
        self.ports[w.name], self.release[w.name] = port, release
        return w

    def wait_ready(self, w: WorkerProc) -> float | None:
        """Seconds until ``/readyz`` answers 200; None when the worker exits first (a crash: it
        goes to ``unbidden`` and its status to ``exits``) or is not ready in ``READY_TIMEOUT_S``:
        the rollout stalls there, as the Deployment's would (maxUnavailable 0)."""
        t = time.monotonic()
        while _readyz(self.ports[w.name]) != 200:
            if not w.alive:
                w.drain_output()
                self.unbidden.append(w.name)
                self.exits[w.name] = w.p.returncode
                w.killed = True
                return None
            if time.monotonic() - t > READY_TIMEOUT_S:
                return None
            time.sleep(0.2)
        self.rig.phase(f"{w.name}_ready")
        return round(time.monotonic() - t, 1)

    def hold_ready(self, w: WorkerProc, seconds: float) -> float | None:
        """The Deployment's ``minReadySeconds``: wait until ``/readyz`` has answered 200 for
        ``seconds`` without a break (a break starts the count again); seconds taken, None when
        the worker exits meanwhile (``unbidden``) or ``READY_TIMEOUT_S`` passes."""
        t = since = time.monotonic()
        while time.monotonic() - since < seconds:
            if not w.alive:
                w.drain_output()
                self.unbidden.append(w.name)
                self.exits[w.name] = w.p.returncode
                w.killed = True
                return None
            if time.monotonic() - t > READY_TIMEOUT_S:
                return None
            if _readyz(self.ports[w.name]) != 200:
                since = time.monotonic()
            time.sleep(0.2)
        self.rig.phase(f"{w.name}_available")
        return round(time.monotonic() - t, 1)

    def terminate(self, w: WorkerProc) -> float:
        """SIGTERM and wait for the exit (SIGKILL past ``SIGTERM_TIMEOUT_S``); seconds taken."""
        if not w.alive:
            self.unbidden.append(w.name)
        t = time.monotonic()
        self.exits[w.name] = w.stop(SIGTERM_TIMEOUT_S)
        w.drain_output()
        w.killed = True  # stopped on purpose (Rig.close leaves it)
        self.rig.phase(f"{w.name}_exited")
        return round(time.monotonic() - t, 1)

    def group_events(self, t0: float) -> list[list]:
        """``[s since t0, worker, "revoke" | "assign" | "sigterm"]`` from the workers' logs (arrival
        times): where the group's rebalances fell in the timeline."""
        kinds = (("revoking partitions", "revoke"), ("assigned partitions", "assign"), ("stop requested", "sigterm"))
        out = []
        for w in self.rig.workers:
            for t, x in w.lines:
                for needle, kind in kinds:
                    if needle in x:
                        out.append([round(t - t0, 1), w.name.rsplit("-", 1)[-1], kind])
        return sorted(out)

    def log_errors(self) -> dict[str, list]:
        """Per worker: [number of ERROR / CRITICAL / traceback lines, the first two of them (truncated)]."""
        out = {}
        for w in self.rig.workers:
            lines = w.grep(r" ERROR |Traceback|CRITICAL|Error: ")
            out[w.name] = [len(lines), [x[:240] for x in lines[:2]]]
        return out


def _first(recs: list) -> float:
    return min(r.timestamp for r in recs) / 1000


def roll_figures(records: list, singles: list, streams: list[Stream], sent_at: dict, t0_wall: float,
                 load_s: float, owner: Callable[[bytes, float], tuple[str, str] | None] | None = None
                 ) -> dict[str, Any]:
    """The roll's figures from the collected reply ``records`` (reply topic), the published
    ``singles`` and ``streams`` (chunks published only; their ``alt``: the other release's
    answers, ``tests/chaos/replies.py``), ``sent_at`` ((id, seq or None) -> publish time, s) and
    the load window (``t0_wall`` .. + ``load_s``, s). ``owner(key, t)``: (worker, release label)
    that owned the key's partition at wall time ``t``, None when unknown. ``detail``: one entry
    per reply that is not this release's answer (``_detail``). Pure: no assertion."""
    got: dict[tuple[bytes, int | None], list] = defaultdict(list)
    for r in records:
        hh = h(r)
        c = hh.get(CORR)
        if c is None:
            continue
        seq = hh.get(SEQ)
        try:
            got[(c, int(seq) if seq is not None else None)].append(r)
        except ValueError:
            got[(c, -1)].append(r)
    # key -> (this release's (body, status), the other's or None, the record's body)
    want: dict[tuple[bytes, int | None], tuple[tuple[bytes, int], tuple[bytes, int] | None, bytes]] = {
        (s.id.encode(), None): ((s.want, s.status), s.alt, s.value) for s in singles}
    for st in streams:
        for k in range(len(st.chunks)):
            want[(st.id.encode(), k)] = ((st.want[k], st.status[k]), st.alt[k] if st.alt else None, st.chunks[0])
    lost_singles = lost_chunks = identical = differing = 0
    errors: Counter = Counter()
    examples: dict[str, str] = {}  # status -> the first error reply's message (truncated)
    wrong = other_release = 0
    by_bytes: Counter = Counter()  # whose answer each reply is: current, previous, both, neither
    detail: list[dict] = []
    bad_keys: set = set()
    for key, (cur, alt, body0) in want.items():
        recs = got.get(key, [])
        if not recs:
            lost_singles += key[1] is None
            lost_chunks += key[1] is not None
            bad_keys.add(key)
            continue
        first = (recs[0].value, h(recs[0]).get(STATUS), h(recs[0]).get(END))
        for r in recs[1:]:
            same = (r.value, h(r).get(STATUS), h(r).get(END)) == first
            identical += same
            differing += not same
        t_first = _first(recs)
        for r in recs:
            st_ = h(r).get(STATUS, b"?").decode(errors="replace")
            is_cur = (r.value, st_) == (cur[0], str(cur[1]))
            is_alt = alt is not None and (r.value, st_) == (alt[0], str(alt[1]))
            whose = "both" if is_cur and is_alt else "current" if is_cur else "previous" if is_alt else "neither"
            by_bytes[whose] += 1
            who = owner(key[0], r.timestamp / 1000) if owner is not None else None
            # the first copy only: a redelivered chunk's replay carries the stored reply's bytes
            mismatch = who is not None and whose in ("current", "previous") and who[1] != whose \
                and r.timestamp / 1000 == t_first
            other_release += mismatch
            if whose == "neither":
                bad_keys.add(key)
                if st_.isdigit() and int(st_) >= 400:
                    errors[st_] += 1
                    examples.setdefault(st_, r.value[:200].decode(errors="replace"))
                else:
                    wrong += 1
            if whose in ("previous", "neither") or mismatch:
                detail.append(_detail(key, r, st_, whose, who, cur, alt, body0, t0_wall, mismatch))
    unexpected = sum(len(v) for k, v in got.items() if k not in want)
    streams_lost = sum(1 for st in streams if any((st.id.encode(), k) in bad_keys for k in range(len(st.chunks))))
    ended_409 = sum(1 for st in streams if any(
        h(r).get(STATUS) == b"409" and h(r).get(END) == b"1"
        for k in range(len(st.chunks)) for r in got.get((st.id.encode(), k), [])))
    n_sec = max(1, int(load_s))
    per_s, per_s_singles = [0] * n_sec, [0] * n_sec
    for key, recs in got.items():
        for r in recs:
            k = int(r.timestamp / 1000 - t0_wall)
            if 0 <= k < n_sec:
                per_s[k] += 1
                if key[1] is None:
                    per_s_singles[k] += 1
    single_times = sorted(t for (c, seq), recs in got.items() if seq is None
                          for t in [r.timestamp / 1000 - t0_wall for r in recs] if 0 <= t < load_s)
    gaps = [b - a for a, b in zip([0.0, *single_times], [*single_times, load_s])]
    lat_s = [(_first(got[k]) - sent_at[(k[0].decode(), k[1])], k) for k in want if got.get(k)]
    single_lat = [x for x in lat_s if x[1][1] is None]
    chunk_lat = [x for x in lat_s if x[1][1] is not None]
    slow_single = max(single_lat, default=(0.0, None))
    slow_chunk = max(chunk_lat, default=(0.0, None))
    return {
        "singles": len(singles), "streams": len(streams), "chunks": sum(len(st.chunks) for st in streams),
        "lost": lost_singles + lost_chunks, "lost_singles": lost_singles, "lost_chunks": lost_chunks,
        "error_replies": dict(errors), "error_examples": examples, "wrong_replies": wrong, "unexpected_replies": unexpected,
        "replies_by_bytes": dict(by_bytes), "other_release_bytes": other_release, "detail": detail,
        "duplicates_identical": identical, "duplicates_differing": differing,
        "streams_lost": streams_lost, "streams_ended_409": ended_409,
        "replies_per_s": per_s, "singles_replies_per_s": per_s_singles,
        "zero_reply_seconds": [k for k, n in enumerate(per_s) if n == 0],
        "zero_single_reply_seconds": [k for k, n in enumerate(per_s_singles) if n == 0],
        "longest_single_reply_gap_s": round(max(gaps), 2),
        "slowest_single_s": round(slow_single[0], 2), "slowest_chunk_s": round(slow_chunk[0], 2),
        "slowest_single_at_s": round(sent_at[(slow_single[1][0].decode(), None)] - t0_wall, 1)
        if slow_single[1] else None,
        "singles_over_5s": sum(1 for x, _ in single_lat if x >= SLOWEST_LIMIT_S),
        "chunks_over_5s": sum(1 for x, _ in chunk_lat if x >= SLOWEST_LIMIT_S),
    }


def _detail(key: tuple[bytes, int | None], r, status: str, whose: str, who: tuple[str, str] | None,
            cur: tuple[bytes, int], alt: tuple[bytes, int] | None, body0: bytes, t0_wall: float,
            mismatch: bool) -> dict[str, Any]:
    """One reply that is not this release's answer: the record (id, seq or None, API), when
    (s since the load started), who answered (worker and release, or None: unknown), whose bytes
    it carries (``previous``: the other release's, ``neither``), and got / this release's /
    the other release's bytes from a little before the first difference."""
    at = first_difference(r.value, cur[0])
    return {"id": key[0].decode(errors="replace"), "seq": key[1], "api": kind_of(body0),
            "at_s": round(r.timestamp / 1000 - t0_wall, 2), "status": status,
            "answered_by": list(who) if who else None, "bytes_of": whose, "owner_mismatch": mismatch,
            "diff_at": at, "got": clip(r.value, at), "want": clip(cur[0], at), "want_status": cur[1],
            "want_previous": clip(alt[0], at) if alt else None, "want_previous_status": alt[1] if alt else None}


def _collect(rig: Rig, n_want: int) -> float:
    """Wait until ``n_want`` distinct records were answered, or no reply came for ``QUIET_S``
    (replies that will never come), at most ``COLLECT_MAX_S``; returns the seconds waited."""
    t = last_t = time.monotonic()
    last_n = -1
    while time.monotonic() - t < COLLECT_MAX_S:
        recs = list(rig.collector.records)
        keys = {(h(r).get(CORR), h(r).get(SEQ)) for _, r in recs if r.topic == rig.rep}
        if len(keys) >= n_want:
            break
        if len(recs) != last_n:
            last_n, last_t = len(recs), time.monotonic()
        elif time.monotonic() - last_t > QUIET_S:
            break
        time.sleep(0.5)
    rig.collector.wait(lambda: False, 1.0)  # settle: late duplicates
    return round(time.monotonic() - t, 1)


def rolling(size: str = "reduced", direction: str = "upgrade", release: str | None = None) -> dict[str, Any]:
    """Roll two workers of release A to release B under mixed load (module docstring);
    ``direction``: ``upgrade`` (previous -> this tree) or ``rollback`` (this tree -> previous);
    ``release``: the previous release (full hash; default ``releases.previous_release()``).
    The same load at both sizes. Raises ``AssertionError`` with the figures when an invariant
    breaks, ``releases.NotAGitCheckout`` outside a git checkout."""
    assert direction in ("upgrade", "rollback"), direction
    prev = release or previous_release()
    with release_tree(prev) as old:
        a, b = ("previous", "current") if direction == "upgrade" else ("current", "previous")
        rig = Rig(f"rolling-{direction}" + (f"-{prev[:7]}" if release else ""), persist="none", partitions=4)
        try:
            pool = RollingPool(rig, {"previous": old, "current": REPO})
            olds = [pool.start(a), pool.start(a)]
            for w in olds:
                assert pool.wait_ready(w) is not None, f"{w.name} not ready ({w.p.returncode}):\n{w.text()}"
            rig.wait_ready(olds)
            streams = [st for st in make_streams(400, "rs") if len(st.chunks) >= MIN_CHUNKS]
            if previous_serves(b'{"messages_request": {}}', prev):  # every 4th stream a Messages one
                msgs = [st for st in make_streams(120, "rm", messages_streams()) if len(st.chunks) >= MIN_CHUNKS]
                streams = [st for i, chat in enumerate(streams)
                           for st in ((chat, msgs[i // 3]) if i % 3 == 2 and i // 3 < len(msgs) else (chat,))]
            n = int(SINGLES_PER_S * MAX_LOAD_S)  # (kinds both releases serve: releases.NEW_KIND_FIELDS)
            singles = [s for s in make_singles(2 * n, "rq", small=True) if previous_serves(s.value, prev)][:n]
            marks: dict[str, Any] = {}
            stop = threading.Event()
            load = threading.Thread(target=lambda: asyncio.run(mixed_load(
                rig.bs, rig.inp, streams, singles, live=LIVE_STREAMS, seconds=MAX_LOAD_S,
                singles_per_s=SINGLES_PER_S, chunk_every_s=CHUNK_EVERY_S, marks=marks, stop=stop)), daemon=True)
            load.start()
            rig.phase("load")
            time.sleep(PRE_S)
            steps = []
            for i, w_old in enumerate(olds):  # maxSurge 1, maxUnavailable 0
                w_new = pool.start(b)
                ready_s = pool.wait_ready(w_new)
                held_s = pool.hold_ready(w_new, MIN_READY_S) if ready_s is not None else None
                if held_s is None:  # the rollout stalls: the A workers left keep serving
                    steps.append({"step": i, "started": w_new.name, "ready_s": ready_s, "stalled": True,
                                  "exit": pool.exits.get(w_new.name)})
                    break
                exit_s = pool.terminate(w_old)
                steps.append({"step": i, "started": w_new.name, "ready_s": ready_s, "held_ready_s": held_s,
                              "sigterm": w_old.name, "exit_s": exit_s, "exit": pool.exits[w_old.name]})
            rig.phase("rolled")
            time.sleep(POST_S)
            stop.set()
            load.join(60)
            assert not load.is_alive(), "the load generator did not finish"
            load_s = time.time() - marks["t0_wall"]
            sent = singles[:int(marks["sent_singles"])]
            published = [st.head(n) for st in streams if (n := marks["chunks"].get(st.id, 0))]
            n_want = len(sent) + sum(len(st.chunks) for st in published)
            collect_s = _collect(rig, n_want)
            for w in rig.workers:  # the pool left at the end (a stalled rollout: A workers too)
                if not w.killed:
                    pool.terminate(w)
            records = [r for _, r in rig.collector.records]
            previous_s = previous_answers(old, sent, published)  # (its answers are right too)
            owners = Owners([(w.name, pool.release[w.name], w.lines, w.exit_t) for w in rig.workers], rig.inp,
                            rig.partitions, marks["t0"], marks["t0_wall"])
            figs = rig.figures(release_a=a, release_b=b, previous_release=prev, steps=steps,
                               load_s=round(load_s, 1), collect_s=collect_s, previous_answers_s=previous_s,
                               **roll_figures([r for r in records if r.topic == rig.rep], sent, published,
                                              marks["sent_at"], marks["t0_wall"], load_s, owners.at),
                               dead_letters=sum(1 for r in records if r.topic == rig.dlq),
                               exit_status=pool.exits, exited_unbidden=pool.unbidden,
                               group_events=pool.group_events(marks["t0"]),
                               error_log_lines=pool.log_errors())
            detail = figs.pop("detail")
            figs["detail_file"] = save_detail(rig.name, detail, figs)
            figs["detail"] = detail[:DETAIL_IN_FIGURES]
            _check(figs)
            assert rig.collector.error is None, f"collector failed: {rig.collector.error!r}"
            counts = Ledger(singles=sent, streams=published).check(records, rig.dlq)
            figs["duplicates"] = counts["duplicates"]
            return figs
        finally:
            rig.close()


def _check(figs: dict[str, Any]) -> None:
    """Issue 23's "Done when" on a roll's figures; ``AssertionError`` naming every one broken,
    with the figures."""
    broken = [name for name, ok in (
        ("records lost", figs["lost"] == 0),
        ("streams lost", figs["streams_lost"] == 0),
        ("error replies", not figs["error_replies"] and figs["wrong_replies"] == 0),
        ("replies with the bytes of the release that did not answer", figs.get("other_release_bytes", 0) == 0),
        ("differing duplicates", figs["duplicates_differing"] == 0),
        (f"a pause of {MAX_REPLY_GAP_S:g} s or more without a non-streaming reply",
         figs["longest_single_reply_gap_s"] < MAX_REPLY_GAP_S),
        (f"a reply slower than {SLOWEST_LIMIT_S:g} s",
         max(figs["slowest_single_s"], figs["slowest_chunk_s"]) < SLOWEST_LIMIT_S),
        ("a SIGTERM'd worker's exit status not 0", all(c == 0 for c in figs["exit_status"].values())),
        ("a worker exited on its own", not figs["exited_unbidden"]),
        ("the rollout stalled", not any(st.get("stalled") for st in figs["steps"])),
        ("dead letters", figs["dead_letters"] == 0),
    ) if not ok]
    assert not broken, f"rolling {figs['release_a']} -> {figs['release_b']}: {', '.join(broken)}: " + json.dumps(figs)


#: 638fca1 (stop 27's main, with the Anthropic Messages kinds): an upgrade from it too, its load
#: with Messages records (``releases.NEW_KIND_FIELDS_SINCE``); its chunks may carry 638fca1's bytes
#: where this release changed them on purpose (issue 26's whitespace delta), its answers are right
#: too (``tests/chaos/replies.py``)
R638FCA1 = "638fca13a0d23db739545eea87908847f1729dc6"

ROLLING = {
    "rolling-upgrade": lambda size="reduced": rolling(size, "upgrade"),
    "rolling-rollback": lambda size="reduced": rolling(size, "rollback"),
    "rolling-upgrade-638fca1": lambda size="reduced": rolling(size, "upgrade", R638FCA1),
}
