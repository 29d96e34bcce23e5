"""The virtual network: frames between endpoints with per-link delay, jitter, loss, duplication, clogs and cuts.

A frame sent from one endpoint to another is delivered to the receiver attached at the destination after the
link's delay plus a random jitter (jitter is what reorders frames). Per link, a frame may be lost or
duplicated. A *clog* holds every frame on a link (or on every link of an endpoint) until it lifts and then
releases them together; a *cut* drops frames in one direction, so symmetric partitions are two cuts and an
asymmetric partition is one. Cuts are checked when a frame leaves and again when it arrives; clogs when it
arrives. Frames to an endpoint where nothing is attached vanish, like UDP to a dead host.

All randomness comes from the ``rng`` given at construction, in the order frames are sent.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from .loop import EventLoop

Endpoint = tuple[str, int]
Link = tuple[Endpoint, Endpoint]
Receiver = Callable[[bytes], None]


@dataclass(frozen=True, slots=True)
class LinkConfig:
    """How one direction of a link behaves. Probabilities are per frame."""

    delay: float = 0.001  # seconds, always added
    jitter: float = 0.0  # seconds, uniform extra delay in [0, jitter)
    loss: float = 0.0
    duplicate: float = 0.0

    def __post_init__(self) -> None:
        if self.delay < 0 or self.jitter < 0:
            raise ValueError(f"link: delay and jitter cannot be negative (delay={self.delay}, jitter={self.jitter})")
        for name in ("loss", "duplicate"):
            p = getattr(self, name)
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"link: {name} must be a probability in [0, 1], got {p}")

    def with_(self, **changes: float) -> LinkConfig:
        return replace(self, **changes)


class Network:
    """Moves frames between attached receivers on the event loop's virtual clock."""

    def __init__(self, loop: EventLoop, rng: random.Random, default: LinkConfig | None = None) -> None:
        self.loop = loop
        self.rng = rng
        self.default = default or LinkConfig()
        self.links: dict[Link, LinkConfig] = {}
        self.receivers: dict[Endpoint, Receiver] = {}
        self.cuts: set[Link] = set()
        # Clogs: deadline until which frames are held, per link and per endpoint (all links from/to it).
        self.link_clogs: dict[Link, float] = {}
        self.endpoint_clogs: dict[Endpoint, float] = {}
        self.stats: Counter[str] = Counter()

    # -- wiring --------------------------------------------------------------------------------------------
    def attach(self, endpoint: Endpoint, receiver: Receiver) -> None:
        """Frames arriving at ``endpoint`` go to ``receiver`` from now on (replaces any previous one)."""
        self.receivers[endpoint] = receiver

    def detach(self, endpoint: Endpoint) -> None:
        self.receivers.pop(endpoint, None)

    # -- configuration --------------------------------------------------------------------------------------
    def set_link(self, src: Endpoint, dst: Endpoint, config: LinkConfig) -> None:
        self.links[(src, dst)] = config

    def link(self, src: Endpoint, dst: Endpoint) -> LinkConfig:
        return self.links.get((src, dst), self.default)

    def cut(self, src: Endpoint, dst: Endpoint) -> None:
        """Drop frames from ``src`` to ``dst`` (one direction only) until restored."""
        self.cuts.add((src, dst))

    def restore(self, src: Endpoint, dst: Endpoint) -> None:
        self.cuts.discard((src, dst))

    def partition(self, groups: Sequence[Iterable[Endpoint]]) -> None:
        """Cut every link between different groups, both ways (a symmetric partition)."""
        sets = [list(g) for g in groups]
        for i, a in enumerate(sets):
            for j, b in enumerate(sets):
                if i != j:
                    for src in a:
                        for dst in b:
                            self.cuts.add((src, dst))

    def cut_oneway(self, sources: Iterable[Endpoint], destinations: Iterable[Endpoint]) -> None:
        """An asymmetric partition: frames from ``sources`` to ``destinations`` drop; the reverse works."""
        dsts = list(destinations)
        for src in sources:
            for dst in dsts:
                if src != dst:
                    self.cuts.add((src, dst))

    def clog_link(self, src: Endpoint, dst: Endpoint, until: float) -> None:
        """Hold every frame on ``src -> dst`` until ``until``, then release them."""
        key = (src, dst)
        self.link_clogs[key] = max(until, self.link_clogs.get(key, 0.0))

    def clog_endpoint(self, endpoint: Endpoint, until: float) -> None:
        """Hold every frame from or to ``endpoint`` until ``until``."""
        self.endpoint_clogs[endpoint] = max(until, self.endpoint_clogs.get(endpoint, 0.0))

    def heal(self, default: LinkConfig | None = None) -> None:
        """End all faults: no cuts, no clogs, every link back to ``default`` (or the current default)."""
        if default is not None:
            self.default = default
        self.links.clear()
        self.cuts.clear()
        self.link_clogs.clear()
        self.endpoint_clogs.clear()

    # -- traffic ----------------------------------------------------------------------------------------------
    def send(self, src: Endpoint, dst: Endpoint, data: bytes) -> None:
        """Put a frame on the wire from ``src`` to ``dst``."""
        stats = self.stats
        stats["sent"] += 1
        if self.cuts and (src, dst) in self.cuts:
            stats["cut"] += 1
            return
        cfg = self.links.get((src, dst), self.default)
        rng = self.rng
        if cfg.loss and rng.random() < cfg.loss:
            stats["lost"] += 1
            return
        copies = 1
        if cfg.duplicate and rng.random() < cfg.duplicate:
            stats["duplicated"] += 1
            copies = 2
        loop = self.loop
        for _ in range(copies):
            delay = cfg.delay + rng.random() * cfg.jitter if cfg.jitter else cfg.delay
            loop.at(loop.now + delay, self._arrive, src, dst, data)

    def _arrive(self, src: Endpoint, dst: Endpoint, data: bytes) -> None:
        stats = self.stats
        if self.cuts and (src, dst) in self.cuts:
            stats["cut"] += 1
            return
        if self.link_clogs or self.endpoint_clogs:
            now = self.loop.now
            held = max(
                self.link_clogs.get((src, dst), 0.0),
                self.endpoint_clogs.get(src, 0.0),
                self.endpoint_clogs.get(dst, 0.0),
            )
            if held > now:
                # Re-queued at the clog's end; the sequence number keeps held frames in their order.
                stats["held"] += 1
                self.loop.at(held, self._arrive, src, dst, data)
                return
        receiver = self.receivers.get(dst)
        if receiver is None:
            stats["vanished"] += 1
            return
        stats["delivered"] += 1
        receiver(data)
