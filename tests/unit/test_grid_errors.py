"""One error hierarchy for the grid's members and its clients (grid/errors.py): the same class under every name
users import it by, and the same class for the same cause whether a member raises it in-process or a client
raises it from the member's HTTP answer."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from groupcluster.grid import client, errors
from groupcluster.grid.client._wire import _Reply, _tx_failure
from groupcluster.grid.driver.outcomes import tx_error_for


@pytest.mark.parametrize(
    "name",
    [
        "GridError",
        "GridUnavailable",
        "GridTxError",
        "GridTxAborted",
        "GridTxConflict",
        "GridTxUnavailable",
        "GridTxTimeout",
    ],
)
def test_the_client_exports_the_same_classes(name: str) -> None:
    assert getattr(client, name) is getattr(errors, name)


def test_two_names_for_one_meaning_are_one_class() -> None:
    assert client.GridClientError is errors.GridError
    assert client.GridUnavailableError is errors.GridUnavailable
    assert client.GridTxUnknownOutcome is errors.GridTxUnknown
    assert issubclass(client.GridBatchError, errors.GridUnavailable)
    assert issubclass(client.GridRequestError, errors.GridError)


@pytest.mark.parametrize(
    ("reason", "status", "cls"),
    [
        ("conflict", 409, errors.GridTxConflict),
        ("lock_timeout", 409, errors.GridTxAborted),
        ("rolled_back", 409, errors.GridTxAborted),
        ("unavailable", 503, errors.GridTxUnavailable),
        ("timeout", 504, errors.GridTxTimeout),
    ],
)
def test_a_member_and_a_client_raise_the_same_class_for_the_same_reason(reason: str, status: int, cls: type) -> None:
    in_process = tx_error_for(SimpleNamespace(reason=reason, error="it failed"), None)  # type: ignore[arg-type]
    answer = _Reply(status, json.dumps({"error": "it failed", "reason": reason, "committed": False}).encode())
    over_http = _tx_failure(answer, "m#1/2")
    assert type(in_process) is type(over_http) is cls
    assert isinstance(over_http, errors.GridTxAborted)


def test_a_transaction_abort_for_unavailability_is_both_kinds_with_every_attribute() -> None:
    err = errors.GridTxUnavailable("transaction t aborted (unavailable): owners missing", "unavailable", "t", 503)
    assert isinstance(err, errors.GridTxAborted) and isinstance(err, errors.GridUnavailable)
    assert (err.reason, err.tx, err.status, err.last_status) == ("unavailable", "t", 503, None)
    assert str(err) == "transaction t aborted (unavailable): owners missing"


def test_a_batch_hands_over_its_results_only_once_every_operation_reported() -> None:
    import asyncio

    from groupcluster.grid.driver.outcomes import BatchWait
    from groupcluster.grid.messages import GET
    from groupcluster.grid.node import OpResult

    loop = asyncio.new_event_loop()
    try:
        wait = BatchWait([7, 8], loop.create_future())
        first = OpResult(7, GET, b"a", True, b"1")
        wait.results[0] = first
        with pytest.raises(RuntimeError, match="1 results missing"):
            wait.complete()
        second = OpResult(8, GET, b"b", True, None)
        wait.results[1] = second
        assert wait.complete() == [first, second]
    finally:
        loop.close()
