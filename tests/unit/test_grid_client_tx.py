"""The client side of grid transactions without a network: how each answer of the member becomes an exception
(aborted and safe to run again, a conflict, an unknown outcome, a refused request) and the bookkeeping of a
transaction (reads recorded once with their version, own writes read back, the commit body)."""

from __future__ import annotations

import json
from typing import Any

import msgpack
import pytest
from groupcluster.grid.client import (
    GridClientError,
    GridRequestError,
    GridTxAborted,
    GridTxConflict,
    GridTxTimeout,
    GridTxUnavailable,
    GridTxUnknownOutcome,
)
from groupcluster.grid.client._txcore import _TxCore
from groupcluster.grid.client._wire import _Reply, _tx_failure, _tx_path


def reply(status: int, **doc: Any) -> _Reply:
    return _Reply(status, json.dumps(doc).encode())


@pytest.mark.parametrize(
    ("answer", "cls", "reason"),
    [
        (reply(409, error="key changed", reason="conflict", tx="a#1/2", committed=False), GridTxConflict, "conflict"),
        (reply(409, error="lock timeout", reason="lock_timeout", committed=False), GridTxAborted, "lock_timeout"),
        (
            reply(503, error="segment 3 unavailable", reason="unavailable", committed=False),
            GridTxUnavailable,
            "unavailable",
        ),
        (reply(504, error="timed out", committed=False), GridTxTimeout, "timeout"),
        (reply(404, error="no open transaction", tx="a#1/2"), GridTxAborted, "not_found"),
        (reply(500, error="member left", reason="unknown", committed=None), GridTxUnknownOutcome, "unknown"),
    ],
)
def test_answers_map_to_the_right_exception(answer: _Reply, cls: type, reason: str) -> None:
    err = _tx_failure(answer, "a#1/2")
    assert type(err) is cls
    assert err.reason == reason  # type: ignore[attr-defined]
    assert err.status == answer.status  # type: ignore[attr-defined]
    assert err.tx == "a#1/2"  # type: ignore[attr-defined]
    # Only the aborted kinds are safe to re-run (run_transaction re-runs GridTxAborted, conflicts included).
    assert isinstance(err, GridTxAborted) == (cls is not GridTxUnknownOutcome)


def test_bad_requests_and_a_grid_less_member_are_request_errors_not_aborts() -> None:
    err = _tx_failure(reply(400, error="writes: expected a map"), None)
    assert type(err) is GridRequestError and err.status == 400 and "writes" in err.message
    err = _tx_failure(reply(404, error="this member runs no data grid (start it with --grid)"), "t")
    assert type(err) is GridRequestError
    err = _tx_failure(_Reply(500, b"<html>oops</html>"), "t")
    assert type(err) is GridRequestError and err.status == 500


def test_ids_are_percent_encoded_in_paths() -> None:
    assert _tx_path("127.0.0.1:7800#12/3", "commit") == "/v1/tx/127.0.0.1%3A7800%2312%2F3/commit"


def test_bookkeeping_reads_writes_and_body() -> None:
    t = _TxCore("optimistic")
    assert t.lookup(b"a") == (False, None) and t.empty()
    t.read(b"a", b"1", 1 << 40)
    t.read(b"b", None, 0)
    t.write(b"a", b"2")
    t.write(b"c", None)
    assert t.lookup(b"a") == (True, b"2")  # own write first
    assert t.lookup(b"b") == (True, None)  # read as absent, recorded
    doc = msgpack.unpackb(t.body(oneshot=True), raw=False)
    assert doc == {"reads": {b"a": 1 << 40, b"b": 0}, "writes": {b"a": b"2", b"c": None}, "mode": "optimistic"}
    assert "mode" not in msgpack.unpackb(t.body(oneshot=False), raw=False)
    with pytest.raises(ValueError, match="optimistic transaction locks nothing ahead"):
        t.to_lock([b"a"])
    with pytest.raises(TypeError, match=r"value of b'x': expected bytes, got str"):
        t.write(b"x", "text")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="key: expected bytes"):
        t.write("x", b"v")  # type: ignore[arg-type]


def test_pessimistic_locks_each_key_once_and_states_are_final() -> None:
    t = _TxCore("pessimistic")
    assert t.to_lock([b"a", b"b", b"a"]) == [b"a", b"b"]
    t.locked.update([b"a", b"b"])
    assert t.to_lock([b"b", b"c"]) == [b"c"]
    t.state = "committed"
    with pytest.raises(GridClientError, match="the transaction is committed: start a new one"):
        t.check_active()
    with pytest.raises(ValueError, match="mode: expected 'optimistic' or 'pessimistic', got 'eager'"):
        _TxCore("eager")


def test_rollback_is_due_after_a_failed_lock_but_never_after_a_commit_was_sent() -> None:
    t = _TxCore("pessimistic")
    assert t.needs_rollback()
    t.state = "failed"  # a lock request failed: the member may still hold the locks it granted
    assert t.needs_rollback()
    t.commit_sent = True  # the commit's outcome stands, whatever it was
    assert not t.needs_rollback()
    t = _TxCore("optimistic")
    t.state = "committed"
    assert not t.needs_rollback()
