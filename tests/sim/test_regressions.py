"""Seeds that once broke a property replay here, so the bug they found stays fixed.

Every seed that fails during development is added to :data:`REGRESSIONS` with what it found and the
scenario it ran under; each entry replays exactly that run (``groupcluster sim --seeds 1 --start <seed>
--safety-time 15 --send-rate 8`` shows a ``MID`` entry in full).
"""

from __future__ import annotations

from groupcluster.sim.scenario import Scenario, run_seed

from . import seedruns
from .simtoy import TOY_STACK

# Scenarios are pinned, not the current defaults: a seed replays its original run only with its scenario. Seeds found
# before the startup faults existed pin startup_faults=False (the switch keeps every other draw of the seed).
EARLY = Scenario(safety_time=10.0, send_rate=5.0, startup_faults=False)  # the first defaults
# The defaults while the fifo layers were debugged.
MID = Scenario(safety_time=15.0, send_rate=8.0, startup_faults=False)
LATE8 = Scenario(members=8, safety_time=25.0, send_rate=10.0, startup_faults=False)  # the current defaults, 8 members

JOINER_UNICAST = "a unicast to a joiner arriving before its JOIN_RSP was acked by UNICAST, then dropped by GMS"
LEAVER_DUPLICATES = "a removed (leaving) member's unicast retransmission re-opened a closed connection: delivered twice"
JOINER_STUCK = "JOIN_RSP lost while the coordinator already added the joiner: it stays 'joining' forever"
VIEW_LOST = "a member missed a VIEW (ack timeout) and is never brought up to date; STABLE stalls, lost tails stay lost"
ORPHAN = "a member dropped from its coordinator's view (or whose coordinator's successor moved on) never rejoins"
TWO_GROUPS = (
    "a restarted member joined two groups at once (views from two coordinators); a unicast sent to it in the "
    "second group's view before it installed that view was never delivered"
)
RETURNING = "NAKACK: a returning member's window started below what was already delivered (duplicates, FIFO breaks)"
VSYNC = Scenario(stack="vsync", startup_faults=False)  # the vsync stack at the defaults of its first sweeps
EARLY_CONVERGENCE = (
    "liveness traffic was sent into a view that exclusions decided during the faults were about to split "
    "(the scenario now waits for a stable converged view)"
)
FLUSH_FIFO = "FLUSH held next-view multicasts while a superseding round let later ones through (FIFO break)"
FLUSH_LIVELOCK = "two would-be coordinators superseded each other's flush rounds forever (nobody unblocked)"
FLUSH_GUARD = "GMS waited forever on a flush whose round a merge view had voided"
MERGE_CUT = (
    "a member listed in two subgroups (its JOIN_REQ reached both coordinators) kept a stale window after a flushed "
    "merge; the next flush fetched its other-subgroup messages and delivered them in the merged view"
)
HELD_FOREIGN = (
    "FLUSH held next-view multicasts of a member whose view never reached us, then released them in another "
    "view of ours that did not contain the sender"
)

# (seed, scenario, what the seed found)
REGRESSIONS: list[tuple[int, Scenario, str]] = [
    (19, EARLY, JOINER_UNICAST),
    (11, MID, JOINER_UNICAST),
    (73, EARLY, LEAVER_DUPLICATES),
    (131, EARLY, LEAVER_DUPLICATES + " (also out of FIFO order)"),
    (30, MID, LEAVER_DUPLICATES),
    (32, MID, LEAVER_DUPLICATES),
    (47, EARLY, JOINER_STUCK),
    (156, MID, JOINER_STUCK),
    (298, MID, JOINER_STUCK),
    (373, EARLY, VIEW_LOST),
    (170, MID, VIEW_LOST),
    (182, MID, ORPHAN),
    (185, MID, ORPHAN),
    (387, MID, ORPHAN),
    (5504, MID, RETURNING),
    (6106, MID, RETURNING),
    (6379, MID, RETURNING),
    (6654, MID, RETURNING),
    (255, LATE8, TWO_GROUPS),
    (11319, MID, EARLY_CONVERGENCE),
    (5001, VSYNC, FLUSH_FIFO),
    (9750, VSYNC, FLUSH_LIVELOCK),
    (78, VSYNC, FLUSH_GUARD),
    (93, VSYNC, FLUSH_GUARD),
    (4100000, VSYNC, MERGE_CUT),
    (200000958, VSYNC, HELD_FOREIGN),
    (201000546, VSYNC, MERGE_CUT),
]


