"""Grid-tx seeds that once broke a property replay here (``groupcluster sim --stack grid-tx --seeds 1 --start S``).

Each entry names what the seed found; the fix is in grid/node/ or grid/tx/ (with a unit test in
tests/unit/test_grid_node_tx.py where the case can be built by hand), or in the checkers
(sim/grid/tx_checkers.py, tested in tests/sim/test_grid_tx_checkers.py) when the run was right and the judgement
wrong.
"""

from __future__ import annotations

from groupcluster.sim.scenario import Scenario

from . import seedruns

# Pinned, not the current defaults: a seed replays its original run only with its scenario.
GRID_TX = Scenario(stack="grid-tx", safety_time=8.0, send_rate=3.0, startup_faults=False)
GRID_TX_CAPACITY = Scenario(stack="grid-tx", safety_time=8.0, send_rate=3.0, capacity_changes=1.0, startup_faults=False)
GRID_TX_STARTUP = Scenario(stack="grid-tx", safety_time=8.0, send_rate=3.0)
GRID_TX_DEADLINES_STARTUP = Scenario(stack="grid-tx", safety_time=8.0, send_rate=3.0, deadlines=0.5)
GRID_TX_CAPACITY_STARTUP = Scenario(stack="grid-tx", safety_time=8.0, send_rate=3.0, capacity_changes=1.0)

TWO_GRIDS = (
    "checker: a member cut off into a grid of its own (or members that started apart) committed a transaction "
    "there; at the merge its writes, stamped under a higher topology id, beat a later transaction's of the other "
    "grid. The grid's merge policy (newest version wins) at work, as for plain writes: writes in a window where "
    "two groups took writes now count as concurrent, and the conserved total is not judged in such runs"
)

COMMIT_OWNERS_GONE = (
    "the originator was cut off (a grid of its own) right after every owner voted YES; its view change dropped "
    "the unanswered commits and it reported the transaction committed with no owner having applied it; the "
    "owners, in doubt, were rolled back by the operator: a committed write lost (now: a commit whose owner left "
    "unacknowledged completes only once the next topology's owners acknowledged it; grid/tx/coordinator.py)"
)
TOPOLOGY_BEFORE_VIEW = (
    "the coordinator member installed the topology without a departed participant before its transactions saw "
    "the view; the originator then waited for one topology more, which never came, and the transaction stayed "
    "pending for good (now: the node hands the view to the transactions first, and the originator retries at "
    "once when its routing no longer names the departed member)"
)

SEPARATE_GRIDS = (
    "checker: every member of a grid left gracefully, the last one alone with the data (nobody to take it); the "
    "final reads came from a grid of restarted members that had never met it. As in the grid checkers, a commit "
    "through a grid the reader's never met binds the read only as a write that may have happened"
)
NEVER_MET = (
    "the first grid's members all left but one; restarted members (fresh incarnations) started a second grid "
    "(topology 1 up) and committed transactions there; at the merge with the first grid's last member its older "
    "writes (stamped under topology ~10) beat the second grid's later commits (now: versions carry the commit's "
    "wall-clock time and the merge of grids that never met re-stamps by it)"
)

RESOLVER_IS_ORIGINATOR = (
    "automatic resolution: the originator came back (a partition healed) and was the view coordinator; its "
    "resolver's commits were ignored by the participants in doubt, which ignore the originator's own late "
    "decisions, so the transaction stayed in doubt for good (now a resolver's TX_COMMIT/TX_ROLLBACK is marked "
    "resolved and taken from any sender; grid/tx/participant.py)"
)
VIEW_BEHIND = (
    "automatic resolution: in the round right after the originator's crash, one participant had not installed "
    "the view yet (its record prepared, not in doubt), reported nothing, and no round followed; it was in doubt "
    "for good once it installed the view (now the request carries the coordinator's view and a member reports "
    "prepared records whose originator is outside it; the resolver waits for it and asks again)"
)

