"""GMS: group membership — join, graceful leave, crash removal, coordinator failover, view bundling, merge.

The coordinator (first member of the view) turns queued requests into views. Requests that arrive within
``view_bundling`` of each other become one view; while a view is being installed (waiting for acks) further
requests queue and are computed against the membership of the view last *sent* — the temporary membership
list of seed 002 — so concurrent joins and leaves never undo each other.

A view travels as a NAKACK multicast to the members of the old view (so a leaver sees the view without
itself), and each member acknowledges it. Joiners get a JOIN_RSP with the view and a digest only after the
acks. The digest is taken in the same step in which the view message was sent, after NAKACK gave it a seqno,
so the coordinator's entry always counts the view message: the race seed 002 patched with "+1" cannot happen
(the layer runs single-threaded, and there is no window between sending and reading the digest).

A joiner announces its own next seqno in its JOIN_REQ and the view carries it to every member, so a member
that rejoins after being excluded is never asked to resend (and nobody redelivers) what it sent before.

Merge (seed 002, MERGE2): the merge leader is the lowest coordinator address; it collects MERGE_RSP (view +
digest) from the other coordinators, computes the merged view (max view seq + 1) and digest, sends
INSTALL_MERGE_VIEW to them, and each coordinator multicasts the merge view and digest in its subgroup.
Every merge has an id and a timeout, so a crashed leader or coordinator cannot block membership.

The layer is a package: ``wire`` (the message kinds, :class:`GmsHeader`), ``state`` (the configuration and
every field of the layer), the roles ``coordinator`` (requests bundled into views, flushed, cast, acknowledged),
``participant`` (views installed, suspicions and takeover, orphaned members, the leave), ``client`` (discovery
and the join) and ``merging`` (the merge of subgroups), each class on the one before (single inheritance, so
that mypyc can compile them), and ``layer``: :class:`Gms`, the entry points, dispatching to the roles.
"""

from .layer import Gms
from .state import GmsConfig

__all__ = ["Gms", "GmsConfig"]