def test_regression_seeds_pass() -> None:
    seedruns.replay_regressions(REGRESSIONS)


def test_replaying_a_seed_reproduces_its_failure_exactly() -> None:
    # The mechanism the list relies on: a failing seed, run again, fails the same way with the same history.
    broken = Scenario(members=3, stack=[*TOY_STACK, {"layer": "toy_duplicator"}], safety_time=3.0)
    first = run_seed(42, broken, digest=True)
    assert first.violations
    again = run_seed(42, broken, digest=True)
    assert (again.violations, again.digest, again.events) == (first.violations, first.digest, first.events)


# ---- total order (SEQUENCER), seeds found while the layer and its checkers were written ----------------------
TOTAL_ORDER = Scenario(stack="total-order", startup_faults=False)
STRAYS_DROPPED = (
    "forwards that reached a member before it became coordinator were dropped at an intermediate view; later "
    "forwards were sequenced past the gap and per-sender dedup lost the missing ones"
)
FRAGMENTS_SPLIT = (
    "a view change split a fragmented message: FRAG dropped the partial message of a sender outside the new view "
    "before the replay delivered the rest (fragments are now delivered together)"
)
ALONE_ORDER = (
    "checker: a member excluded and alone ordered its own message first; compared with a crashed member's order "
    "from while they were apart (crashed-prefix now compares deliveries made together or after the crash)"
)
FOREIGN_REPLAY = (
    "a replay of an epoch a member was not in was skipped by it while the others delivered it; the absent sender "
    "forwarded the message again later and that member alone delivered it, in a second position"
)
REGRESSIONS += [
    (78, TOTAL_ORDER, STRAYS_DROPPED),
    (465, TOTAL_ORDER, FRAGMENTS_SPLIT),
    (65, TOTAL_ORDER, ALONE_ORDER),
    (183, TOTAL_ORDER, ALONE_ORDER),
    (224, TOTAL_ORDER, ALONE_ORDER),
    (810034, TOTAL_ORDER, FOREIGN_REPLAY),
]


# ---- virtual synchrony, found once the vsync checker really ran in the simulator -------------------------------
MERGE_UNFLUSHED = "merge views were installed without flushing the subgroups: old-view messages crossed the merge"
MERGE_ALONE = (
    "a singleton merged without a flush: what it multicast between its MERGE_RSP and the merged view was "
    "delivered by the other subgroup as part of the merged view"
)
SPLIT_BATCH = (
    "GMS passed a batch up in two parts; FLUSH judged completion on NAKACK's count before the second part arrived "
    "and held those old-view messages as next-view ones"
)
GONE_TO_OUTSIDER = (
    "an excluded member, alone, told a member of its old view its messages were 'gone' (stable in its singleton "
    "view): that member skipped messages the rest of its view had delivered"
)
EARLY_START = "a START_FLUSH overtook the VIEW it flushes; joining it from the old view released the old holds"
BLOCK_TIMEOUT = (
    "a member blocked past the flush timeout unblocked in its old view after the others had installed the next "
    "one; it now moves into a view of its own"
)
LATE_JOIN_REQ = "a late JOIN_REQ made another coordinator add us as a joiner; we left our group without its flush"
REGRESSIONS += [
    (39, VSYNC, MERGE_UNFLUSHED),
    (31, VSYNC, MERGE_UNFLUSHED),
    (55, VSYNC, MERGE_ALONE),
    (79, VSYNC, SPLIT_BATCH),
    (246, VSYNC, GONE_TO_OUTSIDER),
    (23, VSYNC, EARLY_START),
    (302, VSYNC, BLOCK_TIMEOUT),
    (411, VSYNC, BLOCK_TIMEOUT),
    (817, VSYNC, LATE_JOIN_REQ),
]

# State transfer (the "state" layer at the top of the vsync and total-order presets).
STATE_CUT_UNICAST = (
    "a unicast state request let the donor snapshot before a sequencer replay of an earlier epoch that the joiner "
    "never receives: messages lost at the cut (the request is now a multicast marker in the ordered stream)"
)
STATE_GAPS = (
    "per-sender streams have holes across partitions: a joiner counted as covered its own partition-era messages "
    "numbered below the donor's highest (the cut now carries the holes)"
)
STATE_EARLY_DELIVERY = "a sequencer delivered before the first view reached the state layer, which did not hold yet"
STATE_STUCK = (
    "a joiner waited forever: its floors named senders gone from the view, or every member left was a joiner "
    "waiting for a state too (the most senior one now starts from an empty state)"
)
STATE_MERGE_CHECK = "checker: messages only one side of a merge ever delivers were counted as lost at the cut"
REGRESSIONS += [
    (1, TOTAL_ORDER, STATE_CUT_UNICAST),
    (3, TOTAL_ORDER, STATE_CUT_UNICAST),
    (14, TOTAL_ORDER, STATE_GAPS),
    (59, TOTAL_ORDER, STATE_EARLY_DELIVERY),
    (78, TOTAL_ORDER, STATE_STUCK),
    (31, TOTAL_ORDER, STATE_STUCK),
    (40, VSYNC, STATE_STUCK),
    (2020, TOTAL_ORDER, STATE_MERGE_CHECK),
    (2030, TOTAL_ORDER, STATE_MERGE_CHECK),
]

