"""The rolling scenarios' figures and verdict (``tests/chaos/rolling.py``: ``roll_figures``,
``_check``) on hand-made reply records, and the previous release's lookup
(``tests/chaos/releases.py``). The scenarios themselves run in ``tests/test_chaos.py -k rolling``."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.chaos.harness import CORR, END, REPO, SEQ, STATUS, Ledger, Single, Stream
from tests.chaos.releases import (
    EARLIER_RELEASES,
    NEW_KIND_FIELDS_SINCE,
    PREVIOUS_RELEASE,
    NotAGitCheckout,
    previous_serves,
    resolve,
)
from tests.chaos.replies import Owners, partition_of
from tests.chaos.rolling import MIN_READY_S, _check, min_ready_seconds, roll_figures

T0 = 1_000.0
ENDED = b'{"error":{"message":"stored stream state has version 3, expected 6","code":409}}'


def _rec(corr: str, value: bytes, status: int, at: float, seq: int | None = None, end: bool = False):
    headers = [(CORR, corr.encode()), (STATUS, str(status).encode())]
    if seq is not None:
        headers.append((SEQ, str(seq).encode()))
    if end:
        headers.append((END, b"1"))
    return SimpleNamespace(topic="rep", value=value, headers=headers, timestamp=int(at * 1000))


def _world():
    singles = [Single(f"q{i}", b"v", b"a%d" % i, 200) for i in range(4)]
    streams = [Stream("s", [b"c0", b"c1", b"c2"], [b"w0", b"w1", b"w2"], [200, 200, 200])]
    sent = {(f"q{i}", None): T0 + i for i in range(4)} | {("s", k): T0 + k for k in range(3)}
    return singles, streams, sent


def _figs(records, load_s: float = 4.0):
    singles, streams, sent = _world()
    return roll_figures(records, singles, streams, sent, T0, load_s)


def test_a_clean_roll_passes():  # (a 1 s pause: no second without a reply here, but see MAX_REPLY_GAP_S)
    recs = [_rec(f"q{i}", b"a%d" % i, 200, T0 + i + 0.2) for i in range(4)]
    recs += [_rec("s", b"w%d" % k, 200, T0 + k + 0.1, seq=k) for k in range(3)]
    recs.append(_rec("q1", b"a1", 200, T0 + 3.5))  # a redelivery: an identical duplicate
    f = _figs(recs)
    assert (f["lost"], f["streams_lost"], f["error_replies"], f["duplicates_identical"]) == (0, 0, {}, 1)
    assert f["singles_replies_per_s"] == [1, 1, 1, 2] and f["zero_single_reply_seconds"] == []
    assert f["slowest_single_s"] == pytest.approx(0.2, abs=0.01) and f["longest_single_reply_gap_s"] == 1.0
    _check(dict(f, release_a="a", release_b="b", exit_status={"w": 0}, exited_unbidden=[], dead_letters=0,
                  steps=[{"step": 0, "ready_s": 5.0}]))


def test_a_lost_stream_a_stall_and_a_crash_are_each_named():
    recs = [_rec("q0", b"a0", 200, T0 + 0.1), _rec("q1", b"a1", 200, T0 + 1.1),
            _rec("q2", b"a2", 200, T0 + 8.0)]  # q2 waited 6 s; q3 never answered; 2.9 s without a reply
    recs += [_rec("s", b"w0", 200, T0 + 0.1, seq=0), _rec("s", ENDED, 409, T0 + 1.2, seq=1, end=True),
             _rec("s", b"w1", 200, T0 + 1.3, seq=1)]  # seq 2: no reply of its own
    f = _figs(recs)
    assert (f["lost_singles"], f["lost_chunks"], f["streams_lost"], f["streams_ended_409"]) == (1, 1, 1, 1)
    assert f["error_replies"] == {"409": 1} and f["duplicates_differing"] == 1
    assert f["zero_single_reply_seconds"] == [2, 3] and f["slowest_single_s"] == pytest.approx(6.0, abs=0.01)
    assert f["singles_over_5s"] == 1 and f["slowest_single_at_s"] == 2.0 and f["longest_single_reply_gap_s"] == 2.9
    with pytest.raises(AssertionError) as e:
        _check(dict(f, release_a="a", release_b="b", exit_status={"w": 1}, exited_unbidden=["w"], dead_letters=0,
                    steps=[{"step": 0, "ready_s": None, "stalled": True}]))
    for what in ("records lost", "streams lost", "error replies", "differing duplicates",
                 "without a non-streaming reply", "slower than 5 s", "exit status not 0", "on its own",
                 "rollout stalled"):
        assert what in str(e.value)


def test_the_previous_release_is_a_full_hash_and_a_missing_one_fails_clearly():
    assert len(PREVIOUS_RELEASE) == 40 and int(PREVIOUS_RELEASE, 16) >= 0
    try:
        with pytest.raises(AssertionError, match="not in this clone"):
            resolve("0" * 40)
    except NotAGitCheckout as e:
        pytest.skip(str(e))


def test_outside_a_git_checkout_the_roll_is_skipped_with_its_reason(tmp_path, monkeypatch):
    import tests.chaos.releases as releases
    monkeypatch.setattr(releases, "REPO", tmp_path)  # (an unpacked sdist: no .git)
    with pytest.raises(NotAGitCheckout, match="not a git checkout"):
        resolve(PREVIOUS_RELEASE)


def test_the_previous_release_tree_is_checked_out_and_removed():
    import subprocess

    from tests.chaos.releases import release_tree
    try:
        with release_tree(PREVIOUS_RELEASE) as tree:
            assert (tree / "worker" / "cli").exists() or (tree / "worker" / "cli.py").exists()
            head = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True)
            assert head.stdout.strip() == PREVIOUS_RELEASE
    except NotAGitCheckout as e:
        pytest.skip(str(e))
    assert not tree.exists()
    listed = subprocess.run(["git", "-C", str(REPO), "worktree", "list", "--porcelain"], capture_output=True,
                            text=True, check=True).stdout
    assert listed and str(tree) not in listed


def test_the_roll_waits_the_deployments_min_ready_seconds(tmp_path):
    m = tmp_path / "deployment.yaml"
    m.write_text("apiVersion: apps/v1\nkind: Deployment\nspec:\n  replicas: 2\n")
    assert min_ready_seconds(m) == 0.0  # absent: the Deployment's default
    m.write_text("apiVersion: apps/v1\nkind: Deployment\nspec:\n  minReadySeconds: 7\n")
    assert min_ready_seconds(m) == 7.0
    # the shipped one waits: a rebalance ends for every member before the next worker leaves
    assert MIN_READY_S == min_ready_seconds() >= 3


def test_a_rolls_load_leaves_out_only_the_kinds_its_earlier_release_lacks():
    """e8f2be2 has no Anthropic Messages kinds (its roll's load leaves them out); 638fca1 has them
    (its roll's load carries them); every earlier release says which kinds it lacks."""
    e8, r638 = sorted(EARLIER_RELEASES, key=lambda r: not r.startswith("e8f2be2"))
    msg, chat = b'{"messages_request": {}, "stream": true}', b'{"chat_request": {}}'
    assert not previous_serves(msg, e8) and previous_serves(chat, e8)
    assert previous_serves(msg, r638) and previous_serves(chat, r638)
    assert set(NEW_KIND_FIELDS_SINCE) == set(EARLIER_RELEASES) and PREVIOUS_RELEASE in EARLIER_RELEASES


def _world_alt():
    """``_world`` where the other release answers q1 and chunk 1 with other bytes (``alt``)."""
    singles, streams, sent = _world()
    singles[1].alt = (b"A1", 200)
    streams[0].alt = [(b"w0", 200), (b"x1", 200), (b"w2", 200)]
    return singles, streams, sent


def test_the_other_releases_answer_is_right_and_bytes_neither_gives_are_wrong_with_their_detail():
    singles, streams, sent = _world_alt()
    recs = [_rec("q0", b"a0", 200, T0 + 0.2), _rec("q1", b"A1", 200, T0 + 1.2), _rec("q2", b"a2", 200, T0 + 2.2),
            _rec("q3", b"a3", 200, T0 + 3.2)]
    recs += [_rec("s", b"w0", 200, T0 + 0.1, seq=0), _rec("s", b"x1", 200, T0 + 1.1, seq=1),
             _rec("s", b"w2", 200, T0 + 2.1, seq=2)]
    f = roll_figures(recs, singles, streams, sent, T0, 4.0)
    assert (f["wrong_replies"], f["streams_lost"], f["other_release_bytes"]) == (0, 0, 0)
    assert f["replies_by_bytes"] == {"current": 3, "both": 2, "previous": 2}  # (w0, w2: both releases')
    assert [(d["id"], d["seq"], d["bytes_of"], d["answered_by"]) for d in f["detail"]] == [
        ("q1", None, "previous", None), ("s", 1, "previous", None)]
    assert Ledger(singles=singles, streams=streams).check(recs, "dlq")["singles"] == 4
    # bytes that neither release gives: a wrong reply, a lost stream, a failed ledger
    recs[5] = _rec("s", b"y1", 200, T0 + 1.1, seq=1)
    f = roll_figures(recs, singles, streams, sent, T0, 4.0)
    assert (f["wrong_replies"], f["streams_lost"], f["replies_by_bytes"]["neither"]) == (1, 1, 1)
    d = f["detail"][-1]
    assert (d["id"], d["seq"], d["bytes_of"], d["diff_at"], d["got"], d["want"], d["want_previous"]) == \
        ("s", 1, "neither", 0, "y1", "w1", "x1")
    with pytest.raises(AssertionError, match="reply differs"):
        Ledger(singles=singles, streams=streams).check(recs, "dlq")


def test_the_bytes_of_the_release_that_did_not_answer_are_a_defect():
    singles, streams, sent = _world_alt()
    recs = [_rec(f"q{i}", b"A1" if i == 1 else b"a%d" % i, 200, T0 + i + 0.2) for i in range(4)]
    recs += [_rec("s", b"w0", 200, T0 + 0.1, seq=0), _rec("s", b"x1", 200, T0 + 1.1, seq=1),
             _rec("s", b"w2", 200, T0 + 2.1, seq=2)]
    owned = {b"q1": ("w-current0", "current"), b"s": ("w-previous0", "previous")}
    f = roll_figures(recs, singles, streams, sent, T0, 4.0, lambda key, t: owned.get(key))
    assert f["other_release_bytes"] == 1 and f["wrong_replies"] == 0
    assert [(d["id"], d["owner_mismatch"]) for d in f["detail"]] == [("q1", True), ("s", False)]
    with pytest.raises(AssertionError, match="bytes of the release that did not answer"):
        _check(dict(f, release_a="a", release_b="b", exit_status={"w": 0}, exited_unbidden=[], dead_letters=0,
                    steps=[{"step": 0, "ready_s": 5.0}]))


def test_the_owner_of_a_partition_comes_from_the_workers_assignment_lines():
    keys = {partition_of(b"k%d" % i, 4): b"k%d" % i for i in range(64)}
    k0, k1 = keys[0], keys[1]
    line = "2026-12-07 INFO worker.transport.consumer assigned partitions: {}"
    workers = [("w-previous0", "previous", [(10.0, line.format([("in", 0), ("in", 1)]))], 30.0),
               ("w-current0", "current", [(20.0, line.format([("in", 1)])), (20.1, "other line")], None)]
    o = Owners(workers, "in", 4, t0_mono=10.0, t0_wall=T0)  # wall T0 is monotonic 10.0
    assert o.at(k0, T0 + 5) == ("w-previous0", "previous") and o.at(k1, T0 + 5) == ("w-previous0", "previous")
    assert o.at(k1, T0 + 9.5) is None and o.at(k1, T0 + 10.5) is None  # within PAD_S of the move
    assert o.at(k1, T0 + 15) == ("w-current0", "current")
    assert o.at(k0, T0 + 19.5) is None and o.at(k0, T0 - 1) is None  # its owner exits at 30; before any
    assert o.at(keys[2], T0 + 5) is None  # never assigned
