"""NAKACK: reliable FIFO multicast by sequence numbers, negative acknowledgements and retransmission.

Every multicast gets the sender's next seqno; each receiver keeps a window per view member and delivers in
seqno order. Gaps are detected on arrival and requested from the original sender after they have persisted
for one retransmission interval (so reordering alone causes no requests). The sender keeps what it sent until
STABLE reports it delivered everywhere. A lost *last* message is found through the stability digest's highest
received seqnos (seed 002's fix), and a request for a message already collected as stable is answered with
"gone up to N", so a member that was not in the view back then skips instead of waiting forever; a member
FLUSH names to retransmit a sender's messages for it relays that for the part it skipped itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from ..core import protocol_ids
from ..core.address import Address
from ..core.config import param
from ..core.digest import Digest
from ..core.events import (
    Event,
    FlushHold,
    FlushRelease,
    FlushTarget,
    GetDigest,
    MergeDigest,
    SetDigest,
    Stability,
    ViewChange,
)
from ..core.layer import Layer, register_layer
from ..core.message import NO_FLOW_CONTROL, NO_RELIABILITY, Header, Message, register_header
from ..core.validate import as_address, as_int, as_list
from ..core.wire import set_run_builder

MSG: Final = 0
XMIT_REQ: Final = 1
XMIT_RSP: Final = 2
XMIT_GONE: Final = 3
_MAX_RANGES: Final = 256
_MAX_RETIRED = 4096  # departed members whose delivered seqno is remembered
_MAX_PASSED: Final = 64  # ranges of a sender's stream passed over on its XMIT_GONE, remembered for a flush (latest)


class NakAckHeader(Header):
    """MSG(seqno) | XMIT_REQ(sender, ranges) | XMIT_RSP(seqno, sender) | XMIT_GONE(sender, upto)."""

    PROTO_ID = protocol_ids.NAKACK
    __slots__ = ("kind", "ranges", "sender", "seqno")

    def __init__(
        self, kind: int, seqno: int = 0, sender: Address | None = None, ranges: tuple[tuple[int, int], ...] = ()
    ) -> None:
        self.kind = kind
        self.seqno = seqno
        self.sender = sender
        self.ranges = ranges

    def to_wire(self) -> list[Any]:
        if self.kind == MSG:
            return [MSG, self.seqno]
        if self.kind == XMIT_REQ:
            assert self.sender is not None
            return [XMIT_REQ, self.sender.to_wire(), [list(r) for r in self.ranges]]
        assert self.sender is not None
        return [self.kind, self.seqno, self.sender.to_wire()]

    @classmethod
    def from_wire(cls, data: Any) -> NakAckHeader:
        if type(data) is list and len(data) == 2 and data[0] == MSG:
            seqno = data[1]
            if type(seqno) is not int or seqno < 1:
                as_int(seqno, "nakack.seqno", 1)
            return cls(MSG, seqno)
        items = as_list(data, "nakack", 3, exact=3)
        kind = as_int(items[0], "nakack.kind", 0, 3)
        if kind == XMIT_REQ:
            sender = as_address(items[1], "nakack.sender")
            ranges = []
            for i, r in enumerate(as_list(items[2], "nakack.ranges", _MAX_RANGES)):
                lo, hi = as_list(r, f"nakack.ranges[{i}]", 2, exact=2)
                lo = as_int(lo, f"nakack.ranges[{i}].lo", 1)
                hi = as_int(hi, f"nakack.ranges[{i}].hi", lo)
                ranges.append((lo, hi))
            return cls(XMIT_REQ, sender=sender, ranges=tuple(ranges))
        if kind in (XMIT_RSP, XMIT_GONE):
            return cls(kind, as_int(items[1], "nakack.seqno", 1), as_address(items[2], "nakack.sender"))
        from ..core.errors import WireError

        raise WireError(f"nakack.kind: {kind} is not valid in this form")

    def run_seqno(self) -> int:
        return self.seqno if self.kind == MSG else 0

    def __repr__(self) -> str:
        return f"NakAckHeader({self.kind}, {self.seqno}, {self.sender}, {self.ranges})"


register_header(NakAckHeader)


class Window:
    """Receive window of one sender: delivered prefix, highest known seqno, out-of-order buffer.

    ``cap`` (FLUSH) holds delivery at a seqno; ``store`` keeps delivered messages for retransmission on the
    sender's behalf (only with ``retain_delivered``); seqnos up to ``seen_upto`` were delivered to us in an
    earlier view (a member that came back): they advance the window but are not delivered again. ``passed``
    lists the seqno ranges passed over on the sender's XMIT_GONE: counted as delivered, never held.
    """

    __slots__ = (
        "buffer",
        "buffered_bytes",
        "cap",
        "delivered",
        "missing_before",
        "passed",
        "received",
        "seen_upto",
        "store",
    )

    def __init__(self, delivered: int = 0, received: int | None = None) -> None:
        self.delivered = delivered
        self.received = delivered if received is None else max(received, delivered)
        self.buffer: dict[int, Message] = {}
        # Payload bytes in ``buffer`` (approximate: reset whenever the buffer empties), for max_buffered_bytes.
        self.buffered_bytes = 0
        self.cap: int | None = None
        self.seen_upto = 0
        self.passed: list[tuple[int, int]] = []
        self.store: dict[int, Message] = {}
        # Seqnos missing at the previous retransmission tick: only those still missing are requested.
        self.missing_before: frozenset[int] = frozenset()

    def missing(self, limit: int) -> list[int]:
        out = []
        buf = self.buffer
        for s in range(self.delivered + 1, self.received + 1):
            if s not in buf:
                out.append(s)
                if len(out) >= limit:
                    break
        return out


def _ranges(seqnos: list[int]) -> tuple[tuple[int, int], ...]:
    ranges: list[tuple[int, int]] = []
    for s in seqnos:
        if ranges and ranges[-1][1] == s - 1:
            ranges[-1] = (ranges[-1][0], s)
        else:
            ranges.append((s, s))
    return tuple(ranges[:_MAX_RANGES])


@dataclass(frozen=True)
class NakAckConfig:
    xmit_interval: float = param("200ms", "duration", doc="how often gaps are checked and requested")
    max_xmit_batch: int = param(4096, "int", doc="most seqnos requested from one sender per interval", minimum=1)
    max_buffered: int = param(1_000_000, "int", doc="most out-of-order messages kept per sender", minimum=16)
    max_buffered_bytes: int = param(
        "64MiB", "size", doc="most payload bytes of out-of-order messages kept per sender; beyond, dropped", minimum=1
    )
    retain_delivered: bool = param(
        False, "bool", doc="keep delivered messages of others until stable (FLUSH retransmits for crashed senders)"
    )
    max_stranger_messages: int = param(
        20_000, "int", doc="multicasts kept from senders we have no window for yet (a joiner's first view)"
    )


class NakAck(Layer):
    NAME = "nakack"
    PROTO_ID = protocol_ids.NAKACK
    Config = NakAckConfig

    def __init__(self, config: NakAckConfig, ctx: Any) -> None:
        super().__init__(config, ctx)
        self.seqno = 0  # highest seqno this member sent
        self.sent: dict[int, Message] = {}  # retained for retransmission until stable
        self.gone_upto = 0  # own seqnos collected as stable (cannot be retransmitted)
        self.windows: dict[Address, Window] = {}
        # Highest seqno delivered from members whose window was removed: if one comes back (merge, rejoin),
        # nothing up to it is delivered again, whatever a digest says (see _new_window).
        self.retired: dict[Address, int] = {}
        self.members: tuple[Address, ...] = ()
        self.is_member = False
        self.strangers: dict[Address, list[tuple[int, Message]]] = {}
        self.stranger_count = 0
        self.replay_due = False
        self.drain_due = False  # a cap moved: deliver what it released at the end of the step
        self.xmit_from: dict[Address, Address] = {}  # FLUSH: whom to ask for a sender's messages instead of it

    def start(self) -> None:
        self.set_timer("xmit", self.config.xmit_interval)

    # -- down ----------------------------------------------------------------------------------------
    def down(self, msg: Message) -> None:
        if msg.dest is None and not msg.flags & NO_RELIABILITY:
            self.seqno += 1
            msg.headers[protocol_ids.NAKACK] = NakAckHeader(MSG, self.seqno)
            self.sent[self.seqno] = msg
        self.below.down(msg)

    def down_event(self, event: Event) -> Any:
        if isinstance(event, GetDigest):
            return self.digest()
        if isinstance(event, ViewChange):
            self._on_view(event.view.members)
            # Replayed at the end of the step, after the layers above have installed the view.
            self.replay_due = bool(self.strangers)
        elif isinstance(event, SetDigest):
            self._set_digest(event.digest, replace=True)
            return None
        elif isinstance(event, MergeDigest):
            self._set_digest(event.digest, replace=False, raise_lagging=event.cut)
            return None
        elif isinstance(event, Stability):
            self._on_stability(event.stable)
            return None
        elif isinstance(event, FlushHold):
            me = self.local_address
            for m, w in self.windows.items():
                if m != me:
                    w.cap = w.delivered
            return self.digest()
        elif isinstance(event, FlushTarget):
            self._on_flush_target(event)
            return None
        elif isinstance(event, FlushRelease):
            wanted = set(event.members)
            for m, w in self.windows.items():
                if not wanted or m in wanted:
                    w.cap = None
            self.xmit_from = {s: h for s, h in self.xmit_from.items() if wanted and s not in wanted}
            self.drain_due = True
            return None
        return self.below.down_event(event)

    def _on_flush_target(self, event: FlushTarget) -> None:
        me = self.local_address
        holders = dict(event.holders)
        for m, (delivered, _) in event.target.items():
            w = self.windows.get(m)
            if w is None or m == me:
                continue
            # Deliver exactly this much of m's stream in the old view: more may exist only at a member that
            # the flush did not hear from, and delivering it here alone would break virtual synchrony.
            w.cap = delivered
            if delivered > w.received:
                w.received = delivered
            holder = holders.get(m)
            if holder is not None and holder != m:
                self.xmit_from[m] = holder
        self.drain_due = True

    def digest(self) -> Digest:
        me = self.local_address
        entries = {m: (w.delivered, w.received) for m, w in self.windows.items() if m != me}
        entries[me] = (self.seqno, self.seqno)
        return Digest(entries)

    def _on_view(self, members: tuple[Address, ...]) -> None:
        self.members = members
        self.is_member = True
        # A new view ends any flush: holds and stand-in retransmitters are gone.
        self.xmit_from.clear()
        for w in self.windows.values():
            if w.cap is not None:
                w.cap = None
                self.drain_due = True
        me = self.local_address
        wanted = set(members)
        for m in list(self.windows):
            if m not in wanted:
                self._retire(m)
        for m in members:
            if m not in self.windows:
                self.windows[m] = Window(self.seqno) if m == me else self._new_window(m, 0, 0)

    def _retire(self, member: Address) -> None:
        w = self.windows.pop(member)
        self.retired[member] = max(w.delivered, self.retired.get(member, 0))
        if len(self.retired) > _MAX_RETIRED:
            del self.retired[next(iter(self.retired))]

    def _new_window(self, member: Address, delivered: int, received: int) -> Window:
        w = Window(delivered, received)
        floor = self.retired.pop(member, 0)
        if floor > delivered:
            # We delivered more of its stream in an earlier view than the digest of this one says. The window
            # still starts where the digest says, as at every other member: its counters are what FLUSH compares,
            # and starting ahead would make a flush target ask the others for messages of that earlier view,
            # which they were never owed and nobody may hold any more. The part we had is passed over instead.
            self.count("start_below_delivered")
            w.seen_upto = floor
        return w

    def _set_digest(self, digest: Digest, *, replace: bool, raise_lagging: bool = False) -> None:
        me = self.local_address
        if replace:
            for m in [m for m in self.windows if m != me]:
                self._retire(m)
        for m, (delivered, received) in digest.items():
            if m == me:
                continue
            w = self.windows.get(m)
            if w is None:
                self.windows[m] = self._new_window(m, delivered, received)
            elif raise_lagging and delivered > w.delivered:
                # As JGroups' NAKACK2.mergeDigest: a window never goes back, but one behind the merge cut moves
                # up to it (a member listed in two subgroups sent those messages in the other one's view).
                self.count("merge_windows_raised")
                for s in [s for s in w.buffer if s <= delivered]:
                    w.buffered_bytes -= len(w.buffer.pop(s).payload)
                w.delivered = delivered
                w.received = max(w.received, received, delivered)
                self.drain_due = True  # what is buffered beyond the cut was sent in the new view
        if me not in self.windows:
            self.windows[me] = Window(self.seqno)

    def _on_stability(self, stable: Digest) -> None:
        me = self.local_address
        if me in stable:
            # Nothing beyond our own highest seqno can be stable; a digest saying so must not make us loop.
            upto = min(stable.delivered(me), self.seqno)
            if upto > self.gone_upto:
                sent = self.sent
                if upto - self.gone_upto <= len(sent):
                    for s in range(self.gone_upto + 1, upto + 1):
                        sent.pop(s, None)
                else:
                    for s in [s for s in sent if s <= upto]:
                        del sent[s]
                self.gone_upto = upto
        for m, (stable_upto, _) in stable.items():
            w = self.windows.get(m)
            if w is not None and w.store:
                for s in [s for s in w.store if s <= stable_upto]:
                    del w.store[s]
        for m, (_, received) in stable.items():
            w = self.windows.get(m)
            if w is not None and m != me and received > w.received:
                # Seed 002: someone received seqnos we never heard of — the last message(s) were lost to us.
                w.received = received
                self.count("tail_gaps_found")

    # -- up ------------------------------------------------------------------------------------------
    def up(self, batch: list[Message]) -> None:  # noqa: C901  the per-message hot path, kept in one loop
        out: list[Message] = []
        append = out.append
        windows = self.windows
        pid = protocol_ids.NAKACK
        # A batch is mostly in-order multicasts of one sender: its window is looked up once, and the in-order
        # case (the fast path of _add) is handled inline; a window that retains delivered messages or holds
        # delivery at a cap (FLUSH) goes through _add.
        src: Address | None = None
        w: Window | None = None
        fast = False
        for msg in batch:
            hdr: NakAckHeader | None = msg.headers.get(pid)
            if hdr is None:
                append(msg)
                continue
            kind = hdr.kind
            if kind == MSG:
                if msg.src is not src:
                    src = msg.sender()
                    w = windows.get(src)
                    fast = (
                        w is not None
                        and w.cap is None
                        and not self.config.retain_delivered
                        and w.seen_upto <= w.delivered
                    )
                if w is None:
                    self._keep_stranger(msg, hdr.seqno)
                    continue
                seqno = hdr.seqno
                if fast and seqno == w.delivered + 1 and not w.buffer:
                    w.delivered = seqno
                    if seqno > w.received:
                        w.received = seqno
                    append(msg)
                    continue
                self._add(w, seqno, msg, out)
            elif kind == XMIT_RSP:
                assert hdr.sender is not None  # from_wire: every header but MSG names a sender
                xw = windows.get(hdr.sender)
                if xw is None:
                    continue
                msg.src = hdr.sender
                msg.dest = None
                msg.flags &= ~NO_RELIABILITY
                self.count("xmit_received")
                self._add(xw, hdr.seqno, msg, out)
            elif kind == XMIT_REQ:
                self._serve_xmit(msg.sender(), hdr)
            elif kind == XMIT_GONE:
                assert hdr.sender is not None
                xw = windows.get(hdr.sender)
                upto = hdr.seqno
                stand_in = msg.src != hdr.sender
                if stand_in and (msg.src is None or self.xmit_from.get(hdr.sender) != msg.src):
                    # Only a sender collects its own messages (see _serve_xmit); anyone else saying so is wrong,
                    # but for the holder FLUSH named for it, relaying what it passed over itself (_serve_for).
                    self.count("xmit_gone_ignored")
                    continue
                if stand_in and xw is not None and xw.cap is not None:
                    upto = min(upto, xw.cap)  # the holder vouches for the flushed part of the stream only
                if xw is not None and upto > xw.delivered:
                    self.count("skipped_stable", upto - xw.delivered)
                    passed = xw.passed
                    if passed and passed[-1][1] == xw.delivered:
                        passed[-1] = (passed[-1][0], upto)
                    else:
                        passed.append((xw.delivered + 1, upto))
                        if len(passed) > _MAX_PASSED:
                            del passed[0]
                    # Over the buffer, not the range: a peer's seqno may be 2**63, the buffer is bounded.
                    for s in [s for s in xw.buffer if s <= upto]:
                        xw.buffered_bytes -= len(xw.buffer.pop(s).payload)
                    xw.delivered = upto
                    xw.received = max(xw.received, upto)
                    self._drain(xw, out)
        if out:
            self.above.up(out)

    def _keep_stranger(self, msg: Message, seqno: int) -> None:
        """A multicast from a sender we have no window for yet (members that installed a view with us send
        before our own view arrives): keep it, bounded, for when the window is created."""
        limit = self.config.max_stranger_messages
        if limit == 0:
            self.count("dropped_non_member")
            return
        if self.stranger_count >= limit:
            evicted = self.strangers.pop(next(iter(self.strangers)))
            self.stranger_count -= len(evicted)
            self.count("dropped_non_member", len(evicted))
        self.strangers.setdefault(msg.sender(), []).append((seqno, msg))
        self.stranger_count += 1

    def end_of_step(self) -> bool:
        busy = False
        if self.drain_due:
            self.drain_due = False
            out: list[Message] = []
            for w in self.windows.values():
                if w.buffer:
                    self._drain(w, out)
            if out:
                self.above.up(out)
                busy = True
        if self.replay_due:
            self.replay_due = False
            busy = self._replay_strangers() or busy
        return busy

    def _replay_strangers(self) -> bool:
        out: list[Message] = []
        for m in [m for m in self.strangers if m in self.windows]:
            kept = self.strangers.pop(m)
            self.stranger_count -= len(kept)
            w = self.windows[m]
            for seqno, msg in sorted(kept, key=lambda item: item[0]):
                self._add(w, seqno, msg, out)
            self.count("strangers_replayed", len(kept))
        if out:
            self.above.up(out)
        return bool(out)

    def _add(self, w: Window, seqno: int, msg: Message, out: list[Message]) -> None:
        if seqno <= w.delivered:
            self.count("duplicates")
            return
        if self.config.retain_delivered:
            w.store[seqno] = msg
        if seqno == w.delivered + 1 and not w.buffer and (w.cap is None or seqno <= w.cap):
            # Fast path: in order and nothing buffered.
            w.delivered = seqno
            if seqno > w.received:
                w.received = seqno
            if seqno > w.seen_upto:
                out.append(msg)
            return
        if seqno in w.buffer:
            self.count("duplicates")
            return
        if seqno != w.delivered + 1 and (
            len(w.buffer) >= self.config.max_buffered or w.buffered_bytes > self.config.max_buffered_bytes
        ):
            # Dropped, not lost: it is requested again once the gap before it is filled. The next seqno is always
            # taken: it is the one that drains the buffer.
            self.count("dropped_buffer_full")
            if seqno > w.received:
                w.received = seqno  # it exists: the gap up to it is requested
            return
        w.buffer[seqno] = msg
        w.buffered_bytes += len(msg.payload)
        if seqno > w.received:
            w.received = seqno
        self._drain(w, out)

    @staticmethod
    def _drain(w: Window, out: list[Message]) -> None:
        buf = w.buffer
        nxt = w.delivered + 1
        cap = w.cap
        while nxt in buf and (cap is None or nxt <= cap):
            msg = buf.pop(nxt)
            w.buffered_bytes -= len(msg.payload)
            if nxt > w.seen_upto:
                out.append(msg)
            nxt += 1
        w.delivered = nxt - 1
        if not buf:
            w.buffered_bytes = 0

    # -- retransmission ----------------------------------------------------------------------------------
    def _serve_xmit(self, requester: Address, hdr: NakAckHeader) -> None:
        sender = hdr.sender
        assert sender is not None
        if sender != self.local_address:
            self._serve_for(requester, sender, hdr.ranges)
            return
        gone = False
        # At most max_xmit_batch retransmissions per request, and collected seqnos are skipped without a loop:
        # a request's ranges come from a peer and may span 2**63.
        budget = self.config.max_xmit_batch
        for lo, hi in hdr.ranges:
            if lo <= self.gone_upto:
                gone = True
                lo = self.gone_upto + 1
            for s in range(lo, min(hi, self.seqno) + 1):
                if budget <= 0:
                    break
                orig = self.sent.get(s)
                if orig is None:
                    continue
                budget -= 1
                copy = orig.copy()
                copy.dest = requester
                # Not NO_FLOW_CONTROL: the receiver's flow layer must count the retransmission it delivers,
                # or the sender's credits leak under loss.
                copy.flags |= NO_RELIABILITY
                copy.headers[protocol_ids.NAKACK] = NakAckHeader(XMIT_RSP, s, self.local_address)
                self.below.down(copy)
                self.count("xmit_sent")
        if gone and requester not in self.members:
            # Stable in a view the requester is not in (we moved on without it, e.g. excluded and alone):
            # "gone" would make it skip messages its own view's members may still hold for it (FLUSH fetches
            # them from a holder once its view drops us). Say nothing; it stops asking when its view changes.
            self.count("xmit_gone_withheld")
        elif gone:
            self.below.down(
                Message(
                    requester,
                    flags=NO_RELIABILITY | NO_FLOW_CONTROL,
                    headers={protocol_ids.NAKACK: NakAckHeader(XMIT_GONE, self.gone_upto, self.local_address)},
                )
            )

    def _serve_for(self, requester: Address, sender: Address, ranges: tuple[tuple[int, int], ...]) -> None:
        """Retransmit another member's messages we delivered (FLUSH reconciliation after it crashed)."""
        w = self.windows.get(sender)
        if w is None:
            return
        first_wanted = ranges[0][0] if ranges else 0
        passed_upto = next((hi for lo, hi in w.passed if lo <= first_wanted <= hi), 0)
        if passed_upto:
            # The requester has the stream up to where we passed over a part on the sender's XMIT_GONE (it was
            # stable in a view of the sender's that we were not in). A flush that names us the holder counts
            # those seqnos as delivered by us, but nobody here can retransmit them and the sender may not answer
            # the requester: tell it they are gone, so it passes over the same part as we did and the flush
            # completes, instead of the requester waiting for them in every new round.
            self.count("xmit_gone_relayed")
            self.below.down(
                Message(
                    requester,
                    flags=NO_RELIABILITY | NO_FLOW_CONTROL,
                    headers={protocol_ids.NAKACK: NakAckHeader(XMIT_GONE, passed_upto, sender)},
                )
            )
        if not w.store:
            return
        budget = self.config.max_xmit_batch
        first = min(w.store)
        for lo, hi in ranges:
            for s in range(max(lo, first), min(hi, w.delivered) + 1):
                if budget <= 0:
                    return
                orig = w.store.get(s)
                if orig is None:
                    continue
                budget -= 1
                copy = orig.copy()
                copy.dest = requester
                copy.flags |= NO_RELIABILITY
                copy.headers[protocol_ids.NAKACK] = NakAckHeader(XMIT_RSP, s, sender)
                self.below.down(copy)
                self.count("xmit_sent_for_others")

    def on_timer(self, key: object) -> None:
        if key != "xmit":
            return
        me = self.local_address
        for m, w in self.windows.items():
            if m == me or w.received <= w.delivered:
                w.missing_before = frozenset()
                continue
            missing = w.missing(self.config.max_xmit_batch)
            prev = w.missing_before
            w.missing_before = frozenset(missing)
            request = [s for s in missing if s in prev]
            if request:
                self.count("xmit_requests")
                self.below.down(
                    Message(
                        self.xmit_from.get(m, m),
                        flags=NO_RELIABILITY | NO_FLOW_CONTROL,
                        headers={protocol_ids.NAKACK: NakAckHeader(XMIT_REQ, sender=m, ranges=_ranges(request))},
                    )
                )
        self.set_timer("xmit", self.config.xmit_interval)

    def describe_state(self) -> dict[str, Any]:
        return {
            "seqno": self.seqno,
            "retained": len(self.sent),
            "windows": {str(m): [w.delivered, w.received, len(w.buffer)] for m, w in self.windows.items()},
        }


register_layer(NakAck)


def _build_run(sender: Address, first: int, flags: int, payloads: list[bytes], out: list[Message]) -> None:
    """The messages of a run decoded by core.wire, validated there: multicasts with a MSG header each."""
    pid = protocol_ids.NAKACK
    seqno = first
    for payload in payloads:
        # One header dict per message still: every layer reads its header from it.
        out.append(Message(None, payload, src=sender, flags=flags, headers={pid: NakAckHeader(MSG, seqno)}))
        seqno += 1


set_run_builder(_build_run)
