"""The clients' check of a member's clock against their own (no I/O): client deadlines (``X-Grid-Deadline``)
hold only while the two agree within the client's ``clock_skew`` (docs/grid.md, "Client deadlines")."""

from __future__ import annotations

import logging

import pytest
from groupcluster.grid.client import _Router


def router() -> _Router:
    return _Router(["http://a:1"], retries=1, backoff=0.01, timeout=1.0, avoid=1.0)


def test_a_member_clock_within_the_skew_and_the_round_trip_is_fine(caplog: pytest.LogCaptureFixture) -> None:
    r = router()
    # Read between 100.0 and 100.2 by our clock: anything from 99.1 to 101.1 is within 1 s and the round trip.
    for clock in (100.1, 99.1, 101.1, 99.95):
        r.check_clock("http://a:1", {"clock": clock}, 100.0, 100.2, 1.0)
    # Members without the field (older ones) or with a malformed one are not judged.
    for doc in ({}, {"clock": "soon"}, {"clock": True}, None):
        r.check_clock("http://a:1", doc, 100.0, 100.2, 1.0)
    assert "clock_skew_exceeded" not in r.stats and not caplog.records


def test_a_member_clock_beyond_the_skew_is_counted_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    r = router()
    with caplog.at_level(logging.WARNING, logger="groupcluster.grid.client"):
        r.check_clock("http://a:1", {"clock": 103.5}, 100.0, 100.2, 1.0)
        r.check_clock("http://a:1", {"clock": 103.5}, 100.0, 100.2, 1.0)
        r.check_clock("http://b:1", {"clock": 97.0}, 100.0, 100.2, 1.0)
    assert r.stats["clock_skew_exceeded"] == 3
    texts = [rec.getMessage() for rec in caplog.records]
    assert len(texts) == 2
    assert texts[0].startswith("member http://a:1: its clock is 3.400 s ahead of this client's, more than")
    assert "3.100 s behind" in texts[1]
