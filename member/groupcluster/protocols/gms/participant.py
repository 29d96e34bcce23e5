"""GMS's participant role: views accepted and installed, suspicions (taking over as coordinator when every
member before us is suspected), continuing alone when orphaned, and the graceful leave."""

from __future__ import annotations

from ...core.address import Address
from ...core.digest import Digest
from ...core.events import Joined, MergeDigest, ViewChange
from ...core.view import View, ViewId
from .coordinator import CoordinatorRole
from .wire import LEAVE_REQ, SUSPECT, VIEW_ACK, GmsHeader


class ParticipantRole(CoordinatorRole):
    """What every member of a view does."""

    # -- installing views ----------------------------------------------------------------------------
    def _acceptable(self, view: View) -> bool:
        cur = self.view
        if cur is None:
            return True
        if view.view_id == cur.view_id:
            return False
        if view.view_id.seq > cur.view_id.seq:
            return True
        # Same seq from another creator: after a coordinator crashed mid-install, its successor (a member of
        # our view) may reuse the seq; a creator outside our view is a stale or foreign view.
        return view.view_id.seq == cur.view_id.seq and view.view_id.creator in cur.members

    def _on_view(self, src: Address, view: View, digest: Digest | None) -> None:
        self.max_seq = max(self.max_seq, view.view_id.seq)
        if self.state not in ("member", "leaving") or not self._acceptable(view):
            self.count("views_ignored")
            return
        me = self.local_address
        if digest is not None and not view.is_merge and me in digest:
            # A view that adds us as a joiner answers a JOIN_REQ of ours that arrived late (we joined another
            # group meanwhile): we are not joining; moving into it would skip the flush of the view we are in.
            self.count("views_ignored_as_joiner")
            return
        if me not in view.members:
            if self.state == "leaving":
                if self.pending is not None and self.pending.view.view_id == view.view_id:
                    # Our own view without us: stay (and retransmit it) until the members acknowledged it.
                    self.leave_after_pending = True
                else:
                    self._left("left")
            else:
                # Excluded (e.g. falsely suspected): carry on alone; MERGE brings us back.
                self._continue_alone("excluded", f"excluded by view {view}")
            return
        if digest is not None:
            # After a flushed merge the digest is every subgroup's cut: windows behind it move up to it.
            self.below.down_event(MergeDigest(digest, cut=self.config.use_flush and view.is_merge))
        self._install(view)
        if src != me:
            self._send(src, GmsHeader(VIEW_ACK, view_id=view.view_id))

    def _install(self, view: View) -> None:
        me = self.local_address
        self.view = view
        self.casting = None  # any view installed unblocks FLUSH
        self.acting_coordinator = False
        self.flush_ready = False  # a flush readies only the view that follows it
        self.max_seq = max(self.max_seq, view.view_id.seq)
        self.suspects &= set(view.members)
        if self.pending is None:
            self.tmp_members = view.members
        self.below.down_event(ViewChange(view))
        joined = self.state == "joining"
        if joined:
            # Member before the layers above see the view: they may send in it at once (SEQUENCER's SYNC).
            self.state = "member"
        self.above.up_event(ViewChange(view))
        if joined:
            self.cancel_timer("join")
            self.cancel_timer("rediscover")
            self.above.up_event(Joined(view))
            # UNICAST acknowledged the early unicasts, so none is ever resent: deliver them whoever sent them,
            # as a member delivers unicasts from outside its view. A late JOIN_RSP can bring a view older than
            # the sender's (the coordinator has since merged the sender in, and the sender sent to us in that
            # view, which we install next). Multicasts belong to the stream of a view that has their sender.
            early, self.early = self.early, []
            early = [m for m in early if m.dest is not None or m.src in view.members]
            if early:
                self.above.up(early)
        if self.merge is not None:
            self.merge.flushed = False  # whatever view this is, it unblocked the members we flushed
        if self.flushing is not None:
            # A view (e.g. a merge) arrived during our flush: that round is void; flush again for the queue.
            self.flushing = None
            self.cancel_timer("flush")
            if self.queue and not self.ctx.has_timer("bundle"):
                self.set_timer("bundle", self.config.view_bundling)
        if view.coordinator == me:
            # Members suspected before we became coordinator are removed in our first view.
            for s in sorted(self.suspects):
                self._enqueue("suspect", s)
            if self.state == "leaving":
                self._enqueue("leave", me)
        else:
            self.queue.clear()
            self.pending = None
            self.flushing = None
            self.flush_ready = False
            self.cancel_timer("ack")

    # -- failures ------------------------------------------------------------------------------------
    def _on_suspect(self, member: Address) -> None:
        view = self.view
        me = self.local_address
        if view is None or member not in view.members or member == me or self.state not in ("member", "leaving"):
            return
        self.suspects.add(member)
        self.count("suspects")
        if self.is_coordinator:
            self._enqueue("suspect", member)
            return
        alive = [m for m in view.members if m not in self.suspects]
        if alive and alive[0] == me:
            # Every member before us is suspected: we take over as coordinator.
            self.ctx.log.info("taking over as coordinator from %s", view.coordinator)
            self.count("takeovers")
            self.pending = None
            self.tmp_members = view.members
            self.acting_coordinator = True
            for s in sorted(self.suspects):
                self._enqueue("suspect", s)
        elif alive:
            self._send(alive[0], GmsHeader(SUSPECT, member=member))
            if member == view.coordinator and not self.ctx.has_timer("orphan"):
                # If no successor installs a view for us (it may have moved on to another view), we are
                # orphaned: continue alone and let MERGE bring us back.
                self.set_timer("orphan", self.config.orphan_timeout)

    def _on_suspect_report(self, member: Address | None) -> None:
        """Another member suspects ``member``; only the coordinator acts on it."""
        if not self.is_coordinator or member is None or self.view is None or member == self.local_address:
            return
        if member in self.view.members:
            self.suspects.add(member)
            self._enqueue("suspect", member)

    def _continue_alone(self, counter: str, reason: str) -> None:
        """We are out of our group's view (or it has no coordinator for us): be a singleton until merged."""
        self.count(counter)
        self.ctx.log.info("%s: continuing alone until merged", reason)
        self.max_seq += 1
        self._install(View(ViewId(self.max_seq, self.local_address), (self.local_address,)))

    # -- leaving -------------------------------------------------------------------------------------
    def _leave(self) -> None:
        if self.state == "joining" or self.state == "idle":
            self._left("left before joining")
            return
        if self.state != "member" or self.view is None:
            return
        me = self.local_address
        if len(self.view.members) == 1:
            self._left("left")
            return
        self.state = "leaving"
        self.leave_attempts = 1
        if self.is_coordinator:
            # The coordinator removes itself: the next member becomes coordinator of the view it receives.
            self.queue.append(("leave", me, 0))
            self.cancel_timer("bundle")
            self._process_queue()
        else:
            self._send(self.view.coordinator, GmsHeader(LEAVE_REQ))
        self.set_timer("leave", self.config.leave_timeout)
