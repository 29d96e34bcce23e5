"""SEQUENCER's sync on every view change: a new epoch; each member reports to the new coordinator what it received
and has not delivered, and its forward-table (SYNC); the coordinator waits for every member's report, replays the
batches in (epoch, number) order, then the forward-tables, and only then sequences new traffic."""

from __future__ import annotations

from typing import Any, Final

from ...core.address import Address
from ...core.errors import WireError
from ...core.validate import MAX_INT, as_bytes, as_int, as_list
from ...core.view import View, ViewId
from .coordinator import CoordinatorRole
from .state import _Batch, _Sync
from .wire import (
    MAX_EPOCHS,
    MAX_MARKS,
    MAX_RUNS,
    SYNC,
    SequencerHeader,
    _item_size,
    _pack,
    _unpack,
    check_items,
    decode_batch,
    trim_batch,
)

_MAX_FUTURE_SYNCS: Final = 4096  # senders whose SYNC for a view we have not installed yet is kept
_MARK_SIZE: Final = 32  # rough msgpack bytes of a sender named in a SYNC as skipped past, for cutting it into parts


class ViewSync(CoordinatorRole):
    """The view change: the member's side (its SYNC) and the coordinator's (collect, replay, open)."""

    def _on_view(self, view: View) -> None:
        me = self.local_address
        self.view = view
        self._retire_senders(view)
        epoch = view.view_id
        if not self.grouped and len(view.members) > 1:
            self.grouped = True
            self.joining = not view.is_merge
        self.epoch = epoch
        self.coord = view.coordinator
        self.epochs_seen[epoch] = None
        if len(self.epochs_seen) > MAX_EPOCHS:
            del self.epochs_seen[next(iter(self.epochs_seen))]
        # The previous epoch's undelivered batches stay in ``pending`` (reported in our SYNC); its own
        # bookkeeping starts over.
        self.recv_high = 0
        self.cur = {}
        self.commit_known = 0
        self.delivered_seq = 0
        self.acked = 0
        self.cancel_timer("ack")
        self.out_items = []  # they are in the forward-table, which our SYNC carries
        self.out_pos = 0
        self.out_decoded = []
        self._open_window()
        self.sync_parts = self._build_sync()
        was_coord = self.is_coord
        self.is_coord = self.coord == me
        self.open = False
        self.frozen = self.thaw_due = False
        self.sync = None
        self._runs, self._run_origin, self._batch_bytes, self._ready = [], None, 0, []
        self._own_runs = {}
        self.cancel_timer("sync")
        self.count("epochs")
        self.held, self.held_bytes = {}, 0
        self.cancel_timer("resend")
        if not self.is_coord:
            if was_coord:
                self.queue = []
            # Strays are kept: forwards meant for a view we have not installed yet may be among them.
            # The SYNC leaves at the end of the step: a joiner's GMS drops what is sent down while it is still
            # installing its first view.
            self.sync_due = True
            return
        members = set(view.members)
        # Forwards queued during an unfinished sync stay (deduplicated later) if their sender is still here.
        self.queue = [q for q in self.queue if q[0] in members] if was_coord else []
        self.next_seq = 0
        self.acks = {m: 0 for m in view.members}
        self.commit = self.commit_sent = 0
        self.seq_high = {}
        self.sync = _Sync(members - {me})
        self._add_sync_parts(me, self.sync_parts)
        for sender in list(self.future_syncs):
            fepoch, parts = self.future_syncs[sender]
            if fepoch == epoch:
                del self.future_syncs[sender]
                if sender in members:
                    self._add_sync_parts(sender, parts)
            elif fepoch.seq <= epoch.seq:
                del self.future_syncs[sender]
        if self.sync is not None and self.sync.waiting:
            self.set_timer("sync", self.config.sync_retry)
        self.open_due = True  # at the end of the step, for the same reason

    # -- member: SYNC --------------------------------------------------------------------------------------------
    def _build_sync(self) -> list[tuple[SequencerHeader, bytes]]:
        """Our SYNC for the current epoch, cut into parts of at most ``max_batch_size`` bytes: epochs seen
        (first part), the forward seqnos we skipped past per sender (``gaps``, see :meth:`_maybe_open`),
        undelivered batches by identity, and the forward-table. A part is ``[epochs, batches, forwards, highest
        forward seqno, skipped]``, skipped a list of ``[sender, [first, last, first, last, ...]]`` (a peer that
        sends four fields announces none)."""
        assert self.epoch is not None
        limit = self._max_batch
        fwd_seq = self.fwd_seq
        bodies: list[list[Any]] = []
        epochs = [e.to_wire() for e in self.epochs_seen]
        batches: list[Any] = []
        marks: list[Any] = []
        size = 0
        for origin, ranges in self.gaps.items():
            msize = _MARK_SIZE + 16 * len(ranges)
            if marks and (size + msize > limit or len(marks) >= MAX_MARKS):
                bodies.append([epochs, batches, None, fwd_seq, marks])
                epochs, marks, size = [], [], 0
            marks.append([origin.to_wire(), [bound for r in ranges for bound in r]])
            size += msize
        for e in sorted(self.pending):
            ewire = e.to_wire()
            for b in sorted(self.pending[e]):
                raw = self.pending[e][b].raw
                if (batches or marks) and size + len(raw) > limit:
                    bodies.append([epochs, batches, None, fwd_seq, marks])
                    epochs, batches, marks, size = [], [], [], 0
                batches.append([ewire, b, raw])
                size += len(raw) + 64
        if self.fwd_table:
            start = self.fwd_first
            items: list[Any] = []
            for s, item in enumerate(self.fwd_table, start):
                isize = _item_size(item)
                if items and size + isize > limit:
                    bodies.append([epochs, batches, [start, items], fwd_seq, marks])
                    epochs, batches, marks, size, items, start = [], [], [], 0, [], s
                items.append(item)
                size += isize
            bodies.append([epochs, batches, [start, items], fwd_seq, marks])
        elif batches or epochs or marks or not bodies:
            bodies.append([epochs, batches, None, fwd_seq, marks])
        total = len(bodies)
        return [(SequencerHeader(SYNC, self.epoch, i, total), _pack(body)) for i, body in enumerate(bodies)]

    def _send_sync(self) -> None:
        coord = self.coord
        for hdr, payload in self.sync_parts:
            self._send(coord, hdr, payload)
        self.count("syncs_sent")

    # -- coordinator: SYNC ----------------------------------------------------------------------------------------
    def _on_sync(self, src: Address, hdr: SequencerHeader, payload: bytes) -> None:
        epoch = hdr.epoch
        assert epoch is not None
        if self.is_coord and epoch == self.epoch:
            if self.sync is not None and src in self.sync.waiting:
                self._add_sync_parts(src, [(hdr, payload)])
                self._maybe_open()
            return
        if self.epoch is None or epoch.seq > self.epoch.seq or (epoch.seq == self.epoch.seq and epoch != self.epoch):
            # For a view we have not installed yet (its SYNC overtook the VIEW): keep it for then.
            held = self.future_syncs.get(src)
            if held is None or held[0] != epoch:
                if held is None and len(self.future_syncs) >= _MAX_FUTURE_SYNCS:
                    self.count("future_syncs_dropped")
                    return
                held = self.future_syncs[src] = (epoch, [])
            held[1].append((hdr, payload))
            return
        self.count("stale_syncs")

    def _add_sync_parts(self, src: Address, parts: list[tuple[SequencerHeader, bytes]]) -> None:
        sync = self.sync
        assert sync is not None
        for hdr, payload in parts:
            got = sync.parts.setdefault(src, set())
            if hdr.seq in got:
                continue
            if sync.totals.setdefault(src, hdr.commit) != hdr.commit:
                self.count("bad_syncs")
                continue
            try:
                self._absorb_sync_part(sync, src, payload)
            except WireError as exc:
                self.count("bad_syncs")
                self.ctx.log.warning("bad SYNC part from %s: %s", src, exc)
                continue
            got.add(hdr.seq)
            if len(got) == sync.totals[src]:
                sync.waiting.discard(src)

    def _absorb_sync_part(self, sync: _Sync, src: Address, payload: bytes) -> None:
        body = as_list(_unpack(payload, "sequencer.sync"), "sequencer.sync", 5)
        if len(body) != 4 and len(body) != 5:
            raise WireError(f"sequencer.sync: expected 4 or 5 fields, got {len(body)}")
        fwd_seq = as_int(body[3], "sequencer.sync.fwd_seq")
        marks: list[tuple[Address, list[tuple[int, int]]]] = []
        if len(body) == 5:
            for i, mark in enumerate(as_list(body[4], "sequencer.sync.skipped", MAX_MARKS)):
                field = f"sequencer.sync.skipped[{i}]"
                m = as_list(mark, field, 2, exact=2)
                origin = self._address(m[0], f"{field}.origin")
                bounds = [as_int(x, f"{field}.ranges[]", 1) for x in as_list(m[1], f"{field}.ranges", MAX_MARKS)]
                if len(bounds) % 2:
                    raise WireError(f"{field}.ranges: an odd number of bounds")
                marks.append((origin, [(bounds[j], bounds[j + 1]) for j in range(0, len(bounds), 2)]))
        epochs = [ViewId.from_wire(e, "sequencer.sync.epochs[]") for e in as_list(body[0], "sync.epochs", MAX_EPOCHS)]
        batches = []
        for i, raw_batch in enumerate(as_list(body[1], "sequencer.sync.batches", MAX_RUNS)):
            e_wire, b, raw = as_list(raw_batch, f"sequencer.sync.batches[{i}]", 3, exact=3)
            ident = (
                ViewId.from_wire(e_wire, f"sequencer.sync.batches[{i}].epoch"),
                as_int(b, f"sequencer.sync.batches[{i}].seq", 1),
            )
            raw = as_bytes(raw, f"sequencer.sync.batches[{i}].payload", MAX_INT)
            batches.append(_Batch(ident, raw, decode_batch(raw, self._address)))
        forwards = None
        if body[2] is not None:
            fwd = as_list(body[2], "sequencer.sync.forwards", 2, exact=2)
            start = as_int(fwd[0], "sequencer.sync.forwards.start", 1)
            forwards = (start, check_items(fwd[1], "sequencer.sync.forwards.items", decode=False))
        # Validated in full: only now change state.
        sync.fwd_seqs[src] = max(fwd_seq, sync.fwd_seqs.get(src, 0))
        sync.epochs.setdefault(src, set()).update(epochs)
        for origin, ranges in marks:
            sync.gaps.setdefault(origin, []).extend(ranges)
        for batch in batches:
            sync.batches.setdefault(batch.ident, batch)
        if forwards is not None and forwards[1]:
            sync.forwards.setdefault(src, []).append(forwards)

    def _maybe_open(self) -> None:
        sync = self.sync
        if sync is None or sync.waiting or not self.is_coord:
            return
        self.sync = None
        self.cancel_timer("sync")
        assert self.epoch is not None and self.view is not None
        self.seq_high = self._replay(sync)
        self._sequence_forward_tables(sync)
        self.open = True
        # 3. Forwards that reached us before we were coordinator, then those that arrived during the sync.
        strays, self.strays, self.stray_bytes = self.strays, [], 0
        members = set(self.view.members)
        for origin, start, items, _size in strays:
            if origin in members and start + len(items) - 1 > self.seq_high.get(origin, 0):
                self._accept(origin, start, items)
        queue, self.queue = self.queue, []
        for origin, start, items in queue:
            if start + len(items) - 1 > self.seq_high.get(origin, 0):
                self._accept(origin, start, items)
        self.count("syncs_completed")

    def _replay(self, sync: _Sync) -> dict[Address, int]:
        """Step 1 of opening the epoch; returns, per sender in the view, the highest forward seqno replayed."""
        # 1. Replay every undelivered batch anyone reported, in (epoch, seq) order: each member finishes the
        #    epochs it was in, in their order. Each member drops from a replay what its received-table holds, and
        #    a member that delivered a sender's later messages first (on the other side of a partition) holds
        #    there some it never delivered and now cannot. Members that move on together must deliver the same
        #    here: the messages some member of the view skipped past (its SYNC names them) are left out.
        gaps = sync.gaps
        seeded: dict[Address, int] = {}
        for ident in sorted(sync.batches):
            batch = sync.batches[ident]
            raw = batch.raw
            if gaps:
                keep = [_outside(gaps.get(origin), start, len(items)) for origin, start, items in batch.runs]
                if any(k is not None for k in keep):
                    raw = trim_batch(raw, keep)
                    self.count("replays_trimmed")
            self._flush_batch()
            self._bcast(raw, replay=ident)
            self.count("batches_replayed")
            for origin, start, items in batch.runs:
                # The sender is in this view: the replay delivers these to it (whatever epochs it was in), so
                # its forward-table copies must not be sequenced again (they would reach others in a second
                # position).
                if origin in sync.epochs:
                    last = start + len(items) - 1
                    if last > seeded.get(origin, 0):
                        seeded[origin] = last
        return seeded

    def _sequence_forward_tables(self, sync: _Sync) -> None:
        """Step 2 of opening the epoch."""
        assert self.view is not None
        gaps = sync.gaps
        # 2. The members' forward-tables (what they multicast and have not delivered), in view order, minus what
        #    a member skipped past (as for the replay). A member's forward seqnos up to the one its SYNC
        #    announced are settled now (delivered by it, or sequenced here): its next FORWARD must continue
        #    right after, or something was lost (see held).
        for member in self.view.members:
            skipped = gaps.get(member)
            for start, items in sync.forwards.get(member, ()):
                keep = _outside(skipped, start, len(items))
                if keep is None:
                    self._sequence(member, start, items, resent=True)
                    continue
                for offset, count in keep:
                    self._sequence(member, start + offset, items[offset : offset + count], resent=True)
            announced = sync.fwd_seqs.get(member, 0)
            if announced > self.seq_high.get(member, 0):
                self.seq_high[member] = announced


def _outside(ranges: list[tuple[int, int]] | None, start: int, n: int) -> list[tuple[int, int]] | None:
    """The parts of forward seqnos ``start`` .. ``start + n - 1`` outside ``ranges``, as (offset, count); None
    when no range touches them."""
    if not ranges:
        return None
    end = start + n - 1
    cut = sorted((max(a, start), min(b, end)) for a, b in ranges if a <= end and b >= start)
    if not cut:
        return None
    keep: list[tuple[int, int]] = []
    pos = start
    for a, b in cut:
        if a > pos:
            keep.append((pos - start, a - pos))
        pos = max(pos, b + 1)
    if pos <= end:
        keep.append((pos - start, end - pos + 1))
    return keep
