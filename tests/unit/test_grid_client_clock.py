"""Clock checks (no I/O): a client's of a member's clock against its own, and the members' of each other's.
Client deadlines (``X-Grid-Deadline``) hold only while the clocks agree within the client's ``clock_skew``
(docs/grid.md, "Client deadlines")."""

from __future__ import annotations

import asyncio
import logging
import re
import time

import msgpack
import pytest
from groupcluster.core.address import Address
from groupcluster.grid.client._routing import _Router
from groupcluster.grid.driver.grid_runtime import GridRuntime
from groupcluster.grid.driver.runtime_base import TAG_INFO


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


def test_members_compare_their_clocks_through_their_member_info(caplog: pytest.LogCaptureFixture) -> None:
    """GridRuntime reads ``clock`` from each member-info announcement: a peer ahead of ours by more than
    CLOCK_AHEAD_WARNING is counted and logged once, the gauge shows the most-ahead peer, a view prunes the
    departed, and a malformed clock drops the announcement (counted as bad_info)."""

    async def run() -> None:
        rt = GridRuntime()
        near, far, bad = (Address(f"10.0.0.{i}", 7800, i) for i in (2, 3, 4))
        with caplog.at_level(logging.WARNING, logger="groupcluster.grid.runtime"):
            rt._on_info(near, info({"http": "http://10.0.0.2:8080", "clock": time.time() + 0.2}))
            assert rt.max_peer_clock_ahead() == pytest.approx(0.2, abs=0.1)
            assert not rt.counters["peer_clock_ahead_warnings"] and not caplog.records
            for _ in range(2):
                rt._on_info(far, info({"clock": time.time() + 5.0}))
            assert rt.max_peer_clock_ahead() == pytest.approx(5.0, abs=0.1)
            assert rt.counters["peer_clock_ahead_warnings"] == 2
            assert len(caplog.records) == 1
            expected = rf"member {re.escape(str(far))}: its clock is at least (4\.9|5\.0)\d* s ahead of ours"
            assert re.match(expected, text(caplog))
            for clock in ("soon", float("nan"), -1.0, True):
                rt._on_info(bad, info({"clock": clock}))
            assert rt.counters["bad_info"] == 4 and bad not in rt.peer_clock_ahead
            assert rt.endpoints[near] == "http://10.0.0.2:8080"
        rt.peer_clock_ahead = {a: v for a, v in rt.peer_clock_ahead.items() if a == near}  # as a view without far
        assert rt.max_peer_clock_ahead() < 1.0
        rt._on_info(near, info({"clock": time.time() - 30.0}))  # behind: that shows on its side, not here
        assert rt.max_peer_clock_ahead() == 0.0
        rt.close()

    asyncio.run(run())


def info(doc: dict[str, object]) -> bytes:
    return bytes([TAG_INFO]) + msgpack.packb(doc)


def text(caplog: pytest.LogCaptureFixture) -> str:
    return caplog.records[0].getMessage()
