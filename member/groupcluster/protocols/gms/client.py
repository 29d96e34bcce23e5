"""GMS's client role: a member not yet in a group discovers the coordinator and joins (or founds a group)."""

from __future__ import annotations

from collections import Counter

from ...core.address import Address
from ...core.events import FindMembers, MembersFound, SetDigest
from ...core.view import View, ViewId
from .participant import ParticipantRole
from .wire import JOIN_REQ, GmsHeader


class ClientRole(ParticipantRole):
    """What a joining member does until its first view."""

    # -- joining -------------------------------------------------------------------------------------
    def _discover(self) -> None:
        self.join_attempts += 1
        self.below.down_event(FindMembers("join"))

    def _on_members_found(self, event: MembersFound) -> None:
        if self.state != "joining":
            return
        me = self.local_address
        # An answer naming us as coordinator comes from a view we never installed (its coordinator named us its
        # successor and left): a join request to ourselves is rejected forever, so such answers count as none.
        coords = Counter(
            r.coordinator
            for r in event.responses
            if r.coordinator is not None and r.coordinator != me and r.address != me
        )
        if coords:
            # The coordinator most responders name; ties go to the lowest address (deterministic).
            best = max(coords.values())
            self.join_target = min(c for c, n in coords.items() if n == best)
            self._send(self.join_target, GmsHeader(JOIN_REQ, seqno=self._own_seqno()))
            self.set_timer("join", self.config.join_timeout)
            return
        others = [r.address for r in event.responses if r.address != me]
        # Nobody answered: ask once more before founding a group, so members started together (whose first
        # requests crossed while they were still starting) find each other instead of splitting.
        alone = not others and self.join_attempts >= 2
        if alone or (others and me < min(others)) or self.join_attempts >= self.config.max_join_attempts:
            # Nobody is coordinator and we are the lowest (or we waited long enough): found the group.
            self._install(View(ViewId(self.max_seq + 1, me), (me,)))
            return
        self.set_timer("rediscover", self.config.join_retry * (1 + self.ctx.rng.random()))

    def _on_join_rsp(self, src: Address, hdr: GmsHeader) -> None:
        if self.state != "joining":
            return
        self.cancel_timer("join")
        if hdr.view is None or hdr.digest is None:
            self.count("join_rejected")
            self.ctx.log.info("join rejected by %s: %s", src, hdr.reason)
            self.set_timer("rediscover", self.config.join_retry * (1 + self.ctx.rng.random()))
            return
        if self.local_address not in hdr.view.members:
            return
        self.below.down_event(SetDigest(hdr.digest))
        self._install(hdr.view)
