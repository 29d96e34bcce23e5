"""GMS's merge: the leader (lowest coordinator) collects every subgroup's view and digest (each subgroup flushed
first with use_flush), computes the merged view and digest and has every coordinator cast it."""

from __future__ import annotations

from ...core.address import Address
from ...core.digest import Digest
from ...core.events import GetDigest, MergeNeeded
from ...core.view import View, ViewId
from .client import ClientRole
from .state import _Merge
from .wire import CANCEL_MERGE, INSTALL_MERGE_VIEW, MERGE_REQ, MERGE_RSP, GmsHeader


class MergeRole(ClientRole):
    """What coordinators do to merge their subgroups into one view."""

    # -- merge ---------------------------------------------------------------------------------------
    def _on_merge_needed(self, event: MergeNeeded) -> None:
        view = self.view
        if view is not None and self.state == "member" and not self.is_coordinator:
            if view.coordinator in event.coordinators:
                self._continue_alone("orphaned", "our coordinator announces a view without us")
            return
        if not self.is_coordinator or self.view is None or self._busy():
            return
        me = self.local_address
        coords = sorted(set(event.coordinators) | {me})
        if len(coords) < 2 or coords[0] != me:
            return  # the lowest coordinator leads; it sees the same coordinators
        self.merge_counter += 1
        merge_id = (me, self.merge_counter)
        self.merge = _Merge(merge_id, me, waiting=set(coords) - {me})
        self.count("merges_started")
        for c in coords[1:]:
            self._send(c, GmsHeader(MERGE_REQ, merge_id=merge_id))
        self.set_timer("merge", self.config.merge_timeout)
        self._prepare_merge()

    def _busy(self) -> bool:
        return self.pending is not None or self.merge is not None or self.flushing is not None

    def _prepare_merge(self) -> None:
        """Flush our subgroup (use_flush) before our view and digest go into the merge, else answer at once.

        Virtual synchrony across a merge: the members of each subgroup must deliver the same messages of
        their old view before the merged view, and send nothing more in it — the same flush as for any view
        change, run by each subgroup's coordinator over its own members. Their digest then is final.
        """
        assert self.view is not None and self.merge is not None
        if self.config.use_flush and self._request_flush(self.view.members, for_merge=True):
            self.merge.participants = tuple(m for m in self.view.members if m not in self.suspects)
            return
        self._merge_flushed()

    def _merge_flushed(self) -> None:
        m = self.merge
        if m is None or self.view is None:
            # The merge ended while we flushed: the blocked members still need a view.
            self.flush_ready = True
            self._process_queue()
            return
        m.flushed = self.config.use_flush
        me = self.local_address
        view = self.view
        if m.participants is not None and m.participants != view.members:
            # Only the members we flushed go into the merge. A suspect left out of the flush may never have
            # installed our view (its JOIN_REQ reached two coordinators and it joined the other one), so our
            # digest entry for it is no cut of its stream: a merged view listing it would start its stream
            # there, while members that delivered more of it in an earlier view start higher, and every flush
            # of the merged view would wait for messages nobody in it can retransmit. (The view id still tells
            # the leader our seq; the subgroup is never installed as such.)
            view = View(view.view_id, m.participants)
        digest = self._my_digest(view.members)
        if m.leader == me:
            m.responses[me] = (view, digest)
            if not m.waiting:
                self._finish_merge()
        else:
            self._send(m.leader, GmsHeader(MERGE_RSP, merge_id=m.merge_id, view=view, digest=digest))

    def _merge_flush_failed(self) -> None:
        m = self.merge
        if m is None:
            return
        if m.leader != self.local_address:
            self._send(m.leader, GmsHeader(MERGE_RSP, merge_id=m.merge_id, reason="flush failed"))
        self._abort_merge()

    def _my_digest(self, members: tuple[Address, ...]) -> Digest:
        digest = self.below.down_event(GetDigest())
        assert isinstance(digest, Digest)
        return Digest({m: digest[m] for m in members if m in digest})

    def _on_merge_req(self, src: Address, hdr: GmsHeader) -> None:
        busy = self.pending is not None or self.flushing is not None
        busy = busy or (self.merge is not None and self.merge.merge_id != hdr.merge_id)
        if not self.is_coordinator or busy or self.view is None:
            self._send(src, GmsHeader(MERGE_RSP, merge_id=hdr.merge_id, reason="busy or not coordinator"))
            return
        assert hdr.merge_id is not None
        if self.merge is not None:
            return  # a repeated request for the merge we already prepare
        self.merge = _Merge(hdr.merge_id, src)
        self.set_timer("merge", self.config.merge_timeout)
        self._prepare_merge()

    def _on_merge_rsp(self, src: Address, hdr: GmsHeader) -> None:
        m = self.merge
        if m is None or m.merge_id != hdr.merge_id or m.leader != self.local_address or src not in m.waiting:
            return
        m.waiting.discard(src)
        if hdr.view is not None and hdr.digest is not None:
            m.responses[src] = (hdr.view, hdr.digest)
        if not m.waiting and self.local_address in m.responses:
            self._finish_merge()

    def _finish_merge(self) -> None:
        m = self.merge
        assert m is not None
        me = self.local_address
        others = sorted(c for c in m.responses if c != me)
        if me not in m.responses or not others:
            self._abort_merge()
            return
        members: list[Address] = list(m.responses[me][0].members)
        seen = set(members)
        digest = Digest({})
        seq = self.max_seq
        for c in [me, *others]:
            view, dig = m.responses[c]
            seq = max(seq, view.view_id.seq)
            for x in view.members:
                if x not in seen:
                    seen.add(x)
                    members.append(x)
            digest = digest.union(Digest({x: dig[x] for x in view.members if x in dig}))
        subgroups = tuple(m.responses[c][0].members for c in [me, *others])
        merged = View(ViewId(seq + 1, me), tuple(members), subgroups)
        self.count("merges_led")
        for c in others:
            self._send(c, GmsHeader(INSTALL_MERGE_VIEW, merge_id=m.merge_id, view=merged, digest=digest))
        self._cast_view(merged, digest)
        m.flushed = False  # the merged view unblocks our subgroup
        self._end_merge()

    def _abort_merge(self) -> None:
        """Give up a merge; as leader, tell the coordinators that answered, whose subgroups may be blocked."""
        m = self.merge
        if m is not None and m.leader == self.local_address:
            for c in sorted(m.responses):
                if c != self.local_address:
                    self._send(c, GmsHeader(CANCEL_MERGE, merge_id=m.merge_id))
        self.count("merges_aborted")
        self._end_merge()

    def _end_merge(self) -> None:
        m, self.merge = self.merge, None
        self.cancel_timer("merge")
        if self.flushing is not None and self.flush_for_merge:
            # Our subgroup flush is still running: when it completes, _merge_flushed installs a view.
            return
        if m is not None and m.flushed:
            # We flushed our subgroup but no merged view came: its members are blocked until a view arrives.
            self.flush_ready = True
            self._process_queue()
        elif self.queue and not self.ctx.has_timer("bundle"):
            self.set_timer("bundle", self.config.view_bundling)