GIVE_UP_AT_DEADLINE = (
    "a new primary's last-resort unblock (lock information not arrived after tx_timeout) compared now - since "
    ">= tx_timeout while its deadline was since + tx_timeout; floating point made the first false at the second, "
    "and the simulator stepped that member at one instant for ever (now both use since + tx_timeout; unit test "
    "in test_grid_node_tx.py)"
)
LONE_SIDE = (
    "message loss alone (no scheduled fault) left an originator alone in a view and, in allow_read_writes, in an "
    "available grid of its own; it committed a transaction there, its client was told committed, and the "
    "simulator crashed it: the only copy went with it, beyond the rule of at most num_owners - 1 members lost "
    "(now the simulated faults lose no member while some member's topology has fewer than num_owners members)"
)

LATE_COMMIT_NEW_OWNER = (
    "the originator of t15 was cut off into a partition of its own after its participants voted YES; the "
    "automatic resolver on the other side rolled t15 back; a rebalance then made 10.0.0.5 an owner of c7, by "
    "state transfer from a rolled-back owner, without any record of t15. At the merge the originator sent its "
    "commit to every current owner at once: the voters answered ROLLED_BACK, 10.0.0.5 applied it, and c7's "
    "replicas differed for good (now an owner that voted on none of a commit's keys gets it only once a voter "
    "answered, and never a write its voters rolled back: TxCoordinator._send_completion)"
)
RESOLVED_ON_THE_ORIGINATOR = (
    "found by the first fix of LATE_COMMIT_NEW_OWNER: the simulated operator rolled back, from every member, a "
    "commit its participants (in doubt) had ignored, the originator's member among them. The answers to those "
    "rollbacks reached the originator's coordinator, which took them for acknowledgements of its commit and "
    "sent it on to a new owner (now a resolution sent from the originator's member overrules its pending "
    "decision: TxCoordinator.resolved_here)"
)
LOCK_WITHOUT_OWNERSHIP = (
    "a backup of c4 was cut off alone while a transaction was prepared and held c4's lock as the primary of its "
    "own degraded grid; the merged group's topology continued the other side's rebalance without it as an owner "
    "of c4 (mid-rebalance: its copy stayed), and the resolved commit carried only the keys it owned then, so the "
    "lock waited for c4's version for good (now: locks of segments a member no longer owns go at every "
    "available topology, whatever its phase)"
)
RESOLVE_KEY_NOT_HELD = (
    "a backup lagging behind held the originator's commit for a topology it had not installed and was cut off "
    "(in doubt) before installing it, so it ignored the commit; u15 then moved to other owners and the primary "
    "that had stamped its version left. The operator's tx_resolve asked that member for u15's version, which no "
    "live member knew, though it no longer held u15: the transaction stayed in doubt for good (now: a written "
    "key whose segment the member holds no more needs no version there)"
)

REFETCH_AFTER_COMMIT = (
    "a backup applied a commit of c5, then lost c5's segment (a topology dropped it, the next gave it back: "
    "emptied for a fresh transfer); the transfer came from an owner the commit had not reached yet, with c5's "
    "older value, and the originator's repeated commit was taken as a duplicate (c5 on record as applied): two "
    "owners kept different values for good (now a committed record forgets what a dropped or emptied copy "
    "lost, and a repeated commit or pushed lock information applies it again; grid/tx/lock_transfer.py, forget_applied)"
)

OWN_COMMIT_DONE = (
    "a backup of c2 cut off before the commit reached it (in doubt, then primary in a grid of its own) pushed "
    "c2's write without a version at the merge to the new primary, the transaction's originator, which held c2 "
    "for a commit to bring the version; its own commit was complete (every owner had acknowledged it), so none "
    "came, and the pusher left with its in-doubt record: c2 locked for good (now the originator releases such "
    "keys of its completed commits; grid/tx/participant.py, settle_own)"
)

REPEAT_AFTER_TRANSFER = (
    "capacity changes: 10.0.0.5 applied t7's commit of u10 as an owner, dropped u10's segment in the next "
    "topology, and became its owner again by state transfer from an owner that had not got the commit yet; the "
    "originator's repeat under that topology was ignored, the record saying u10 was applied already, and the "
    "other owners then left the segment: the committed write lost (now a dropped or emptied copy marks the "
    "record's keys lost, and a repeated commit applies them again: REFETCH_AFTER_COMMIT's fix)"
)

