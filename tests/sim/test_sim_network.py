"""The virtual network and clock: delay, jitter, loss, duplication, clogs and cuts behave as configured."""

from __future__ import annotations

import random

import pytest
from groupcluster.sim.loop import EventLoop
from groupcluster.sim.network import LinkConfig, Network

A, B, C = ("10.0.0.1", 7800), ("10.0.0.2", 7800), ("10.0.0.3", 7800)


class Inbox:
    def __init__(self, loop: EventLoop) -> None:
        self.loop = loop
        self.got: list[tuple[float, bytes]] = []

    def __call__(self, data: bytes) -> None:
        self.got.append((self.loop.now, data))

    @property
    def data(self) -> list[bytes]:
        return [d for _, d in self.got]


def make(default: LinkConfig | None = None, seed: int = 1) -> tuple[EventLoop, Network, dict[tuple[str, int], Inbox]]:
    loop = EventLoop()
    net = Network(loop, random.Random(seed), default)
    boxes = {ep: Inbox(loop) for ep in (A, B, C)}
    for ep, box in boxes.items():
        net.attach(ep, box)
    return loop, net, boxes


def send_many(net: Network, n: int, src=A, dst=B) -> None:  # type: ignore[no-untyped-def]
    for i in range(n):
        net.send(src, dst, str(i).encode())


def test_loop_runs_in_time_order_and_jumps() -> None:
    loop = EventLoop()
    seen: list[tuple[float, str]] = []
    loop.at(5.0, lambda: seen.append((loop.now, "b")))
    loop.at(1.0, lambda: seen.append((loop.now, "a")))
    loop.at(5.0, lambda: seen.append((loop.now, "c")))  # same time: scheduling order
    loop.run_until(3.0)
    assert seen == [(1.0, "a")] and loop.now == 3.0
    loop.run_until(100.0)
    assert seen == [(1.0, "a"), (5.0, "b"), (5.0, "c")] and loop.now == 100.0
    assert loop.processed == 3


def test_loop_never_schedules_into_the_past_and_stops_early() -> None:
    loop = EventLoop()
    loop.run_until(10.0)
    hits: list[float] = []
    loop.at(2.0, lambda: hits.append(loop.now))
    loop.at(11.0, lambda: hits.append(loop.now))
    loop.at(12.0, lambda: hits.append(loop.now))
    loop.run_until(50.0, stop=lambda: len(hits) >= 2)
    assert hits == [10.0, 11.0] and loop.now == 11.0


def test_delay_without_jitter_keeps_order() -> None:
    loop, net, boxes = make(LinkConfig(delay=0.01))
    send_many(net, 50)
    loop.run_until(1.0)
    assert boxes[B].data == [str(i).encode() for i in range(50)]
    assert all(t == pytest.approx(0.01) for t, _ in boxes[B].got)


def test_jitter_reorders_within_bounds() -> None:
    loop, net, boxes = make(LinkConfig(delay=0.01, jitter=0.05))
    send_many(net, 200)
    loop.run_until(1.0)
    got = boxes[B].data
    assert sorted(got) == sorted(str(i).encode() for i in range(200))
    assert got != [str(i).encode() for i in range(200)]
    assert all(0.01 <= t < 0.06 for t, _ in boxes[B].got)


def test_loss_drops_about_the_configured_share() -> None:
    loop, net, boxes = make(LinkConfig(loss=0.3))
    send_many(net, 4000)
    loop.run_until(1.0)
    lost = 4000 - len(boxes[B].got)
    assert 1000 < lost < 1400
    assert net.stats["lost"] == lost


def test_per_link_settings_override_the_default() -> None:
    loop, net, boxes = make(LinkConfig())
    net.set_link(A, B, LinkConfig(loss=1.0))
    send_many(net, 20, A, B)
    send_many(net, 20, A, C)
    loop.run_until(1.0)
    assert boxes[B].got == [] and len(boxes[C].got) == 20


def test_duplication_delivers_copies() -> None:
    loop, net, boxes = make(LinkConfig(duplicate=0.5))
    send_many(net, 2000)
    loop.run_until(1.0)
    extra = len(boxes[B].got) - 2000
    assert 850 < extra < 1150 and extra == net.stats["duplicated"]


def test_asymmetric_cut_drops_one_direction_only() -> None:
    loop, net, boxes = make()
    net.cut_oneway([A], [B])
    net.send(A, B, b"a->b")
    net.send(B, A, b"b->a")
    loop.run_until(1.0)
    assert boxes[B].data == [] and boxes[A].data == [b"b->a"]
    net.restore(A, B)
    net.send(A, B, b"again")
    loop.run_until(2.0)
    assert boxes[B].data == [b"again"]


def test_symmetric_partition_and_heal() -> None:
    loop, net, boxes = make()
    net.partition([[A], [B, C]])
    for src, dst in ((A, B), (B, A), (A, C), (C, A), (B, C), (C, B)):
        net.send(src, dst, f"{src[0]}>{dst[0]}".encode())
    loop.run_until(1.0)
    assert boxes[A].data == [] and boxes[B].data == [b"10.0.0.3>10.0.0.2"]
    net.heal()
    net.send(A, B, b"healed")
    loop.run_until(2.0)
    assert boxes[B].data[-1] == b"healed"


def test_a_cut_made_while_a_frame_is_in_flight_drops_it() -> None:
    loop, net, boxes = make(LinkConfig(delay=0.5))
    net.send(A, B, b"x")
    loop.run_until(0.1)
    net.cut(A, B)
    loop.run_until(1.0)
    assert boxes[B].got == [] and net.stats["cut"] == 1


def test_clogged_link_holds_then_releases_in_order() -> None:
    loop, net, boxes = make(LinkConfig(delay=0.001))
    net.clog_link(A, B, until=2.0)
    send_many(net, 5)
    net.send(A, C, b"other link")
    loop.run_until(1.9)
    assert boxes[B].got == [] and boxes[C].data == [b"other link"]
    loop.run_until(3.0)
    assert [(t, d) for t, d in boxes[B].got] == [(2.0, str(i).encode()) for i in range(5)]


def test_clogged_endpoint_holds_both_directions() -> None:
    loop, net, boxes = make(LinkConfig(delay=0.001))
    net.clog_endpoint(B, until=1.0)
    net.send(A, B, b"in")
    net.send(B, C, b"out")
    net.send(A, C, b"bypass")
    loop.run_until(0.5)
    assert boxes[B].got == [] and boxes[C].data == [b"bypass"]
    loop.run_until(1.5)
    assert boxes[B].data == [b"in"] and boxes[C].data == [b"bypass", b"out"]


def test_frames_to_an_endpoint_without_a_member_vanish() -> None:
    loop, net, boxes = make()
    net.detach(B)
    net.send(A, B, b"x")
    loop.run_until(1.0)
    assert boxes[B].got == [] and net.stats["vanished"] == 1


def test_same_seed_same_fate() -> None:
    def fate(seed: int) -> list[tuple[float, bytes]]:
        loop, net, boxes = make(LinkConfig(delay=0.001, jitter=0.01, loss=0.2, duplicate=0.1), seed)
        send_many(net, 300)
        loop.run_until(1.0)
        return boxes[B].got

    assert fate(7) == fate(7)
    assert fate(7) != fate(8)


def test_link_config_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="loss must be a probability"):
        LinkConfig(loss=1.5)
    with pytest.raises(ValueError, match="cannot be negative"):
        LinkConfig(delay=-1)
