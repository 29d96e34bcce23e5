"""SEQUENCER: total order through the coordinator (seed 004), uniform, batched, resynchronised on every view.

A member does not multicast its application messages itself: it forwards them (reliable unicast, through
UNICAST below) to the coordinator of its view, each tagged with its own *forward seqno*; the coordinator
multicasts them (through NAKACK below: one reliable FIFO stream from one sender is a total order) in
*batches*, and every member delivers them in that order with ``msg.src`` set to the original sender. What a
member forwarded stays in its *forward-table* until it delivered it; a per-sender *received-table* (highest
forward seqno delivered) discards copies that come back after a failover; entries of senders that left the view
are kept aside, bounded, for when they or their old batches return. Messages with ``NO_RELIABILITY`` and
unicasts pass straight through.

Batching is what makes it cheap: everything a member multicasts in one driver step travels to the
coordinator as one FORWARD message (up to ``max_batch_size``), and everything the coordinator sequences in
one step leaves as one BCAST. A batch is a msgpack list of *runs* ``[origin, first forward seqno, items]``,
an item being the payload bytes (or ``[flags, headers, payload]`` when upper layers, e.g. FRAG, added
headers), so the per-message cost is a few bytes and no header object.

Where this goes beyond seed 004, and why (``docs/total-order.md`` has the argument in full):

* **Epochs.** Every view is an epoch, named by its view id; batches are numbered 1, 2, ... per epoch and a
  member accepts BCASTs only from its current view's coordinator for its current view id.
* **Uniform delivery.** A member delivers batch k only when the coordinator *committed* it, i.e. every member
  of the view acknowledged receiving it (ACK, cumulative, unreliable and repeated; COMMIT rides on the next
  BCAST or goes alone, reliably). So whatever any member delivered - the coordinator included, even if it
  crashes a moment later - every other member of that view holds too, and the survivors can finish it in the
  same order. Without this, seed 004's design lets a crashed coordinator deliver messages that the survivors
  later deliver in another order (members resend them in arbitrary interleavings).
* **Sync on every view change** (a small flush, done by the sequencer itself). Each member sends the new
  coordinator a SYNC: the batches it received but has not delivered yet (by their original identity: the
  epoch that sequenced them and their number there), its forward-table, the epochs it has been in, and the
  forward seqnos it skipped past (delivered later ones of their sender first, and now drops). The
  coordinator waits for every member's SYNC (members that never send one are removed by the next view, which
  restarts the sync), then re-multicasts the union of those batches in (epoch, number) order, then the
  forward-tables' messages, both without what any member skipped past, then new traffic. A replayed batch is
  delivered by every member of the view that has not delivered it (members of its epoch skip it by number,
  others drop what their received-table has): a member that skipped it could deliver its messages later in
  another position, when their sender, absent from this view, forwards them again. A forwarded message that
  a replay delivers to its sender is not sequenced a second time.

* **Gaps.** A member's SYNC announces its highest forward seqno, so the coordinator knows where its next
  FORWARD must start; one that starts later (forwards were lost, e.g. while the receiver was not coordinator
  yet) is held and the sender asked to RESEND from the first missing seqno.
* **Fragments** of one message (only in a stack that puts FRAG above us; the preset has it below, so whole
  messages are sequenced) are delivered together once all are committed: when a view change splits them, the
  rest comes by replay after the view, and FRAG forgets partial messages of senders outside the new view.

Multicasts sent before the first view wait in the forward-table and travel with the first SYNC; more than
``max_queued`` bytes of undelivered own multicasts raise ``Backpressure(True)``. A graceful leave waits (up to
``leave_timeout``) until the member's own multicasts were delivered.

The layer is a package, one module per part (each role builds on the ones before it: a coordinator is a member
too, and the view sync needs both):

* ``wire``: the header, the bounds, the codec of FORWARD, BCAST and SYNC payloads;
* ``state``: the configuration and every field of the layer, shared by the roles;
* ``forwarding``: the forward-table and the forward window (own multicasts until delivered, RESEND, leave);
* ``member``: batches received, commits, uniform delivery, the received-table, fragments, ACKs;
* ``coordinator``: FORWARDs sequenced into batches, gaps held until resent, the commit, the flush hold;
* ``view_sync``: the new epoch of every view, the members' SYNCs and the coordinator's replay;
* ``layer``: :class:`Sequencer`, the entry points, dispatching to the roles.
"""

from .layer import Sequencer
from .state import SequencerConfig

__all__ = ["Sequencer", "SequencerConfig"]
