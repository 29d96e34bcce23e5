"""SEQUENCER's member role: batches from the coordinator, commits, uniform delivery in batch order, the
received-table that drops what was delivered already (kept, bounded, for senders that left), fragments delivered
together, ACKs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from ...core import protocol_ids
from ...core.address import Address
from ...core.errors import WireError
from ...core.message import NATIVE, NO_RELIABILITY, Message
from ...core.view import View, ViewId
from .forwarding import ForwardTable
from .state import _Batch
from .wire import ACK, MAX_EPOCHS, Run, SequencerHeader, decode_batch

_FRAG: Final = protocol_ids.FRAG
_MAX_RETIRED = 4096  # received-table entries of senders outside our view (see _retire_senders), as NAKACK's
_MAX_GAP_SENDERS: Final = 4096  # senders whose skipped forward seqnos we remember (see _skipped)
_MAX_GAPS: Final = 64  # ranges remembered per sender, the oldest forgotten first
_new_message: Final = Message.__new__  # not object.__new__, which a Message compiled with mypyc refuses


class MemberRole(ForwardTable):
    """What every member, the coordinator included, does with the batches it receives."""

    def _on_bcast(self, src: Address, hdr: SequencerHeader, payload: bytes) -> None:
        if hdr.epoch != self.epoch or src != self.coord:
            self.count("foreign_batches")
            return
        seq = hdr.seq
        if seq <= self.recv_high or seq in self.cur:
            self.count("duplicate_batches")
            return
        epoch = hdr.epoch
        assert epoch is not None  # from_wire: a BCAST names its epoch
        ident = hdr.replay if hdr.replay is not None else (epoch, seq)
        own = self._own_runs.pop(seq, None) if self.is_coord and src == self.local_address else None
        try:
            runs = decode_batch(payload, self._address) if own is None else self._own_batch(own)
        except WireError as exc:
            # Acknowledged all the same (the stream must not stall on it), but nothing of it is delivered.
            self.count("bad_batches")
            self.ctx.log.warning("undecodable batch %d from %s: %s", seq, src, exc)
            runs = []
        if self.fwd_flight:
            self._seen_own(runs)
        batch = _Batch(ident, payload, runs)
        self.cur[seq] = batch
        e, b = ident
        if b > self.delivered_in.get(e, 0):
            self.pending.setdefault(e, {})[b] = batch
        nxt = self.recv_high + 1
        while nxt in self.cur:
            nxt += 1
        if nxt - 1 != self.recv_high:
            self.recv_high = nxt - 1
        else:
            self.count("batch_gaps")
        self._learn_commit(hdr.commit)
        if self.is_coord:
            self._on_ack(self.local_address, self.recv_high)
        elif self.recv_high > self.commit_known and not self.ctx.has_timer("ack"):
            self.set_timer("ack", self.config.ack_interval)

    def _own_batch(self, own_runs: list[list[Any]]) -> list[Run]:
        """The runs of a batch we sequenced, from the objects we packed: each run carries its items decoded
        next to their wire form (see :meth:`_sequence`), so nothing is unpacked, validated or built again."""
        address = self._address
        return [(address(run[0], "sequencer.batch[].origin"), run[1], run[3]) for run in own_runs]

    def _learn_commit(self, commit: int) -> None:
        if commit <= self.commit_known:
            return
        self.commit_known = commit
        out: list[Message] = []
        cur = self.cur
        while self.delivered_seq < commit and self.delivered_seq + 1 in cur:
            self.delivered_seq += 1
            self._deliver(cur.pop(self.delivered_seq), out)
        if out:
            self._emit(out)
        if self.leave_pending and not self.fwd_table:
            self._leave_now()

    def _deliver(self, batch: _Batch, out: list[Message]) -> None:
        e, b = batch.ident
        self._settle_pending(e, b)
        if e in self.epochs_seen:
            # Batches of an epoch we were in reach us in seq order, so a watermark tells which we delivered.
            if b <= self.delivered_in.get(e, 0):
                self.count("batches_skipped")
                return
            self.delivered_in[e] = b
        # A replay of an epoch we were not in (the other side of a merge, or before we joined) is delivered too,
        # minus what the received-table says we have: every member of this view that lacks its messages delivers
        # them here, at this position. Skipping them would let us deliver them later in another position: their
        # sender, if it was not here to take the replay, still has them in its forward-table and forwards them
        # again in a later epoch, where the members that delivered them here discard them and we would not.
        me = self.local_address
        high = self.high
        for origin, start, items in batch.runs:
            h = high.get(origin)
            member = h is not None or origin in self.members
            if h is None:
                h = 0 if member else self.retired.get(origin, 0)
            n = len(items)
            if start > h:
                first = 0
                if start > h + 1 and not self.joining:
                    self._skipped(origin, h + 1, start - 1)
            else:
                first = h - start + 1
                if first >= n:
                    self.count("duplicates", n)
                    continue
                self.count("duplicates", first)
            self._deliver_items(origin, items[first:] if first else items, out)
            last = start + n - 1
            if member:
                high[origin] = last
            else:
                self._retire(origin, last)
            if origin == me:
                self._forget_own(last)
                self.joining = False
        if len(self.delivered_in) > MAX_EPOCHS:
            for old in list(self.delivered_in)[: len(self.delivered_in) - MAX_EPOCHS]:
                del self.delivered_in[old]

    def _skipped(self, origin: Address, first: int, last: int) -> None:
        """We deliver ``origin``'s messages past ``first`` .. ``last``, which we never delivered: from now on our
        received-table drops them, so they are remembered as ours to announce (see ``gaps``). Not while we join a
        group (see ``joining``): what a joiner skips then, its state holds."""
        ranges = self.gaps.pop(origin, None)
        if ranges is None:
            ranges = []
            if len(self.gaps) >= _MAX_GAP_SENDERS:
                del self.gaps[next(iter(self.gaps))]
        ranges.append((first, last))
        if len(ranges) > _MAX_GAPS:
            del ranges[0]
        self.gaps[origin] = ranges  # most recently skipped from last

    def _settle_pending(self, e: ViewId, b: int) -> None:
        """Batch ``b`` of epoch ``e`` and any older one of its epoch are settled (older ones were delivered or
        skipped). Batches of an epoch are added in seq order, so the settled ones are at the front."""
        per_epoch = self.pending.get(e)
        if per_epoch is None:
            return
        while per_epoch:
            first = next(iter(per_epoch))
            if first > b:
                break
            del per_epoch[first]
        if not per_epoch:
            del self.pending[e]

    def _deliver_items(self, origin: Address, todo: Sequence[Any], out: list[Message]) -> None:
        """Append ``origin``'s sequenced items (plain payloads, (flags, headers, payload), or messages) to ``out`` as
        messages, reassembling fragments."""
        first = todo[0]
        if type(first) is Message:
            # A run that came in uniform form, decoded into its messages (see wire.columns_messages): delivered as
            # they are, once (a decoded batch leaves ``cur`` as it is delivered). All carry the same one header.
            if _FRAG not in first.headers:
                out.extend(todo)
                return
            for msg in todo:
                self._fragment(origin, msg.headers[_FRAG], msg, out)
            return
        if len(set(map(type, todo))) == 1 and type(first) is bytes:
            out.extend([Message(None, p, src=origin) for p in todo])
            return
        append = out.append
        for item in todo:
            if type(item) is bytes:
                append(Message(None, item, src=origin))
                continue
            # Typed: compiled, the tuple is read by index and the header dict with the dict API.
            decoded: tuple[int, dict[int, Any], bytes] = item
            flags, headers, payload = decoded
            # The header dict is the item's own: a decoded batch is delivered once (it leaves ``cur`` as it is
            # delivered). Interpreted, built field by field (a keyword call costs more).
            if NATIVE:
                msg = Message(None, payload, src=origin, flags=flags, headers=headers)
            else:
                msg = _new_message(Message)
                msg.dest = None
                msg.src = origin
                msg.payload = payload
                msg.flags = flags
                msg.headers = headers
            frag = headers.get(_FRAG)
            if frag is None:
                append(msg)
            else:
                self._fragment(origin, frag, msg, out)

    def _retire_senders(self, view: View) -> None:
        """Keep ``high`` to the members of ``view``: entries of senders that left move to ``retired``, those of
        members that came back (same address: a partition healed) move back.

        Why an entry cannot simply be dropped when its sender leaves the view: leaving the view is also what a
        member that is only cut off does (a crash and a partition look the same from here), and it comes back
        with the same address. Its forward-table still holds what it did not deliver itself, some of which we
        delivered while it was away (a replay its side never took): that is sequenced again, and only this
        entry tells us it is a duplicate. Replays of old batches held by members that were away bring its
        messages back too. So nothing local shows that a departed sender's messages can no longer reach us; its
        entry is kept, out of the way, and ``retired`` is bounded: past ``_MAX_RETIRED`` departed senders the
        one delivered from least recently is forgotten (a restart is a new address, so without a bound the
        table would grow with every restart). Forgetting one could deliver a message twice only if that
        sender, or a batch holding its messages, came back after that many others left since; losing a message
        it cannot: an entry only ever suppresses deliveries."""
        members = frozenset(view.members)
        self.members = members
        high, retired = self.high, self.retired
        for gone in [s for s in high if s not in members]:
            self._retire(gone, high.pop(gone))
        for member in view.members:
            if member not in high:
                back = retired.pop(member, None)
                if back is not None:
                    high[member] = back

    def _retire(self, sender: Address, last: int) -> None:
        retired = self.retired
        retired.pop(sender, None)
        retired[sender] = last
        if len(retired) > _MAX_RETIRED:
            del retired[next(iter(retired))]
            self.count("retired_forgotten")

    def _fragment(self, origin: Address, frag: Any, msg: Message, out: list[Message]) -> None:
        key = (origin, frag.frag_id)
        parts = self.fragments.get(key)
        if parts is None:
            if frag.count == 1:
                out.append(msg)
                return
            parts = self.fragments[key] = []
        parts.append(msg)
        self.fragment_bytes += len(msg.payload)
        if len(parts) >= frag.count:
            del self.fragments[key]
            self.fragment_bytes -= sum(len(m.payload) for m in parts)
            out.extend(parts)
            return
        while self.fragment_bytes > self.config.max_queued and self.fragments:
            # Bounded: the oldest incomplete message goes (FRAG above would drop it as well).
            oldest = next(iter(self.fragments))
            self.fragment_bytes -= sum(len(m.payload) for m in self.fragments.pop(oldest))
            self.count("fragments_dropped")

    def _send_ack(self) -> None:
        if self.recv_high > self.acked:
            self.acked = self.recv_high
            self._send(self.coord, SequencerHeader(ACK, self.epoch, seq=self.recv_high), flags=NO_RELIABILITY)

    def _on_ack(self, src: Address, seq: int) -> None:
        """``src`` received our batches up to ``seq``: the coordinator's part (see
        :meth:`.coordinator.CoordinatorRole._on_ack`), here because a coordinator acknowledges its own batches
        to itself as it receives them."""
        raise NotImplementedError
