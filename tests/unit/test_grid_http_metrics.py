"""``GET /metrics`` of the member HTTP API: the Prometheus text rendered for fixed member states is byte for byte
the golden text in tests/unit/golden/ (captured from the renderer the table of metric definitions replaced), so
a change to a metric's name, type, help, labels, value format or order shows as a diff. Also: every family has
one HELP and one TYPE line before its samples, a member with a grid and named caches shows every row of the
table, and the endpoint serves that text."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from groupcluster.grid.http import MemberContext, build_app
from groupcluster.grid.http.metrics import METRICS, render_metrics
from groupcluster.grid.invalidation import InvalidationNode

GOLDEN = Path(__file__).parent / "golden"


class FakeView:
    def __init__(self, members: int, seq: int) -> None:
        self.view_id = SimpleNamespace(seq=seq)
        self.members = list(range(members))

    def __len__(self) -> int:
        return len(self.members)


class FakeChannel:
    def __init__(self, joined: bool, members: int, seq: int) -> None:
        self.joined = joined
        self.view = FakeView(members, seq)
        self.views_installed = 3
        self.sent = 1234
        self.delivered = 5678
        self.leaving = False

    def metrics(self) -> dict[str, int]:
        return {
            "nakack.xmit_sent": 7,
            "unicast.xmit_sent": 2,
            "nakack.xmit_sent_for_others": 4,
            "nakack.xmit_requests": 5,
            "unicast.xmit_requests": 1,
            'odd"name\\x': 9,
            "flush.unblocked": 2,
        }


def fake_node(*, with_store: bool, degraded: bool) -> SimpleNamespace:
    topology = SimpleNamespace(
        topology_id=42,
        rebalancing=True,
        availability=SimpleNamespace(name="DEGRADED" if degraded else "AVAILABLE"),
        current=SimpleNamespace(segments_owned=lambda address: [1, 5, 9] if address == "me" else []),
    )
    metrics: Counter[str] = Counter(
        {
            "grid.xfer_entries_in": 100,
            "grid.xfer_entries_out": 50,
            "grid.xfer_bytes_in": 65536,
            "grid.entries_expired": 3,
            "grid.writes_refused_full": 1,
            "grid.events_arrived": 11,
            "grid.events_written": 12,
            "grid.puts": 77,
        }
    )
    store = _Store(entries=17, nbytes=4096) if with_store else None
    return SimpleNamespace(
        metrics=metrics,
        topology=topology,
        address="me",
        store=store,
        config=SimpleNamespace(max_entries=1000, max_bytes=0),
        tx_in_doubt=lambda: ["tx1", "tx2"],
    )


class _Store:
    def __init__(self, entries: int, nbytes: int) -> None:
        self.entries = entries
        self.nbytes = nbytes

    def __len__(self) -> int:
        return self.entries


def fake_grid(node: Any) -> SimpleNamespace:
    counters: Counter[str] = Counter(
        {
            "ops_get": 10,
            "ops_put": 20,
            "ops_delete": 3,
            "ops_failed": 1,
            "batches": 4,
            "persist_steps": 8,
            "persist_errors": 1,
            "persist_us": 1_500_000,
            "listener_errors": 2,
            "tx_committed": 6,
            "tx_conflicts": 1,
            "tx_expired": 2,
        }
    )
    return SimpleNamespace(node=node, counters=counters, max_peer_clock_ahead=lambda: 0.01234567)


def fake_caches() -> SimpleNamespace:
    inv = InvalidationNode.__new__(InvalidationNode)
    inv.entries = {b"a": (1, "me", b"x"), b"b": (2, "me", b"y")}
    inv.metrics = Counter({"inv.hits": 4, "inv.misses": 1})
    named = {
        "users": SimpleNamespace(node=fake_node(with_store=True, degraded=False), counters=Counter({"ops_get": 5})),
        "sessions": SimpleNamespace(node=inv, counters=Counter({"ops_get_local": 9, "ops_put": 2})),
        "cold": SimpleNamespace(node=None, counters=Counter()),
    }
    modes = {"users": "distributed", "sessions": "invalidation", "cold": "distributed"}
    return SimpleNamespace(
        named=named,
        mode_of=modes.get,
        mismatches={"users": {"10.0.0.2:7800": "invalidation"}},
        counters=Counter({"cache_unknown": 3, "cache_bad_payloads": 1}),
    )


def context(channel: FakeChannel | None, grid: Any = None, caches: Any = None) -> MemberContext:
    return MemberContext(
        cluster="c",
        grid=grid,
        request_leave=lambda: None,
        channel=lambda: channel,  # type: ignore[arg-type,return-value]
        caches=caches,
        http_requests={"put": 4, "get": 9, "deadline_expired": 1},
    )


STATES = {
    "not_joined": lambda: context(None),
    "joined_no_grid": lambda: context(FakeChannel(True, 3, 7)),
    "grid_no_store": lambda: context(FakeChannel(True, 2, 4), fake_grid(fake_node(with_store=False, degraded=True))),
    "grid_with_caches": lambda: context(
        FakeChannel(True, 5, 11), fake_grid(fake_node(with_store=True, degraded=False)), fake_caches()
    ),
}


@pytest.mark.parametrize("state", sorted(STATES))
def test_metrics_text_is_the_golden_text(state: str) -> None:
    expected = (GOLDEN / f"metrics_{state}.txt").read_text()
    assert render_metrics(STATES[state]()) == expected


@pytest.mark.parametrize("state", sorted(STATES))
def test_every_family_has_one_help_and_type_before_its_samples(state: str) -> None:
    seen: list[str] = []
    current = None
    lines = render_metrics(STATES[state]()).splitlines()
    for i, line in enumerate(lines):
        if line.startswith("# HELP "):
            name = line.split()[2]
            assert name not in seen, f"{name} twice"
            assert lines[i + 1].startswith(f"# TYPE {name} "), line
            assert lines[i + 1].split()[3] in ("gauge", "counter")
            seen.append(name)
            current = name
        elif not line.startswith("# TYPE "):
            assert current is not None and line.split("{")[0].split(" ")[0] == current, line
    assert seen[0] == "groupcluster_members" and seen[-1] == "groupcluster_http_requests_total"


def test_a_member_with_a_grid_and_named_caches_renders_every_row_of_the_table_with_its_type_and_help() -> None:
    text = render_metrics(STATES["grid_with_caches"]())
    helps = [line.split(" ", 3)[2:] for line in text.splitlines() if line.startswith("# HELP ")]
    types = [line.split(" ")[2:] for line in text.splitlines() if line.startswith("# TYPE ")]
    assert helps == [[m.name, m.help] for m in METRICS]
    assert types == [[m.name, m.kind] for m in METRICS]
    assert len({m.name for m in METRICS}) == len(METRICS)


def test_the_endpoint_serves_the_rendered_text() -> None:
    ctx = STATES["grid_with_caches"]()

    async def run() -> None:
        async with TestClient(TestServer(build_app(ctx))) as client:
            resp = await client.get("/metrics")
            assert resp.status == 200
            assert resp.headers["Content-Type"] == "text/plain; charset=utf-8"
            assert resp.headers["X-Prometheus-Format"] == "0.0.4"
            # Serving /metrics counts nothing, so the text is what render_metrics gives now.
            assert await resp.text() == render_metrics(ctx)

    asyncio.run(run())
