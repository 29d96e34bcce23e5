"""STABLE: find the seqnos every member has delivered, so senders can drop them (seed 002).

Each member periodically (or after ``max_bytes`` of multicast traffic) multicasts its digest of highest
delivered (and highest received) seqnos, tagged with its view id. A receiver folds it into the round's
digest (minimum delivered, maximum received) and removes the sender from ``heard_from``. Once it has heard
from every member it multicasts a STABILITY message after a random stagger (cancelled if another member's
STABILITY arrives first). STABILITY goes down to NAKACK: collect what is stable, and request tails that
others received and we did not (the last-message-dropped fix). A gossip whose members differ from ours
resets the round, so no member acts on a digest the others have not agreed to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from ..core import protocol_ids
from ..core.address import Address
from ..core.config import param
from ..core.digest import Digest
from ..core.errors import WireError
from ..core.events import Event, GetDigest, Stability, ViewChange
from ..core.layer import Layer, register_layer
from ..core.message import NO_FLOW_CONTROL, NO_RELIABILITY, Header, Message, register_header
from ..core.validate import as_int, as_list
from ..core.view import ViewId

GOSSIP: Final = 0
STABILITY: Final = 1


class StableHeader(Header):
    PROTO_ID = protocol_ids.STABLE
    __slots__ = ("digest", "kind", "view_id")

    def __init__(self, kind: int, view_id: ViewId, digest: Digest) -> None:
        self.kind = kind
        self.view_id = view_id
        self.digest = digest

    def to_wire(self) -> list[Any]:
        return [self.kind, self.view_id.to_wire(), self.digest.to_wire()]

    @classmethod
    def from_wire(cls, data: Any) -> StableHeader:
        items = as_list(data, "stable", 3, exact=3)
        kind = as_int(items[0], "stable.kind", 0, 1)
        try:
            return cls(kind, ViewId.from_wire(items[1], "stable.view_id"), Digest.from_wire(items[2], "stable.digest"))
        except WireError:
            raise
        except (TypeError, ValueError) as exc:  # pragma: no cover - validators raise WireError
            raise WireError(f"stable: {exc}") from None


@dataclass(frozen=True)
class StableConfig:
    interval: float = param("1s", "duration", doc="average time between a member's stability gossips")
    max_bytes: int = param("4MiB", "size", doc="also gossip after receiving this many multicast bytes", minimum=1)


class Stable(Layer):
    NAME = "stable"
    PROTO_ID = protocol_ids.STABLE
    Config = StableConfig

    def __init__(self, config: StableConfig, ctx: Any) -> None:
        super().__init__(config, ctx)
        self.view_id: ViewId | None = None
        self.members: tuple[Address, ...] = ()
        self.heard_from: set[Address] = set()
        self.round: Digest | None = None
        self.bytes_since_gossip = 0
        self.stability_pending = False

    def down_event(self, event: Event) -> Any:
        if isinstance(event, ViewChange):
            self.view_id = event.view.view_id
            self.members = event.view.members
            self._reset()
            if not self.ctx.has_timer("gossip"):
                self._schedule_gossip()
        return self.below.down_event(event)

    def _reset(self) -> None:
        self.heard_from = set(self.members)
        self.round = None
        self.stability_pending = False
        self.cancel_timer("stability")

    def _schedule_gossip(self) -> None:
        # Uniform in [0.5, 1.5] x interval: members drift apart instead of gossiping in lockstep.
        self.set_timer("gossip", self.config.interval * (0.5 + self.ctx.rng.random()))

    def up(self, batch: list[Message]) -> None:
        pid = protocol_ids.STABLE
        out = batch
        nbytes = 0
        for i, msg in enumerate(batch):
            hdr: StableHeader | None = msg.headers.get(pid)
            if hdr is None:
                if msg.dest is None:
                    nbytes += len(msg.payload)
                continue
            if out is batch:
                out = batch[:i]
            if hdr.kind == GOSSIP:
                self._on_gossip(msg.sender(), hdr)
            else:
                self._on_stability(hdr)
        if out is not batch:
            out.extend(m for m in batch[len(out) :] if pid not in m.headers)
        if nbytes:
            self.bytes_since_gossip += nbytes
            if self.bytes_since_gossip >= self.config.max_bytes:
                self._gossip()
        if out:
            self.above.up(out)

    def on_timer(self, key: object) -> None:
        if key == "gossip":
            self._gossip()
            self._schedule_gossip()
        elif key == "stability":
            self._send_stability()

    def _gossip(self) -> None:
        self.bytes_since_gossip = 0
        if self.view_id is None:
            return
        digest = self.below.down_event(GetDigest())
        if not isinstance(digest, Digest):
            return
        digest = Digest({m: digest[m] for m in self.members if m in digest})
        hdr = StableHeader(GOSSIP, self.view_id, digest)
        # Multicast reaches us too (loopback), where it is folded in like anyone's.
        self.below.down(Message(None, flags=NO_RELIABILITY | NO_FLOW_CONTROL, headers={protocol_ids.STABLE: hdr}))
        self.count("gossips_sent")

    def _on_gossip(self, sender: Address, hdr: StableHeader) -> None:
        if hdr.view_id != self.view_id or (sender not in self.heard_from and sender not in self.members):
            self.count("gossip_other_view")
            return
        if set(hdr.digest) != set(self.members):
            # Seed 002: a digest over other members must not be combined with ours; start the round again.
            self.count("round_resets")
            self._reset()
            return
        self.round = hdr.digest if self.round is None else self.round.merge_min_delivered_max_received(hdr.digest)
        self.heard_from.discard(sender)
        if not self.heard_from and not self.stability_pending:
            self.stability_pending = True
            self.set_timer("stability", self.config.interval * 0.25 * self.ctx.rng.random())

    def _send_stability(self) -> None:
        if self.round is None or self.view_id is None:
            return
        hdr = StableHeader(STABILITY, self.view_id, self.round)
        self.below.down(Message(None, flags=NO_RELIABILITY | NO_FLOW_CONTROL, headers={protocol_ids.STABLE: hdr}))
        self.count("stability_sent")
        self._reset()

    def _on_stability(self, hdr: StableHeader) -> None:
        if hdr.view_id != self.view_id:
            return
        self.count("stability_received")
        self._reset()
        self.below.down_event(Stability(hdr.view_id, hdr.digest))

    def describe_state(self) -> dict[str, Any]:
        return {"heard_from": sorted(map(str, self.heard_from)), "view_id": str(self.view_id)}


register_header(StableHeader)
register_layer(Stable)
