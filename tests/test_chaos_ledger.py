"""The chaos ledger's contract for a stream whose owner and state are both lost (issue 17, fault 5;
docs/delivery.md "Delivery guarantees"): with ``lost_ok``, a seq may carry exactly the core's 200 (published
by the lost owner, uncommitted) and a 409 ending the stream (the new owner found no state); any
other pair of different copies is still a violation, and so is the pair without ``lost_ok``."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.chaos.harness import CORR, END, SEQ, STATUS, Ledger, Stream

LOST = b'{"error":{"message":"unknown stream \'s\': no state for it; its stream state was lost or expired","type":"ConflictError","param":null,"code":409}}'  # noqa: E501
ENDED = b'{"error":{"message":"stream \'s\' already ended (last derender-seq 2); chunk derender-seq 3 ignored","type":"ConflictError","param":null,"code":409}}'  # noqa: E501


def _rec(seq: int, value: bytes, status: int, end: bool = False):
    headers = [(CORR, b"s"), (SEQ, str(seq).encode()), (STATUS, str(status).encode())]
    if end:
        headers.append((END, b"1"))
    return SimpleNamespace(topic="rep", value=value, headers=headers)


def _stream(n: int = 5) -> Stream:
    return Stream("s", [b"c%d" % i for i in range(n)], [b"w%d" % i for i in range(n)], [200] * n)


def _check(records, lost_ok: bool):
    return Ledger(streams=[_stream()], lost_ok=lost_ok).check(records, "dlq")


def test_a_200_then_the_lost_409_for_the_same_seq_is_the_contract():
    # old owner: 0..2 answered (200); new owner held 2, ended with the lost 409 on it; 3, 4: 409
    recs = [_rec(0, b"w0", 200), _rec(1, b"w1", 200), _rec(2, b"w2", 200), _rec(2, LOST, 409, True),
            _rec(3, ENDED, 409, True), _rec(4, ENDED, 409, True)]
    assert _check(recs, lost_ok=True)["streams_lost_409"] == 1
    with pytest.raises(AssertionError, match="non-identical duplicates"):
        _check(recs, lost_ok=False)


def test_the_old_owner_answered_past_the_lost_409():
    recs = [_rec(0, b"w0", 200), _rec(1, b"w1", 200), _rec(1, LOST, 409, True), _rec(2, b"w2", 200),
            _rec(2, ENDED, 409, True), _rec(3, ENDED, 409, True), _rec(4, ENDED, 409, True)]
    assert _check(recs, lost_ok=True)["streams_lost_409"] == 1


def test_other_differences_stay_violations():
    wrong = [_rec(0, b"w0", 200), _rec(1, b"w1", 200), _rec(1, b"other", 200), _rec(2, LOST, 409, True)]
    with pytest.raises(AssertionError, match="non-identical duplicates"):
        _check(wrong, lost_ok=True)
    no_lost = [_rec(0, b"w0", 200), _rec(1, b"w1", 200), _rec(1, ENDED, 409, True)]  # no lost-state 409
    with pytest.raises(AssertionError, match="non-identical duplicates"):
        _check(no_lost, lost_ok=True)
    bad_after = [_rec(0, b"w0", 200), _rec(1, LOST, 409, True), _rec(2, b"not the core's", 200)]
    with pytest.raises(AssertionError, match="after the lost-state 409 not a 409"):
        _check(bad_after, lost_ok=True)