# ---- state transfer on the presets that carry it, found by the 300-seed total-order test ------------------------
REGRESSIONS += [
    (173, TOTAL_ORDER, "a joiner whose every donor crashed held its deliveries forever; alone now it starts empty"),
    (287, TOTAL_ORDER, "a joiner that left before its state came delivered its own last multicasts after Left"),
]

# ---- state transfer: the checker's stretch "together" after the cut, found by sweeps of both presets ------------
STATE_SPLIT_TAIL = (
    "checker: a joiner that missed the donor's last multicasts of their view, then went alone into a view of its "
    "own applying nothing there and merged back, was compared past the split (its stretch now ends at that view)"
)
STATE_APPLIED_APART = (
    "checker: multicasts that an excluded joiner applied alone (and the donor while it still counted the joiner "
    "in) were compared on the donor's side only (both sides now leave out what the other applied apart)"
)
STATE_COVERED_FIRST = (
    "a joiner passed a batch's covered multicasts up before the fresh ones ahead of them: a sender's multicast its "
    "donor's cut had a hole for (sent in a sequencer epoch the donor was not in) went up after that sender's "
    "later ones in the state (FIFO and total order broke)"
)
REGRESSIONS += [
    (201000856, TOTAL_ORDER, STATE_COVERED_FIRST),
    (4100072, VSYNC, STATE_SPLIT_TAIL),
    (4100167, VSYNC, STATE_SPLIT_TAIL),
    (810035, TOTAL_ORDER, STATE_APPLIED_APART),
    (810096, TOTAL_ORDER, STATE_APPLIED_APART),
    (4100090, TOTAL_ORDER, STATE_APPLIED_APART),
    # Found by the fresh sweeps of the flush and sequencer fixes, judged correct by the same two checker changes.
    (200000521, VSYNC, STATE_SPLIT_TAIL + " or " + STATE_APPLIED_APART),
    (200001326, VSYNC, STATE_SPLIT_TAIL + " or " + STATE_APPLIED_APART),
    (202000377, TOTAL_ORDER, STATE_APPLIED_APART),
    (202000760, TOTAL_ORDER, STATE_APPLIED_APART),
]

# ---- startup faults (partial host lists, staggered starts, shuffled endpoints), found by their first sweeps ---------
FIFO_STARTUP = Scenario(startup_faults=True)
VSYNC_STARTUP = Scenario(stack="vsync", startup_faults=True)
TOTAL_ORDER_STARTUP = Scenario(stack="total-order", startup_faults=True)
UNHEARD_COORDINATOR = (
    "a coordinator whose host list named nobody of the other group heard of its coordinator but never made itself "
    "known; it sorted higher, so the merge leader never heard of it and the groups never merged"
)
LEFT_BEHIND = (
    "a member left in a view its coordinator never installed (that coordinator's host list did not name it) never "
    "heard it announce another view, so it never continued alone to be merged back"
)
REGRESSIONS += [
    (205000023, FIFO_STARTUP, UNHEARD_COORDINATOR + " (slot i listing slots 0..i, as with real processes)"),
    (205000084, FIFO_STARTUP, UNHEARD_COORDINATOR),
    (205000161, FIFO_STARTUP, UNHEARD_COORDINATOR + " (and multicasts in the stuck views were never delivered)"),
    (205000347, FIFO_STARTUP, UNHEARD_COORDINATOR),
    (205000108, FIFO_STARTUP, LEFT_BEHIND),
    (205000164, VSYNC_STARTUP, UNHEARD_COORDINATOR),
    (205000240, VSYNC_STARTUP, UNHEARD_COORDINATOR),
    (205000270, VSYNC_STARTUP, UNHEARD_COORDINATOR),
    (205000184, TOTAL_ORDER_STARTUP, UNHEARD_COORDINATOR),
    (205000309, TOTAL_ORDER_STARTUP, UNHEARD_COORDINATOR + " (and deliveries in the stuck views)"),
    (205000108, TOTAL_ORDER_STARTUP, LEFT_BEHIND),
    (
        205000273,
        VSYNC_STARTUP,
        "a joiner named successor in a view it never installed (its coordinator left) heard on rediscovery that it "
        "was coordinator, asked itself to join and was rejected forever (now: such answers count as none)",
    ),
]

