"""STATE: non-blocking state transfer — a joiner gets the application state from a member, at a consistent cut.

The layer sits at the top of the stack. It has three jobs:

**Numbering.** Every reliable multicast the application sends is stamped with a small header carrying the
sender's *state sequence number* (1, 2, ... per sender incarnation). Every receiver therefore knows the
absolute position of each delivered multicast in its sender's stream, whatever the layers below did
(fragmentation, a sequencer that re-multicasts under its own seqnos, a joiner's NAKACK that starts in the
middle of each stream). Each member keeps ``delivered[sender]``: the highest number it passed to the
application.

**Donor.** A joiner asks for the state with a REQ *multicast* naming the donor: it travels in the same
ordered stream as the application's multicasts. Where the donor delivers it, it emits :class:`GetState` to the
application — after every multicast it delivered before the request, before any after it — and records its
vector ``delivered`` at that point (the *cut*). The driver answers synchronously with :class:`StateSnapshot`
(the application's bytes, taken before it handles any later output). The donor streams the bytes as
STATE_CHUNKs over reliable unicast, at most ``window`` chunks unacknowledged; the cut travels in chunk 0.
Multicasting the request is what makes the cut consistent on every stack: whatever the donor still had to
deliver from before the joiner's view (a flush's leftovers, a sequencer's replay of an earlier epoch, which
the joiner never receives) comes before the request, so it is in the state. A request also carries the
joiner's *floors* (below); if the donor's cut is below them it waits, after the request, until its delivery
reaches them, so a donor that is behind the joiner sends a state that covers what the joiner lacks.

**Joiner.** After :class:`RequestState` from the application, the member holds everything that would go up
to the application — multicast deliveries and view changes, in order — from its first view on, and asks a
donor (the coordinator by default, else the next member) for the state. For each sender it records a *floor*:
the number just below the first multicast it holds from that sender (raised when it has to drop held
messages, see ``max_buffered``); every multicast at or below a floor must be in the state. When the last
chunk arrives the state is acceptable iff ``cut[s] >= floor[s]`` for every sender ``s`` still in the view;
then it emits :class:`SetState`, and replays what it held: a held multicast numbered at or below the cut is
already in the state and goes up as :class:`StateCovered` (recorders note it; the application does not apply
it again), the rest as normal deliveries, view changes in between at their place. From then on it delivers
normally (a late message at or below the cut still counts as covered). A stale state (a floor above the
cut) is asked for again after ``retry_delay``; a donor that refuses, crashes, leaves the view or makes no
progress for ``request_timeout`` is replaced by the next member. A member whose first view holds only itself
founded the group: it gets ``SetState(None)`` at once.

Why no flush: the group never stops. The cut is a point in the donor's own delivery stream, and per-sender
numbering maps it onto the joiner's stream exactly (what the joiner holds either is in the state or comes
after it), so nobody has to be quiet while the state is taken. With virtual synchrony (the ``vsync`` stack)
the joiner holds only messages of its first view and later, and the donor installed that view before it
answers (it refuses requesters outside its view), so the cut is never stale; on stacks without flush a stale
cut is detected through the floors and re-requested.

Everything a peer can make us allocate is bounded: the announced state size (``max_state_size``), the chunk
count (:data:`MAX_CHUNKS`), vectors and floors (:data:`MAX_VECTOR`), the held messages (``max_buffered`` bytes
and ``max_buffered_messages``; beyond them held multicasts are dropped, their floors raised, and the state —
which will contain them — makes up for it) and concurrent donor transfers (``max_transfers``).

The layer is a package: ``wire`` (the header, its bounds and codecs, what a cut covers), ``events`` (what the
layer and the application tell each other), ``state`` (the configuration, every field, the per-sender
accounting both roles use), the two roles ``donor`` (wait for the floors, snapshot at the cut, stream the
chunks) and ``joiner`` (fetch, hold, check and set the state, replay), each class on the one before (single
inheritance, so that mypyc can compile them), and ``layer``: :class:`StateTransfer`, the entry points,
numbering every multicast and handing the rest to the roles.
"""

from .layer import StateTransfer
from .state import StateConfig

__all__ = ["StateConfig", "StateTransfer"]
