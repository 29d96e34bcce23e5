"""UNICAST: reliable FIFO unicast between two members, by seqnos per connection and cumulative acks.

A connection is (sender, receiver, conn_id); the sender numbers its connections upwards, and a receiver never
goes back to an older connection, so a stale retransmission from a closed connection cannot reset a live one
(which would redeliver or skip messages). Every data message also carries the lowest seqno the sender still
holds unacknowledged, so a receiver without state for the connection knows where to start without an extra
round trip. Acks are cumulative and sent once per step per peer; unacknowledged messages are resent every
``xmit_interval``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from itertools import islice
from typing import Any

from ..core import protocol_ids
from ..core.address import Address
from ..core.config import param
from ..core.errors import WireError
from ..core.events import Event, ViewChange
from ..core.layer import Layer, register_layer
from ..core.message import NO_FLOW_CONTROL, NO_RELIABILITY, Header, Message, register_header
from ..core.validate import as_int, as_list

DATA, ACK = 0, 1
_CONN_MAX = 2**31 - 1
_MAX_RECV_CONNS = 4096  # receive-side state kept for peers outside the view


class UnicastHeader(Header):
    """DATA(conn_id, seqno, low) | ACK(conn_id, seqno)."""

    PROTO_ID = protocol_ids.UNICAST
    __slots__ = ("conn_id", "kind", "low", "seqno")

    def __init__(self, kind: int, conn_id: int, seqno: int, low: int = 0) -> None:
        self.kind = kind
        self.conn_id = conn_id
        self.seqno = seqno
        self.low = low

    def to_wire(self) -> list[Any]:
        if self.kind == DATA:
            return [DATA, self.conn_id, self.seqno, self.low]
        return [ACK, self.conn_id, self.seqno]

    @classmethod
    def from_wire(cls, data: Any) -> UnicastHeader:
        items = as_list(data, "unicast", 4)
        kind = as_int(items[0] if items else None, "unicast.kind", 0, 1)
        if kind == DATA:
            if len(items) != 4:
                raise WireError("unicast: DATA needs 4 fields")
            seqno = as_int(items[2], "unicast.seqno", 1)
            return cls(
                DATA,
                as_int(items[1], "unicast.conn_id", 0, _CONN_MAX),
                seqno,
                as_int(items[3], "unicast.low", 1, seqno),
            )
        if len(items) != 3:
            raise WireError("unicast: ACK needs 3 fields")
        return cls(ACK, as_int(items[1], "unicast.conn_id", 0, _CONN_MAX), as_int(items[2], "unicast.seqno"))


register_header(UnicastHeader)


class _SendConn:
    __slots__ = ("conn_id", "created", "last_ack", "next_seqno", "unacked")

    def __init__(self, conn_id: int, now: float) -> None:
        self.conn_id = conn_id
        self.next_seqno = 1
        # Sent and not acknowledged, oldest first: seqnos low .. next_seqno-1 (see low). Acks remove from the
        # front only, so a deque does; a dict emptied from its front rescans its deleted slots on every
        # next(iter()), which down() needs per message: quadratic in what is in flight.
        self.unacked: deque[Message] = deque()
        self.created = now
        self.last_ack = now

    @property
    def low(self) -> int:
        """The lowest unacknowledged seqno (``next_seqno`` when nothing is in flight)."""
        return self.next_seqno - len(self.unacked)


class _RecvConn:
    __slots__ = ("buffer", "buffered_bytes", "conn_id", "delivered")

    def __init__(self, conn_id: int, delivered: int) -> None:
        self.conn_id = conn_id
        self.delivered = delivered
        self.buffer: dict[int, Message] = {}
        self.buffered_bytes = 0  # payload bytes in ``buffer`` (reset whenever it empties)


@dataclass(frozen=True)
class UnicastConfig:
    xmit_interval: float = param("200ms", "duration", doc="resend unacknowledged messages this often")
    max_xmit_per_interval: int = param(4096, "int", doc="most messages resent to one peer per interval", minimum=1)
    give_up_after: float = param(
        "60s", "duration", doc="drop a connection to a non-member that acknowledged nothing for this long"
    )
    max_buffered: int = param(
        100_000, "int", doc="most out-of-order messages kept per connection; beyond, dropped (resent later)", minimum=16
    )
    max_buffered_bytes: int = param(
        "64MiB", "size", doc="most payload bytes of out-of-order messages kept per connection", minimum=1
    )


class Unicast(Layer):
    NAME = "unicast"
    PROTO_ID = protocol_ids.UNICAST
    Config = UnicastConfig

    def __init__(self, config: UnicastConfig, ctx: Any) -> None:
        super().__init__(config, ctx)
        self.send_conns: dict[Address, _SendConn] = {}
        self.recv_conns: dict[Address, _RecvConn] = {}
        self.ack_due: set[Address] = set()
        self.members: frozenset[Address] = frozenset()
        self.next_conn_id = 1

    def start(self) -> None:
        self.set_timer("xmit", self.config.xmit_interval)

    def down(self, msg: Message) -> None:
        dest = msg.dest
        if dest is None or msg.flags & NO_RELIABILITY:
            self.below.down(msg)
            return
        conn = self.send_conns.get(dest)
        if conn is None:
            conn = self.send_conns[dest] = _SendConn(self.next_conn_id, self.now)
            self.next_conn_id += 1
        seqno = conn.next_seqno
        msg.headers[protocol_ids.UNICAST] = UnicastHeader(DATA, conn.conn_id, seqno, seqno - len(conn.unacked))
        conn.next_seqno = seqno + 1
        conn.unacked.append(msg)
        self.below.down(msg)

    def up(self, batch: list[Message]) -> None:
        out: list[Message] = []
        pid = protocol_ids.UNICAST
        for msg in batch:
            hdr: UnicastHeader | None = msg.headers.get(pid)
            if hdr is None:
                out.append(msg)
                continue
            src = msg.src
            assert src is not None
            if hdr.kind == ACK:
                self._on_ack(src, hdr)
                continue
            conn = self.recv_conns.get(src)
            if conn is None or hdr.conn_id > conn.conn_id:
                if conn is None and len(self.recv_conns) >= _MAX_RECV_CONNS:
                    self._evict_recv_conn()
                conn = self.recv_conns[src] = _RecvConn(hdr.conn_id, hdr.low - 1)
            elif hdr.conn_id < conn.conn_id:
                self.count("stale_connection")
                continue
            self.ack_due.add(src)
            seqno = hdr.seqno
            if seqno <= conn.delivered or seqno in conn.buffer:
                self.count("duplicates")
                continue
            if seqno == conn.delivered + 1 and not conn.buffer:
                conn.delivered = seqno
                out.append(msg)
                continue
            if seqno != conn.delivered + 1 and (
                len(conn.buffer) >= self.config.max_buffered or conn.buffered_bytes > self.config.max_buffered_bytes
            ):
                # Not acknowledged, so the sender resends it once the gap before it is filled (the next seqno is
                # always taken: it drains the buffer).
                self.count("dropped_buffer_full")
                continue
            conn.buffer[seqno] = msg
            conn.buffered_bytes += len(msg.payload)
            nxt = conn.delivered + 1
            buffer = conn.buffer
            while nxt in buffer:
                ready = buffer.pop(nxt)
                conn.buffered_bytes -= len(ready.payload)
                out.append(ready)
                nxt += 1
            conn.delivered = nxt - 1
            if not buffer:
                conn.buffered_bytes = 0
        if out:
            self.above.up(out)

    def _evict_recv_conn(self) -> None:
        # Receive state is created by whoever sends us a DATA message; keep it bounded between view changes,
        # giving up first the oldest connection of a sender outside the view.
        members = self.members
        victim = next((s for s in self.recv_conns if s not in members), None)
        if victim is None:
            victim = next(iter(self.recv_conns))
        del self.recv_conns[victim]
        self.ack_due.discard(victim)
        self.count("dropped_connections")

    def _on_ack(self, src: Address, hdr: UnicastHeader) -> None:
        conn = self.send_conns.get(src)
        if conn is None or conn.conn_id != hdr.conn_id:
            return
        conn.last_ack = self.now
        unacked = conn.unacked
        popleft = unacked.popleft
        for _ in range(min(hdr.seqno - conn.low + 1, len(unacked))):
            popleft()

    def end_of_step(self) -> bool:
        if not self.ack_due:
            return False
        due, self.ack_due = self.ack_due, set()
        for src in sorted(due):
            conn = self.recv_conns.get(src)
            if conn is None:
                continue
            self.below.down(
                Message(
                    src,
                    flags=NO_RELIABILITY | NO_FLOW_CONTROL,
                    headers={protocol_ids.UNICAST: UnicastHeader(ACK, conn.conn_id, conn.delivered)},
                )
            )
        return True

    def down_event(self, event: Event) -> Any:
        if isinstance(event, ViewChange):
            new = frozenset(event.view.members)
            # Sending to members that left the view stops; connections to members never in our view (joiners,
            # other partitions) are kept until they time out. A receive side is kept (its buffer dropped): it
            # remembers the connection id, so a late retransmission of the old connection is not redelivered.
            for gone in self.members - new:
                self.send_conns.pop(gone, None)
                conn = self.recv_conns.get(gone)
                if conn is not None:
                    conn.buffer.clear()
                    conn.buffered_bytes = 0
            self.members = new
            if len(self.recv_conns) > _MAX_RECV_CONNS:
                for src in [s for s in self.recv_conns if s not in new][: len(self.recv_conns) - _MAX_RECV_CONNS]:
                    del self.recv_conns[src]
        return self.below.down_event(event)

    def on_timer(self, key: object) -> None:
        if key != "xmit":
            return
        now = self.now
        limit = self.config.max_xmit_per_interval
        for dest, conn in list(self.send_conns.items()):
            if not conn.unacked:
                continue
            if dest not in self.members and now - conn.last_ack > self.config.give_up_after:
                self.count("gave_up")
                del self.send_conns[dest]
                continue
            low = conn.low
            pid = protocol_ids.UNICAST
            for seqno, msg in enumerate(islice(conn.unacked, limit), start=low):
                # A fresh header: ``low`` must be current, or a receiver that lost its state would wait for
                # seqnos the sender already dropped.
                msg.headers[pid] = UnicastHeader(DATA, conn.conn_id, seqno, low)
                self.below.down(msg)
                self.count("xmit_sent")
        self.set_timer("xmit", self.config.xmit_interval)

    def describe_state(self) -> dict[str, Any]:
        return {
            "send": {str(d): len(c.unacked) for d, c in self.send_conns.items()},
            "recv": {str(s): c.delivered for s, c in self.recv_conns.items()},
        }


register_layer(Unicast)