LEFT_BESIDE_EMPTIED_MEMBER = (
    "capacity changes, startup faults: in a grid of two that had not met the other group yet, 10.0.0.4 set its "
    "capacity to 0 and the rebalance gave every segment to 10.0.0.3, which was then asked to leave; it read the "
    'capacity 0 in the CH as "nobody could take my segments" and left at once with the only copy of t5\'s '
    "commit and acknowledged puts (now a member leaves without a handoff only when alone in its view: "
    "Membership._no_taker; docs/decisions/003)"
)

TOPOLOGY_ID_TWICE = (
    "capacity changes, startup faults: 10.0.0.4, cut off alone, made topology 6 of its own; the merge view's "
    "coordinator recovered on its status from before the split and announced its own topology 6, which 10.0.0.4 "
    "ignored as not newer and never confirmed: the rebalance stalled in READ_ALL_WRITE_ALL and two leaving "
    "members waited for good (now a status reporting another topology under the planner's id re-announces above it)"
)

IN_DOUBT_IGNORED_ROLLBACK = (
    "a partition cut the originator off after 10.0.0.4 voted YES (in doubt there); after the merge its later "
    "attempt was refused and it rolled the transaction back, but 10.0.0.4 ignored the rollback as the "
    "originator's late decision and left it unanswered: the originator resent it until the operator resolved "
    "10.0.0.4 and was still pending at the check (now a participant in doubt takes the originator's rollback, "
    "which only ever rolls back attempts that never commit; grid/tx/participant.py, _accepts_decision)"
)

NO_GRID_AFTER_MERGE = (
    "capacity changes, startup faults: members started apart and formed groups below the initial cluster size "
    "(no grid); at their merge the coordinator was 10.0.0.2, which had joined 10.0.0.4's group before, and a "
    "member that joined a group never started an empty grid: no grid ever started (now a status lists the "
    "coordinators its member joined without a topology, and the coordinator starts an empty grid once each one "
    "it joined, transitively, is in its view without a topology; RebalancePlanner._may_start)"
)

REFUSED_KEY_TO_A_VOTER = (
    "deadlines: the originator was cut off after every owner voted YES and committed u7 on its own member (a "
    "backup of u7); the automatic resolver on the other side rolled the transaction back; at the merge the "
    "originator's member became an owner of u2 and, being a voter of u7, got u2's write although u2's voters "
    "had answered ROLLED_BACK: u2's replicas differed for good (now a write its voters rolled back goes to no "
    "member that did not vote on that key; TxCoordinator._send_completion)"
)

STALE_ATTEMPT_PUSHED = (
    "capacity changes: a backup of u6 got t26's first prepare late and was cut off in doubt about that attempt; "
    "t26 committed its second attempt without it; at the merge the backup pushed the abandoned attempt's u6 "
    "write (no version) to 10.0.0.5, u6's new primary, which held t26 committed for other keys and locked u6 "
    "for a version that no commit brings: u6 locked for good (now pushed lock information of an attempt older "
    "than the one known here is ignored, committed or not; grid/tx/lock_transfer.py, import_lock_info)"
)

OWN_MEMBER_APPLIED_FIRST = (
    "deadlines: t12's originator, a backup of u10, applied its own commit of u10 at once; a partition then cut "
    "it off before the other owners took the commit (in doubt there), and the automatic resolver on the other "
    "side, seeing every prepare-time member but the originator and nobody committed, rolled t12 back; the merge "
    "brought the originator's u10 back beside the rolled-back u12: half a transaction visible (now the "
    "originator's own member gets the commit only once another member applied it, and a commit a voter answers "
    "ROLLED_BACK before anyone applied it rolls back everywhere; TxCoordinator._own_held, _overruled)"
)