# ---- total-order as vsync plus a sequencer (FLUSH on the preset), found by its first sweep ------------------------
FROZEN_COMMITS = (
    "the coordinator committed (and delivered) batches after FLUSH took its digest; the others held those COMMITs "
    "as next-view traffic, so the old view's survivors delivered different multicasts (now: the hold freezes it)"
)
MERGED_EARLIER = (
    "checker: the sequencer replays earlier epochs to a new view; a member delivered there what another had "
    "applied before it (the other side of a merge, or a joiner's state from a crashed coordinator)"
)
REGRESSIONS += [
    (20, TOTAL_ORDER_STARTUP, MERGED_EARLIER),
    (42, TOTAL_ORDER_STARTUP, MERGED_EARLIER),
    (198, TOTAL_ORDER_STARTUP, MERGED_EARLIER),
    (242, TOTAL_ORDER_STARTUP, MERGED_EARLIER),
    (310000054, TOTAL_ORDER_STARTUP, FROZEN_COMMITS),
    (310000056, TOTAL_ORDER_STARTUP, FROZEN_COMMITS),
    (310000059, TOTAL_ORDER_STARTUP, FROZEN_COMMITS),
]
REGRESSIONS += [
    (
        310500287,
        VSYNC_STARTUP,
        "checker: a joiner's state held messages its donor sent in the joiner's first view and crashed before "
        "anyone else got them; crediting the joiner with its donor's deliveries broke virtual synchrony (vsync "
        "judges deliveries strictly; total-order counts what a member applied, state included, before the view)",
    ),
]
FRAGMENTS_SPLIT = (
    "a flush ended an epoch after some fragments of a big message were committed; the rest was replayed in the "
    "merged view, where a member from the other side held only the rest and never delivered the message "
    "(now: FRAG below SEQUENCER, whole messages are sequenced)"
)
REGRESSIONS += [
    (310000376, TOTAL_ORDER_STARTUP, FRAGMENTS_SPLIT),
    (311000206, TOTAL_ORDER_STARTUP, FRAGMENTS_SPLIT),
]
REGRESSIONS += [
    (
        311000063,
        TOTAL_ORDER_STARTUP,
        "STATE: a refusal that made a joiner found the group came in one batch with the refuser's multicasts, which "
        "were counted in the delivered vector the founding replaced; its next cut showed them as a hole and the "
        "refuser, taking that state, applied its own multicasts twice (now: the vector is reset in place)",
    ),
    (
        722867000380,
        VSYNC_STARTUP,
        "a member's last message missing for a flush target was a VIEW that GMS (below FLUSH) consumed: FLUSH "
        "checked completion only when a batch reached it, so the round hung and the group fell into singletons "
        "(now: checked at the end of every step while the round waits for its target)",
    ),
    (
        819821000417,
        VSYNC_STARTUP,
        "a member that had delivered a returning member's messages in an earlier view started its window there, "
        "above the merge digest: the flush target asked the merge leader for those old-view messages, nobody held "
        "them, and every round failed at the coordinator itself (now: the window starts at the digest, the old "
        "part is passed over)",
    ),
    (
        819821000339,
        VSYNC_STARTUP,
        "the same window started above the merge digest, on a merge of five: the coordinator's rounds failed at "
        "itself forever and the group stayed blocked; its entry came from a subgroup that flushed for the merge "
        "without a suspect it still listed (that member had joined the other group), no cut of its stream (now "
        "also: only the members a subgroup flushed go into the merge)",
    ),
]
HELD_IN_DIGEST = (
    "a member that completed a round and held next-view multicasts (that view's coordinator crashed before its "
    "VIEW reached it) answered a new coordinator's round of the old view with NAKACK's digest, which counts the "
    "held ones: the coordinator delivered them in the old view, the member dropped them (now: FLUSH_OK reports "
    "the stream below the first held message)"
)
REGRESSIONS += [
    (823417000067, VSYNC_STARTUP, HELD_IN_DIGEST),
    (823417000067, Scenario(stack="vsync", overrides={"flush": {"timeout": "10s"}}), HELD_IN_DIGEST),
]
ABANDONED_A_LIVE_FLUSH = (
    "with flush.timeout counted from a member's first round, not restarted by a round that supersedes it, a "
    "member abandoned a flush that was still making progress and unblocked in the old view: it delivered other "
    "messages there than its coordinator before both moved to the next view (the change was reverted; these seeds "
    "keep a superseding round restarting the clock)"
)
REGRESSIONS += [
    (87122000325, VSYNC_STARTUP, ABANDONED_A_LIVE_FLUSH),
    (87122000940, VSYNC_STARTUP, ABANDONED_A_LIVE_FLUSH),
    (87122000344, TOTAL_ORDER_STARTUP, ABANDONED_A_LIVE_FLUSH),
]
MERGE_FLUSH_ABANDONED = (
    "flush.timeout below gms.merge_timeout: a coordinator whose subgroup was flushed for a merge hit the blocked "
    "timeout first and unblocked in the old view; its multicasts went past the cut the merged view's digest "
    "carries, and the other subgroup delivered them in the merged view (now: GMS keeps it blocked until the "
    "merge ends)"
)
FLUSH_4S = {"flush": {"timeout": "4s"}}
REGRESSIONS += [
    (347160119, Scenario(stack="vsync", overrides=FLUSH_4S), MERGE_FLUSH_ABANDONED),
    (347180100, Scenario(stack="total-order", overrides=FLUSH_4S), MERGE_FLUSH_ABANDONED),
]
VIEW_ON_ITS_WAY = (
    "flush.timeout equal to gms.merge_timeout: the merge timed out and the coordinator multicast its subgroup's new "
    "view in the same instant as its blocked timeout; the view was not installed yet, so it unblocked in the old "
    "view and delivered its own multicasts there, the others in the new view (now: a view we cast is waited for)"
)
FLUSH_5S = {"flush": {"timeout": "5s"}}
REGRESSIONS += [
    (347680001, Scenario(stack="total-order", overrides=FLUSH_5S), VIEW_ON_ITS_WAY),
    (347680035, Scenario(stack="total-order", overrides=FLUSH_5S), VIEW_ON_ITS_WAY),
    (347680089, Scenario(stack="total-order", overrides=FLUSH_5S), VIEW_ON_ITS_WAY),
]
REGRESSIONS += [
    (
        347180072,
        Scenario(stack="total-order", overrides=FLUSH_4S),
        "the coordinator replayed a departed sender's message that an unfinished sync had left pending; members "
        "chose what to deliver of it by their own received-tables, and one had skipped past it (it delivered the "
        "sender's later messages after a merge): delivered by the coordinator only (now: a member's SYNC names the "
        "forward seqnos it skipped past, and the replay and the forward-tables leave them out for everyone)",
    ),
]
REGRESSIONS += [
    (
        962349000201,
        FIFO_STARTUP,
        "a joiner's JOIN_RSP came late, with a view older than the merge view that added a member which had already "
        "sent to it there; GMS dropped those UNICAST-acked early unicasts as from a non-member of that first view",
    ),
]
REGRESSIONS += [
    (
        496794000248,
        VSYNC_STARTUP,
        "a sender listed in the coordinator's view but living in a view of its own, which listed one of our members "
        'too, told that member "gone" for messages stable in its own view; the flush named that member the holder '
        "of them, it could not retransmit them, and every round failed at the coordinator itself: blocked for good "
        '(now: the holder relays the "gone" and the requester passes over the same part)',
    ),
]
REGRESSIONS += [
    (
        354000073,
        VSYNC_STARTUP,
        "a member completed a round that left out a suspected member and held another's next-view multicasts (that "
        "view never reached it); a new coordinator's round of the old view, with the left-out member, delivered that "
        "member's old-view multicasts, but they queued behind the held ones and reached the application in the next "
        "view (now: only a sender with something held queues behind it)",
    ),
]
REGRESSIONS += [
    (
        702210000638,
        VSYNC_STARTUP,
        "a merge flush failed at its coordinator itself (it could not fetch a paused member's tail in time); the "
        "member had completed the round and held the coordinator's next multicasts as next-view ones, but the "
        "coordinator unblocked in the old view by its timeout and sent them there. Its next round of that view "
        "reported them delivered; the member completed at once (NAKACK counts held ones) and delivered them in "
        "the next view (now: held multicasts a round's target covers are delivered in the old view before it "
        "completes)",
    ),
]
