"""GMS's coordinator role: join, leave, suspect and flush requests queued and bundled into views, each view
flushed (use_flush), cast and acknowledged before the next, joiners answered with the view and a digest."""

from __future__ import annotations

from ...core.address import Address
from ...core.digest import Digest
from ...core.events import FlushRequest, GetDigest
from ...core.view import View, ViewId
from .state import GmsState, _PendingView
from .wire import JOIN_RSP, VIEW, GmsHeader


class CoordinatorRole(GmsState):
    """What the coordinator (or a member acting as coordinator) does with the membership requests."""

    # -- coordinator: requests -> views --------------------------------------------------------------
    def _on_join_req(self, joiner: Address, seqno: int) -> None:
        if not self.is_coordinator or self.view is None:
            coord = None if self.view is None else self.view.coordinator
            self._send(joiner, GmsHeader(JOIN_RSP, member=coord, reason="not coordinator"))
            return
        if joiner in self.view.members:
            cached = self.join_rsp_cache.get(joiner)
            if cached is not None:
                self._send(joiner, GmsHeader(JOIN_RSP, view=cached[0], digest=cached[1]))
            else:
                # A member of our view that is still joining never got its JOIN_RSP (its coordinator died
                # first). No digest from back then exists here, so remove it; its next JOIN_REQ adds it anew.
                self.count("stale_joiners_removed")
                self._enqueue("suspect", joiner)
            return
        # A new incarnation on an endpoint means the old one is gone: remove it in the same view.
        for m in self.view.members:
            if m.endpoint == joiner.endpoint and m != joiner:
                self.suspects.add(m)
                self._enqueue("suspect", m)
        self._enqueue("join", joiner, seqno)

    def _enqueue(self, kind: str, member: Address, seqno: int = 0) -> None:
        self.queue.append((kind, member, seqno))
        if not self.ctx.has_timer("bundle"):
            self.set_timer("bundle", self.config.view_bundling)

    def _request_flush(self, members: tuple[Address, ...], for_merge: bool) -> bool:
        """Ask FLUSH to flush ``members`` (minus suspects); False when there is nobody else to flush."""
        participants = tuple(m for m in members if m not in self.suspects)
        # Alone, a view change needs no flush: the VIEW message itself orders our multicasts before and after
        # it. A merge does: our digest goes out before the merged view comes, and what we multicast between
        # the two must wait for the merged view, or its new members would deliver it as part of that view.
        if len(participants) < (1 if for_merge else 2):
            return False
        self.flush_counter += 1
        self.flushing = (self.local_address, self.flush_counter)
        self.flush_for_merge = for_merge
        # Never wait on FLUSH forever: if neither FlushCompleted nor FlushFailed comes, flush again.
        self.set_timer("flush", self.config.flush_guard_timeout)
        self.above.up_event(FlushRequest(self.flushing, participants))
        return True

    def _process_queue(self) -> None:
        # After a flush the members are blocked until a view arrives: a completed flush needs a view even with
        # nothing queued (a merge it was made for was cancelled).
        if not (self.queue or self.flush_ready) or not self.is_coordinator:
            return
        if self.pending is not None or self.merge is not None:
            return
        if self.flushing is not None:
            return  # requests keep queueing (bundled) until the flush completes
        assert self.view is not None
        me = self.local_address
        base = self.tmp_members or self.view.members
        if self.config.use_flush and not self.flush_ready and self._request_flush(base, for_merge=False):
            return
        flushed, self.flush_ready = self.flush_ready, False
        requests, self.queue = self.queue, []
        removed = {m for kind, m, _ in requests if kind in ("leave", "suspect") and m in base}
        if self.state == "leaving":
            removed.add(me)  # we became coordinator while leaving: our own view must not contain us
        joiners: dict[Address, int] = {}
        for kind, m, seqno in requests:
            if kind == "join" and m not in base and m not in removed:
                joiners[m] = seqno
        members = tuple(m for m in base if m not in removed) + tuple(joiners)
        asked = any(kind == "flush" for kind, _, _ in requests)  # Channel.flush(): a view ends it, even alone
        if members == base and not (flushed or asked):
            return
        # After a flush the members are blocked until a view arrives: install one even if nothing changed.
        if not members:
            self._left("left")
            return
        self.max_seq += 1
        view = View(ViewId(self.max_seq, me), members)
        start_points = Digest({j: (s, s) for j, s in joiners.items()}) if joiners else None
        self.tmp_members = members
        self.casting = view.view_id
        self._send(None, GmsHeader(VIEW, view=view, digest=start_points))
        # Same step, after NAKACK numbered the view message: our own entry includes it (no race, no "+1").
        current = self.below.down_event(GetDigest())
        entries = {m: current[m] for m in members if isinstance(current, Digest) and m in current}
        for j, s in joiners.items():
            entries[j] = (s, s)
        awaiting = set(members) - {me} - set(joiners)
        self.pending = _PendingView(view, tuple(joiners), Digest(entries), awaiting)
        self.count("views_sent")
        if awaiting:
            self.set_timer("ack", self.config.view_ack_timeout)
        else:
            self._finish_pending()

    def _finish_pending(self) -> None:
        pending, self.pending = self.pending, None
        self.cancel_timer("ack")
        if pending is None:
            return
        if self.leave_after_pending:
            self._left("left")
            return
        if pending.awaiting:
            self.count("view_ack_timeouts")
        self.join_rsp_cache = {j: (pending.view, pending.join_digest) for j in pending.joiners}
        for j in pending.joiners:
            self._send(j, GmsHeader(JOIN_RSP, view=pending.view, digest=pending.join_digest))
        if self.queue and not self.ctx.has_timer("bundle"):
            self.set_timer("bundle", self.config.view_bundling)

    def _cast_view(self, view: View, digest: Digest | None) -> None:
        self.max_seq = max(self.max_seq, view.view_id.seq)
        self.tmp_members = view.members
        self.casting = view.view_id
        self._send(None, GmsHeader(VIEW, view=view, digest=digest))