DEMOTED_PRIMARY_KEPT_LOCK = (
    "capacity changes, startup faults: 10.0.0.4, a backup of u15 prepared for t8, was cut off in doubt and, alone, "
    "became u15's primary: its backup lock became a lock. The merge made 10.0.0.3 the primary again and 10.0.0.4 "
    "a backup; it pushed the lock information but kept the lock itself, and the resolved commit, carrying only the "
    "u7 write whose version the resolver knew, left u15 held for its missing version, for good (now an old primary "
    "that stays an owner turns its locks into backup locks after the push; LockTable.demote, TxTable.demote)"
)
LATE_STAMP_OVER_LATER_WRITE = (
    "the originator, primary of c3 and c5, applied its transfer and crashed before its backup got the commit; a "
    "later transfer that read the new c5 committed on the backup; the backup, new primary, then stamped the "
    "orphaned write of c5 afresh, above the later one, and the counters summed to -4 (now the prepare gives a "
    "backup the version the transaction read of each key, and a late stamp lands just above it: "
    "TxTable.late_version)"
)
LOSS_SPLIT_THEN_CRASH = (
    "simulation rule: message loss alone cut 10.0.0.5 off (no scheduled fault); the others' topology dropped it "
    "and kept segment 18 on 10.0.0.3 alone until a rebalance, t2 committed u1 there, and the schedule, its "
    "exposure count at 0, crashed 10.0.0.3: two of u1's two owners lost, beyond the rule of num_owners - 1, and "
    "the operator's forced availability started segment 18 empty (now the faults lose fewer members than any "
    "member's topology keeps copies of its scarcest segment: sim/grid/run.py, _may_expose)"
)

# (seed, scenario, what the seed found). Seeds 104 and 143 found TWO_GRIDS on the first sweep; the fault choice
# changed since (crashes and pauses prefer originators in the middle of a commit), so their runs are not the
# same any more: 212 (a later transaction's write beaten at the merge) and 220 (the counters' total broken by
# the merge of two groups' transfers) show it with today's scenario, found by running the checkers without the
# write windows.
REGRESSIONS: list[tuple[int, Scenario, str]] = [
    (212, GRID_TX, TWO_GRIDS),
    (220, GRID_TX, TWO_GRIDS),
    (1171, GRID_TX, COMMIT_OWNERS_GONE),
    (1250, GRID_TX, TOPOLOGY_BEFORE_VIEW),
    (1398, GRID_TX, SEPARATE_GRIDS),
    (1450, GRID_TX, NEVER_MET),
    (1434, GRID_TX, LONE_SIDE),
    (19, GRID_TX, RESOLVER_IS_ORIGINATOR),
    (113, GRID_TX, RESOLVER_IS_ORIGINATOR),
    (446, GRID_TX, VIEW_BEHIND),
    (814, GRID_TX, GIVE_UP_AT_DEADLINE),
    (1461, GRID_TX, LATE_COMMIT_NEW_OWNER),
    (912, GRID_TX, RESOLVED_ON_THE_ORIGINATOR),
    (4100123, GRID_TX, LOCK_WITHOUT_OWNERSHIP),
    (203001472, GRID_TX, RESOLVE_KEY_NOT_HELD),
    (895672000490, GRID_TX_CAPACITY, REPEAT_AFTER_TRANSFER),
    (895672000093, GRID_TX, REFETCH_AFTER_COMMIT),
    (207000288, GRID_TX, OWN_COMMIT_DONE),
    (857807000094, GRID_TX_CAPACITY_STARTUP, LEFT_BESIDE_EMPTIED_MEMBER),
    (293329000013, GRID_TX_CAPACITY_STARTUP, TOPOLOGY_ID_TWICE),
    (508822000432, GRID_TX_STARTUP, IN_DOUBT_IGNORED_ROLLBACK),
    (338600243, GRID_TX_DEADLINES_STARTUP, REFUSED_KEY_TO_A_VOTER),
    (339000037, GRID_TX_CAPACITY_STARTUP, NO_GRID_AFTER_MERGE),
    (499392000289, GRID_TX_CAPACITY_STARTUP, STALE_ATTEMPT_PUSHED),
    (681165000353, GRID_TX_DEADLINES_STARTUP, OWN_MEMBER_APPLIED_FIRST),
    (959994000140, GRID_TX_CAPACITY_STARTUP, DEMOTED_PRIMARY_KEPT_LOCK),
    (760155000251, GRID_TX_DEADLINES_STARTUP, LATE_STAMP_OVER_LATER_WRITE),
    (435111000144, GRID_TX_STARTUP, LOSS_SPLIT_THEN_CRASH),
]


def test_grid_tx_regression_seeds_pass() -> None:
    seedruns.replay_regressions(REGRESSIONS)
