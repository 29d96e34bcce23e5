"""Entry events in real member processes (docs/grid.md, "Entry events").

A listener inside a member process is out of a test's reach, so the members run with
``--grid-set count_events=true``: the runtime produces every kind of event with no listener and /metrics counts
them (``groupcluster_grid_entry_events_total{kind=...}``). The counts must equal what the members did: the
joiner's arrivals are the entries it received by state transfer, the old owner's departures the entries it
dropped, and its "written" events one per write it applied as the only owner.
"""

from __future__ import annotations

import re

from groupcluster.grid.client import GridClient

from .grids import Grid, http
from .procs import Members, wait_until


def _metrics(url: str) -> str:
    code, body = http("GET", url + "/metrics")
    assert code == 200
    return body.decode()


def _value(text: str, pattern: str) -> float:
    m = re.search(r"^" + re.escape(pattern) + r" (\S+)$", text, re.M)
    assert m, f"{pattern} missing from /metrics"
    return float(m.group(1))


def test_join_counts_arrivals_on_the_joiner_and_departures_on_the_old_owner(members: Members) -> None:
    grid = Grid(members, 2)
    grid.start(0, "--grid-set", "count_events=true", "--grid-set", "num_owners=1")
    wait_until("a one-member grid", lambda: grid.settled(["m0"]), 60, members)
    with GridClient([grid.urls["m0"]], timeout=30.0, retries=20) as client:
        client.put_many({f"ev-{i}".encode(): b"x" * 20 for i in range(2000)})
        before = _metrics(grid.urls["m0"])
        # Alone: each put applied once here. One owner per segment, so the join moves segments away from m0.
        assert _value(before, 'groupcluster_grid_entry_events_total{kind="written"}') == 2000
        grid.start(1, "--grid-set", "count_events=true", "--grid-set", "num_owners=1")
        wait_until("two members settled", lambda: grid.settled(["m0", "m1"]), 90, members)
        joiner = _metrics(grid.urls["m1"])
        received = _value(joiner, "groupcluster_grid_rebalance_entries_received_total")
        assert received > 0
        assert _value(joiner, 'groupcluster_grid_entry_events_total{kind="arrived"}') == received
        old = _metrics(grid.urls["m0"])
        dropped = _value(old, 'groupcluster_grid_counter{name="grid.entries_dropped"}')
        assert dropped > 0
        assert _value(old, 'groupcluster_grid_entry_events_total{kind="departed"}') == dropped
        assert _value(old, "groupcluster_grid_listener_errors_total") == 0
        # Nothing was lost on the way: every key reads back.
        got = client.get_many([f"ev-{i}".encode() for i in range(2000)])
        assert len(got) == 2000 and set(got.values()) == {b"x" * 20}
