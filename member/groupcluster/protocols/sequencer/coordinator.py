"""SEQUENCER's coordinator role: FORWARDs sequenced into batches (a forward after a gap is held until the sender
resent what is missing), BCASTs, the commit once every member acknowledged, and the flush hold: while FLUSH
holds delivery for a view change, no commit leaves."""

from __future__ import annotations

from typing import Any, Final

from ...core.address import Address
from ...core.errors import WireError
from ...core.message import NO_RELIABILITY
from .member import MemberRole
from .wire import (
    _ITEM_OVERHEAD,
    BCAST,
    COMMIT,
    RESEND,
    BatchId,
    Item,
    SequencerHeader,
    _item_size,
    _pack,
    decode_forward_both,
    decode_items,
    wire_run,
)

_MAX_OWN_RUNS: Final = 1024  # own batches awaiting their loopback (it comes in the same step: a bound, not a need)


class CoordinatorRole(MemberRole):
    """What the coordinator of the view does besides being a member: it sequences."""

    # -- the flush hold --------------------------------------------------------------------------------------------
    def _freeze(self) -> None:
        """FLUSH holds our delivery at what NAKACK delivered so far, and its digest (taken below, right after
        this) is what every survivor of the view will deliver of each stream. As coordinator we deliver a batch
        when we commit it, but the others only when our COMMIT reaches them: so every commit we made goes out
        now, ahead of the digest, and none follows until the view changes. Whatever this epoch left
        uncommitted is replayed in the next one, to every member alike; forwards that arrive meanwhile wait
        in the queue, and the senders' forward-tables carry them into the next view anyway."""
        self.frozen = True
        self.thaw_due = False
        if not self.is_coord or self.left:
            return
        self._flush_batch()
        if self.commit > self.commit_sent:
            self.commit_sent = self.commit
            self._send(None, SequencerHeader(COMMIT, self.epoch, commit=self.commit))

    def _thaw(self) -> None:
        """The flush was released without a view change: commit what was acknowledged meanwhile and sequence
        the forwards that waited."""
        if not self.is_coord or not self.open or self.left:
            return
        commit = min(self.acks.values()) if self.acks else 0
        if commit > self.commit:
            self.commit = commit
            self._learn_commit(commit)
        queue, self.queue = self.queue, []
        for origin, start, items in queue:
            if start + len(items) - 1 > self.seq_high.get(origin, 0):
                self._accept(origin, start, items)

    # -- sequencing ----------------------------------------------------------------------------------------------
    def _on_forward(self, src: Address, payload: bytes) -> None:
        try:
            start, items, decoded = decode_forward_both(payload)
        except WireError as exc:
            self.count("bad_forwards")
            self.ctx.log.warning("bad FORWARD from %s: %s", src, exc)
            return
        view = self.view
        if self.is_coord and view is not None and src in view.members:
            if self.open and not self.frozen:
                self._accept(src, start, items, decoded)
            else:
                self.queue.append((src, start, items))
            return
        # We are not (yet) its coordinator: keep it, bounded, in case the view that makes us one arrives.
        size = sum(_item_size(i) for i in items)
        self.strays.append((src, start, items, size))
        self.stray_bytes += size
        while self.stray_bytes > self.config.max_stray and self.strays:
            self.stray_bytes -= self.strays.pop(0)[3]
            self.count("strays_dropped")

    def _accept(self, origin: Address, start: int, items: list[Any], decoded: list[Item] | None = None) -> None:
        """A FORWARD from a member, the epoch open: sequence it if it continues the sender's forward seqnos,
        else hold it and ask the sender to forward the missing ones again."""
        high = self.seq_high.get(origin, 0)
        if start > high + 1:
            held = self.held.setdefault(origin, [])
            held.append((start, items))
            self.held_bytes += sum(_item_size(i) for i in items)
            self.count("forwards_held")
            if len(held) == 1:
                self._ask_resend(origin)
            return
        self._sequence(origin, start, items, decoded)
        waiting = self.held.get(origin)
        if waiting:
            waiting.sort(key=lambda h: h[0])
            while waiting and waiting[0][0] <= self.seq_high.get(origin, 0) + 1:
                hstart, hitems = waiting.pop(0)
                self.held_bytes -= sum(_item_size(i) for i in hitems)
                self._sequence(origin, hstart, hitems)
            if not waiting:
                del self.held[origin]

    def _ask_resend(self, origin: Address) -> None:
        self.count("resend_requests")
        frm = self.seq_high.get(origin, 0) + 1
        self._send(origin, SequencerHeader(RESEND, self.epoch, seq=frm), flags=NO_RELIABILITY)
        if not self.ctx.has_timer("resend"):
            self.set_timer("resend", self.config.sync_retry)

    def _sequence(
        self,
        origin: Address,
        start: int,
        items: list[Any],
        decoded: list[Item] | None = None,
        *,
        resent: bool = False,
    ) -> None:
        """Add ``origin``'s messages ``start``, ``start+1``, ... to the batch being filled, minus those
        already sequenced in this epoch. ``decoded``: the same items decoded, when the caller has them."""
        high = self.seq_high.get(origin, 0)
        n = len(items)
        if start + n - 1 <= high:
            self.count("duplicate_forwards", n)
            return
        if start <= high:
            self.count("duplicate_forwards", high - start + 1)
            items = items[high - start + 1 :]
            if decoded is not None:
                decoded = decoded[high - start + 1 :]
            start = high + 1
            n = len(items)
        if decoded is None:
            decoded = decode_items(items)
        self.seq_high[origin] = start + n - 1
        self.count("sequenced_resent" if resent else "sequenced", n)
        limit = self._max_batch
        size = self._batch_bytes
        runs = self._runs
        if self._run_origin is origin and self._run_next == start and runs:
            run = runs[-1]
            run_items, run_decoded = run[2], run[3]
        else:
            run_items, run_decoded = [], []
            runs.append([origin.to_wire(), start, run_items, run_decoded])
            self._run_origin = origin
        if len(set(map(type, items))) == 1 and type(items[0]) is bytes:
            total = sum(map(len, items)) + _ITEM_OVERHEAD * n
            if size + total <= limit:
                run_items.extend(items)
                run_decoded.extend(items)
                self._batch_bytes = size + total
                self._run_next = start + n
                return
        for item, dec in zip(items, decoded, strict=True):
            isize = len(item) + _ITEM_OVERHEAD if type(item) is bytes else _item_size(item)
            if size + isize > limit and size:
                if not run_items:
                    runs.pop()
                self._ready.append(runs)
                runs = self._runs = []
                size = 0
                run_items, run_decoded = [], []
                runs.append([origin.to_wire(), start, run_items, run_decoded])
            run_items.append(item)
            run_decoded.append(dec)
            size += isize
            start += 1
        self._batch_bytes = size
        self._run_next = start

    def _flush_batch(self) -> None:
        """Multicast the full batches and the one being filled."""
        ready = self._ready
        if self._runs:
            ready.append(self._runs)
            self._runs = []
        self._run_origin = None
        self._batch_bytes = 0
        if not ready:
            return
        self._ready = []
        for runs in ready:
            self._bcast(_pack([wire_run(run) for run in runs]), runs=runs)

    def _bcast(self, payload: bytes, replay: BatchId | None = None, runs: list[list[Any]] | None = None) -> None:
        self.next_seq += 1
        if runs is not None:
            # Our own BCAST comes back to us by loopback within this step: keep what we packed, so we do not
            # unpack and validate again what we built from checked forwards (see _own_batch).
            if len(self._own_runs) >= _MAX_OWN_RUNS:
                self._own_runs.clear()
            self._own_runs[self.next_seq] = runs
        self.commit_sent = self.commit
        self._send(None, SequencerHeader(BCAST, self.epoch, self.next_seq, self.commit, replay), payload)
        self.count("batches_sent")

    def _on_ack(self, src: Address, seq: int) -> None:
        acks = self.acks
        prev = acks.get(src)
        if prev is None or seq <= prev or seq > self.next_seq:
            return
        acks[src] = seq
        if prev != self.commit or self.frozen:
            return  # the minimum did not move, or a flush holds our commits (see _freeze)
        commit = min(acks.values())
        if commit > self.commit:
            self.commit = commit
            # The coordinator is a member too: it learns the commit here, not from its own COMMIT.
            self._learn_commit(commit)
