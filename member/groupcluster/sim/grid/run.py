"""The data grid under simulation (``groupcluster sim --stack grid``): grid members, clients, faults, checks.

Every member runs the group stack a grid member runs (the ``vsync`` preset: a graceful leave is a
flush-coordinated view change) with a :class:`~groupcluster.grid.node.GridNode` on top, driven exactly as
:mod:`groupcluster.grid.driver.grid_runtime` drives it: each installed view goes to ``on_view`` (with ``merge``), each
delivered batch of tagged grid payloads to ``on_messages`` (our own multicast copies left out), ``tick`` at
``next_deadline``, and the outbox into the stack after every step. Simulated clients issue GET/PUT/DELETE
on a small key space through random members, so keys see concurrent writers.

Faults follow the seed's plan (:mod:`groupcluster.sim.faults`), with one rule the grid's guarantee needs:
**at most ``num_owners - 1`` members are crashed or partitioned away before rebalancing completes**. The
schedule keeps an *exposure* count of members lost (crashed, cut off, clogged, paused) since the grid was
last fully replicated and balanced on the live members, and skips a fault that would exceed it (or that
would come while a member's topology has fewer than ``num_owners`` members: a side that message loss alone
split off, running a grid of its own in ``allow_read_writes``, holds the only copies of its writes; or that
would lose as many members as a member's topology keeps copies of some segment: a member message loss alone cut
off leaves the others' topology with a copy fewer of its segments). Graceful
leaves are ``GridNode.leave`` first, then the group leave once the node is ready (never more than that).

Each seed picks a partition-handling mode, 2 or 3 owners and a segment count. After the safety phase the
network heals and the grid must converge: one view, one balanced topology installed everywhere, no
rebalance, every client operation finished. Then every key ever written is read back through a random
member and each member's store is recorded, for the checkers in :mod:`groupcluster.sim.grid.checkers`.

History events (besides the group's views, starts, crashes and leaves):

==================  ====================================================================================
kind                fields
==================  ====================================================================================
grid_config         ``mode``, ``num_owners``, ``num_segments``, ``initial_cluster_size`` (member ``-``)
grid_start          ``id`` (unique), ``op`` get/put/delete, ``key``, ``value`` (put)
grid_end            ``id``, ``ok`` (acknowledged), ``value`` (get), ``error``
grid_topology       ``topology_id``, ``phase``, ``availability`` (a member installed a topology)
grid_leave          (the member asked the grid to move its data away)
grid_merge          ``phase`` start/end: from a merge view until the member's entries reached the merged
                    group's owners (the merge policy at work)
grid_force_available ``topology_id``: the simulated operator ended a degraded mode that could not end alone
grid_whole          ``topology_id``, ``owners`` (member ``-``): the grid is whole (:meth:`GridRun.grid_whole`: one
                    view of every live member, one balanced, available topology everywhere, no rebalance) on this
                    topology, whose owners are ``owners``; recorded each time it becomes whole on another topology
grid_heal           (member ``-``) the faults stop: the network heals, paused members resume
grid_split          ``phase`` start/end (member ``-``): a fault that can cut members off began / the group is
                    whole again; reads (and in ``allow_read_writes`` writes) overlapping it may see either side
grid_converged      (member ``-``) the grid converged after healing; GETs after it are the final reads
grid_store          ``topology_id``, ``owners`` (per segment, member names), ``data`` {segment: {key: value}}
==================  ====================================================================================
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Collection, Sequence
from typing import Any

from ...core.address import Address
from ...core.message import Message
from ...core.view import View
from ...grid.messages import DELETE, GET, OP_NAMES, PUT
from ...grid.node import GridConfig, GridNode, OpResult
from ...grid.topology import Availability, CacheTopology, PartitionHandling, Phase, owner_set
from ..faults import FaultPlan
from ..history_index import Violation
from ..scenario import Scenario, _Run
from ..world import LEAVING, PAUSED, RUNNING, AppFactory, Node

# The runtime's tag byte for grid payloads (grid/driver/runtime_base.py): the same bytes travel here.
TAG_GRID = 0xF7
_PREFIX = bytes([TAG_GRID])

KEYS = 24  # a small key space: keys see concurrent writers and many reads of written keys
GRID_DEFAULT_OPS = 3.0  # client operations per member per virtual second
GRID_DEFAULT_SAFETY = 12.0  # virtual seconds of faults
POLL = 0.1
# The wall clock every simulated member sees is the virtual time plus this (a date in 2027): versions carry
# the time of their write (grid/store.py, next_seq), and the simulated clocks agree (no skew).
SIM_WALL_CLOCK = 1_800_000_000.0


def grid_scenario(**changes: Any) -> Scenario:
    """The grid scenario's defaults (``groupcluster sim --stack grid``): 5 slots, 12 virtual seconds of
    faults, 3 client operations per member per second."""
    base: dict[str, Any] = {"stack": "grid", "safety_time": GRID_DEFAULT_SAFETY, "send_rate": GRID_DEFAULT_OPS}
    return Scenario(**{**base, **changes})


@dataclasses.dataclass(frozen=True)
class GridSetup:
    """What a seed draws for its grid (mode, owners, segments) and the node configuration built from it."""

    mode: PartitionHandling
    num_owners: int
    num_segments: int
    # A majority of the scenario's slots: a member whose join failed, alone or with one other, never starts a
    # grid of its own (seed 513), while a grid still starts before every late joiner arrived.
    initial_cluster_size: int = 1
    max_entries: int = dataclasses.field(default=0, kw_only=True)  # the scenario's, not drawn
    max_bytes: int = dataclasses.field(default=0, kw_only=True)  # likewise

    def config(self) -> GridConfig:
        return GridConfig.from_dict(
            {
                "num_segments": self.num_segments,
                "num_owners": self.num_owners,
                "partition_handling": self.mode.value,
                "transfer_batch_entries": 4,  # several batches per segment: exercises the window
                "transfer_window": 2,
                "attempt_timeout": "1s",
                "op_timeout": "15s",
                "recovery_timeout": "1s",
                "initial_cluster_size": self.initial_cluster_size,
                "max_entries": self.max_entries,
                "max_bytes": self.max_bytes,
            }
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode.value,
            "num_owners": self.num_owners,
            "num_segments": self.num_segments,
            "initial_cluster_size": self.initial_cluster_size,
            # Only when set: the histories of runs without a bound stay as they were.
            **({"max_entries": self.max_entries} if self.max_entries else {}),
            **({"max_bytes": self.max_bytes} if self.max_bytes else {}),
        }


def draw_setup(rng: random.Random, members: int) -> GridSetup:
    modes = list(PartitionHandling)
    mode = modes[rng.randrange(len(modes))]
    owners = 2 if rng.random() < 0.7 else 3
    segments = rng.choice((8, 16, 32))
    return GridSetup(mode, owners, segments, initial_cluster_size=members // 2 + 1)


def fewest_copies(t: CacheTopology, live: Collection[Address]) -> int:
    """The fewest copies ``t`` keeps of any segment: its data holders that are members of ``t`` and in ``live``
    (members running or paused). Losing that many members may lose acknowledged writes."""
    return min(sum(1 for m in t.data_holders(s) if m in live and m in t.members) for s in range(t.num_segments))


class GridApp:
    """The simulated counterpart of :class:`~groupcluster.grid.driver.grid_runtime.GridRuntime` on one member."""

    def __init__(self, node: Node, run: GridRun) -> None:
        self.node = node
        self.run = run
        self.me = node.address
        self.grid = GridNode(node.address, run.setup.config())
        self.grid.wall_offset = SIM_WALL_CLOCK
        self.ops: dict[int, str] = {}  # the node's op id -> the history's op id
        self.leave_requested = False
        self.topology_id = 0
        self.merging = False

    # -- driven by the world -----------------------------------------------------------------------------
    def on_view(self, view: View, now: float) -> None:
        self.grid.on_view(view.members, now, merge=view.is_merge)

    def on_messages(self, messages: Sequence[Message], now: float) -> None:
        me = self.me
        batch = [
            (m.src, m.payload[1:])
            for m in messages
            if m.payload[:1] == _PREFIX and not (m.dest is None and m.src == me) and m.src is not None
        ]
        if batch:
            self.grid.on_messages(batch, now)

    def tick(self, now: float) -> None:
        self.grid.tick(now)

    def next_deadline(self) -> float | None:
        return self.grid.next_deadline()

    def take_sends(self) -> list[Message]:
        me = self.me
        return [Message(o.dest, _PREFIX + o.payload) for o in self.grid.take_outbox() if o.dest != me]

    def after_step(self, now: float) -> None:
        t = self.grid.topology
        if t is not None and t.topology_id != self.topology_id:
            self.topology_id = t.topology_id
            self.run.history.add(
                now,
                self.node.name,
                "grid_topology",
                topology_id=t.topology_id,
                phase=t.phase.name,
                availability=t.availability.name,
            )
        merging = self.grid.merging
        if merging != self.merging:
            self.merging = merging
            self.run.history.add(now, self.node.name, "grid_merge", phase="start" if merging else "end")
        for res in self.grid.take_results():
            self.run.op_done(self, res, now)
        if self.leave_requested and self.grid.ready_to_leave and self.node.state == RUNNING:
            self.run.group_leave(self.node)

    # -- called by the scenario (through World.app_call) ---------------------------------------------------
    def start_op(
        self,
        kind: int,
        key: bytes,
        value: bytes | None,
        hid: str,
        lifetime: float | None,
        lifespan: float | None,
        now: float,
    ) -> None:
        """Start a client operation; ``lifetime``: its client's deadline is that long from now (None: none);
        ``lifespan``: a PUT's entry expires that long from now (None: never; docs/grid.md, "Expiry")."""
        deadline = None if lifetime is None else now + lifetime
        extra: dict[str, float] = {} if deadline is None else {"deadline": deadline}
        if lifespan is not None:
            extra["expires"] = now + lifespan
        self.run.history.add(
            now,
            self.node.name,
            "grid_start",
            id=hid,
            op=OP_NAMES[kind].lower(),
            key=key.decode(),
            value=None if value is None else value.decode(),
            **extra,
        )
        if kind == GET:
            op = self.grid.get(key, now, deadline)
        elif kind == PUT:
            assert value is not None
            expires = 0.0 if lifespan is None else SIM_WALL_CLOCK + now + lifespan
            op = self.grid.put(key, value, now, deadline, expires)
        else:
            op = self.grid.delete(key, now, deadline)
        self.ops[op] = hid

    def set_capacity(self, capacity: float, now: float) -> None:
        self.grid.set_capacity(capacity, now)

    def request_leave(self, now: float) -> None:
        self.leave_requested = True
        self.run.history.add(now, self.node.name, "grid_leave")
        self.grid.leave(now)

    @property
    def usable(self) -> bool:
        """What the runtime requires before it takes a client operation: a topology, not leaving."""
        return self.grid.topology is not None and not self.leave_requested and not self.grid.leaving


class GridRun(_Run):
    """One seed of the grid scenario (see the module docstring)."""

    def __init__(self, seed: int, scenario: Scenario, logger: Any) -> None:
        super().__init__(seed, scenario, logger)
        grid_rng = random.Random(self.root.getrandbits(64))
        self.setup = dataclasses.replace(
            draw_setup(grid_rng, scenario.members), max_entries=scenario.max_entries, max_bytes=scenario.max_bytes
        )
        self.client_rng = random.Random(grid_rng.getrandbits(64))
        # Deadlines draw from their own stream, so a seed's workload is the same with and without them.
        self.deadline_rng = random.Random(f"deadlines-{seed}")
        self.lifespan_rng = random.Random(f"lifespans-{seed}")  # likewise for lifespans
        self.capacity_rng = random.Random(f"capacities-{seed}")  # and capacity changes
        self.op_ids = 0
        self.byte_counts_wrong: list[tuple[str, str]] = []  # (member, detail): byte counts off at the end
        self.written: set[bytes] = set()
        self.values = 0
        self.exposed = 0  # members lost since the grid was last whole and balanced
        self.exposures: set[int] = set()  # fault tokens that can cut members off, still active
        self.split_open = False
        self.final_ops: set[str] = set()
        self.final_started = False
        self.final_deadline = 0.0
        self.group_since: float | None = None  # the group's view converged (liveness phase)
        self.whole_topology = 0  # the topology of the last grid_whole event
        self.grid_stats = {
            "ops": 0,
            "ops_ok": 0,
            "ops_failed": 0,
            "faults_skipped": 0,
            "forced_available": 0,
            "ops_with_deadline": 0,
            "puts_with_lifespan": 0,
            "entries_expired": 0,  # removed by the members alive at the end (counted with their stores)
            "puts_refused_full": 0,
            "capacity_changes": 0,
        }

    # -- hooks of the base run -------------------------------------------------------------------------------
    def _adjust_plan(self, plan: FaultPlan) -> FaultPlan:
        # Grid payloads are the traffic here: the test workload's big messages do not apply.
        return dataclasses.replace(plan, big_message_fraction=0.0)

    def _app_factory(self) -> AppFactory | None:
        return lambda node: GridApp(node, self)

    def extra_stats(self) -> dict[str, int]:
        return {f"grid_{k}": v for k, v in self.grid_stats.items()}

    def schedule(self) -> None:
        self.history.add(0.0, "-", "grid_config", **self.setup.to_json())
        super().schedule()
        self.loop.after(POLL, self._poll_whole)
        rate = self.sc.capacity_changes
        if rate > 0:
            t = self.capacity_rng.expovariate(rate)
            while t < self.safety_end:
                self.loop.at(t, self._change_capacity)
                t += self.capacity_rng.expovariate(rate)

    # -- queries ----------------------------------------------------------------------------------------------
    def _app(self, node: Node) -> GridApp:
        """The grid application of a member of this run (``_app_factory`` gave every member one)."""
        app = node.app
        if not isinstance(app, GridApp):
            raise TypeError(f"{node.name}: no grid application on this member ({app!r})")
        return app

    def _apps(self, states: tuple[str, ...] = (RUNNING, PAUSED)) -> Sequence[GridApp]:
        return [self._app(n) for n in self.world.nodes if n is not None and n.state in states and n.app is not None]

    def grid_whole(self) -> bool:
        """One view of every live member, one balanced topology everywhere, no rebalance, no grid leave."""
        if self.pending_starts or any(n is not None and n.state == LEAVING for n in self.world.nodes):
            return False
        if not self.converged():
            return False
        apps = self._apps()
        if not apps or any(a.leave_requested for a in apps):
            return False
        t0 = apps[0].grid.topology
        if t0 is None or t0.phase != Phase.NO_REBALANCE or t0.availability != Availability.AVAILABLE:
            return False
        live = {a.me for a in apps}
        if set(t0.members) != live:
            return False
        for a in apps:
            t = a.grid.topology
            if t is None or t.topology_id != t0.topology_id:
                return False
            if a.grid.planner is not None and a.grid.planner.recovering:
                return False
        # Members at capacity 0 own nothing (--capacity-changes): fewer members with capacity, fewer copies.
        k = min(t0.current.num_owners, len([a for a in apps if a.grid.config.capacity > 0]))
        return all(
            len(t0.current.owners_of(s)) == k and set(t0.current.owners_of(s)) <= live for s in range(t0.num_segments)
        )

    def _note_whole(self) -> bool:
        """Whether the grid is whole now; records ``grid_whole`` when it is, on a topology not recorded yet (the
        grid-liveness checker counts the members lost for good from the last one before the heal)."""
        if not self.grid_whole():
            return False
        t = self._apps()[0].grid.topology
        assert t is not None
        if t.topology_id != self.whole_topology:
            self.whole_topology = t.topology_id
            names = {n.address: n.name for n in self.world.nodes if n is not None}
            owners = sorted(names.get(m, str(m)) for m in owner_set(t.current))
            self.history.add(self.loop.now, "-", "grid_whole", topology_id=t.topology_id, owners=owners)
        return True

    def _poll_whole(self) -> None:
        if self.healed:
            return
        self._note_whole()
        self.loop.after(POLL, self._poll_whole)

    def _may_expose(self, count: int) -> bool:
        """Whether ``count`` more members may be lost now without risking acknowledged data."""
        if self.exposed and not self.exposures and self._note_whole():
            self.exposed = 0
        if self.exposed + count > self.setup.num_owners - 1:
            return False
        if self.sc.capacity_changes and self.exposed + count > min(self.setup.num_owners, len(self._holders())) - 1:
            return False  # fewer members with capacity than owners: fewer copies to lose
        apps = self._apps()
        # The planner treats losing half of the last stable owners as a possible partition (degraded mode),
        # and a majority needs at least three stable owners to lose one: keep clear of both.
        for a in apps:
            t = a.grid.topology
            if t is None or t.availability != Availability.AVAILABLE:
                return False
            live = {x.me for x in apps}
            if not set(t.stable_members) <= live or len(t.stable_members) <= 2 * (self.exposed + count):
                return False
        # Message loss alone can split the group (failure detection excludes members) without any fault the
        # exposure count knows of. In allow_read_writes each side then runs an available grid of its own, and a
        # side of fewer than num_owners members holds the only copies of what it acknowledged: losing a member
        # now could lose acknowledged writes beyond the rule (grid-tx seed 1434: a member alone in its own grid
        # committed a transaction and crashed).
        for a in apps:
            t = a.grid.topology
            if t is not None and len(t.members) < min(self.setup.num_owners, len(apps)):
                return False
        # Message loss can also cut a member off a larger side (failure detection excludes it): that side's
        # topology drops it and keeps its segments with one copy fewer until a rebalance completes, again with no
        # fault the count knows of (grid-tx seed 435111000144: 10.0.0.5 excluded, segment 18 left on 10.0.0.3
        # alone, which the schedule then crashed, with a committed transaction's write of u1). Lose fewer
        # members than any member's topology keeps copies of its scarcest segment.
        live = {a.me for a in apps}
        for a in apps:
            t = a.grid.topology
            if t is not None and fewest_copies(t, live) <= count:
                return False
        return bool(apps)

    def _expose(self, count: int, token: int | None) -> None:
        self.exposed += count
        if token is not None:
            self.exposures.add(token)
            if not self.split_open:
                self.split_open = True
                self.history.add(self.loop.now, "-", "grid_split", phase="start")
                self.loop.after(POLL, self._poll_split)

    def _unexpose(self, token: int) -> None:
        self.exposures.discard(token)

    def _poll_split(self) -> None:
        if not self.split_open:
            return
        if not self.exposures and self.converged():
            self.split_open = False
            self.history.add(self.loop.now, "-", "grid_split", phase="end")
            return
        self.loop.after(POLL, self._poll_split)

    def _skip(self) -> None:
        self.grid_stats["faults_skipped"] += 1

    # -- member faults ----------------------------------------------------------------------------------------
    def _crash(self) -> None:
        if self.healed:
            return
        node = self._pick((RUNNING, PAUSED, LEAVING))
        if node is None or self._alive_others(node) < 1:
            return
        if not self._may_expose(1):
            self._skip()
            return
        self._expose(1, None)
        self.pause_tokens.pop(node.slot, None)
        self.world.crash(node.slot)
        if self.fault_rng.random() < self.plan.restart_probability:
            self._later_start(node.slot, self.fault_rng.uniform(0.2, 4.0))

    def _pause(self) -> None:
        if self.healed:
            return
        node = self._pick((RUNNING,))
        if node is None:
            return
        if not self._may_expose(1):
            self._skip()
            return
        token = self._token()
        self._expose(1, token)
        self.pause_tokens[node.slot] = token
        self.world.pause(node.slot)
        self.loop.after(self.fault_rng.uniform(0.05, self.plan.max_pause), self._resume, node.slot, token)

    def _resume(self, slot: int, token: int) -> None:
        self._unexpose(token)
        super()._resume(slot, token)

    def _holders(self) -> list[GridApp]:
        """Members that hold the grid's data and keep it: a topology, not leaving, a capacity above 0."""
        return [a for a in self._apps((RUNNING, PAUSED)) if a.usable and a.grid.config.capacity > 0]

    def _change_capacity(self) -> None:
        if self.healed:
            return
        candidates = [n for n in self.world.nodes if n is not None and n.state == RUNNING and n.app is not None]
        if not candidates:
            return
        node = self.capacity_rng.choice(candidates)
        app = self._app(node)
        capacity = self.capacity_rng.choice((0.0, 0.5, 1.0, 2.0))
        # Keep num_owners members with capacity (at least two): fewer make fewer copies of each segment, and the
        # crashes the schedule allows for num_owners copies would lose acknowledged writes.
        if capacity == 0 and len([a for a in self._holders() if a is not app]) < max(2, self.setup.num_owners):
            capacity = 1.0
        self.grid_stats["capacity_changes"] += 1
        self.world.app_call(node.slot, app.set_capacity, capacity)

    def _leave(self) -> None:
        if self.healed:
            return
        candidates = [
            n
            for n in self.world.nodes
            if n is not None and n.state == RUNNING and n.view is not None and n.app is not None and self._app(n).usable
        ]
        if not candidates:
            return
        node = self.fault_rng.choice(candidates)
        # Keep two data holders: a leave never makes the grid lose its replicas. Only members with a topology
        # hold data; one that never got one (cut off since it started, or in a group of its own) cannot take
        # over. Counting those let every holder leave (seeds 7524, 9271): the grid and its acknowledged writes
        # were gone, and the remaining members, never in it, rightly started no empty one (RebalancePlanner._may_start,
        # initial_cluster_size).
        staying = self._holders()
        if len(staying) <= 2:
            return
        self.world.app_call(node.slot, self._app(node).request_leave)

    def group_leave(self, node: Node) -> None:
        """The grid node handed its data off: now leave the group (flush-coordinated in vsync)."""
        # Not inside the step that reported readiness: the world is still routing that step's outputs.
        self.loop.after(0.0, self.world.leave, node.slot)

    # -- network faults -----------------------------------------------------------------------------------------
    def _add_cuts_exposed(self, links: set[Any], count: int) -> None:
        if not links:
            return
        token = self._token()
        self._expose(count, token)
        self.active_cuts[token] = links
        self._apply_cuts()
        self.loop.after(self.fault_rng.uniform(0.3, self.plan.max_partition), self._end_cuts, token)

    def _end_cuts(self, token: int) -> None:
        self._unexpose(token)
        super()._end_cuts(token)

    def _isolatable(self) -> list[Node]:
        return [n for n in self.world.nodes if n is not None and n.state in (RUNNING, PAUSED, LEAVING)]

    def _partition(self) -> None:
        if self.healed or self.sc.members < 2:
            return
        rng = self.fault_rng
        nodes = self._isolatable()
        budget = self.setup.num_owners - 1 - self.exposed
        k = min(budget, (len(nodes) - 1) // 2)
        if k < 1 or not self._may_expose(1):
            self._skip()
            return
        k = rng.randint(1, k)
        if not self._may_expose(k):
            k = 1
        cut_off = {n.endpoint for n in rng.sample(nodes, k)}
        rest = [e for e in self.world.endpoints if e not in cut_off]
        links = {(a, b) for a in cut_off for b in rest} | {(b, a) for a in cut_off for b in rest}
        self._add_cuts_exposed(links, k)

    def _asymmetric(self) -> None:
        if self.healed or self.sc.members < 2:
            return
        nodes = self._isolatable()
        if len(nodes) < 2 or not self._may_expose(1):
            self._skip()
            return
        rng = self.fault_rng
        one = rng.choice(nodes).endpoint
        others = [e for e in self.world.endpoints if e != one]
        if rng.random() < 0.5:
            others = others[: rng.randint(1, len(others))]
        # One member's links one way only: it hears the others but they do not hear it, or the reverse.
        links = {(one, o) for o in others} if rng.random() < 0.5 else {(o, one) for o in others}
        self._add_cuts_exposed(links, 1)

    def _clog(self) -> None:
        if self.healed or self.sc.members < 2:
            return
        if not self._may_expose(1):
            self._skip()
            return
        rng = self.fault_rng
        duration = rng.uniform(0.02, self.plan.max_clog)
        until = self.loop.now + duration
        endpoints = self.world.endpoints
        token = self._token()
        self._expose(1, token)
        if rng.random() < 0.3:
            self.network.clog_endpoint(rng.choice(endpoints), until)
        else:
            src, dst = rng.sample(endpoints, 2)
            self.network.clog_link(src, dst, until)
        self.loop.at(until, self._unexpose, token)

    # -- clients ---------------------------------------------------------------------------------------------
    def _workload(self, slot: int) -> None:
        if self.healed:
            return
        rng = self.work_rng
        self.loop.after(rng.expovariate(self.sc.send_rate), self._workload, slot)
        node = self.world.node(slot)
        if node is None or node.state != RUNNING or node.app is None or not self._app(node).usable:
            return
        self._operate(node, rng)

    def _operate(self, node: Node, rng: random.Random) -> None:
        """One client request through ``node`` (the grid-tx run also starts transactions here)."""
        self._plain(node, rng)

    def _plain(self, node: Node, rng: random.Random) -> None:
        """One client operation on the shared key space: 45% GET, 45% PUT of a fresh value, 10% DELETE."""
        key = f"k{rng.randrange(KEYS)}".encode()
        r = rng.random()
        if r < 0.45:
            self._issue(node, GET, key, None)
        elif r < 0.9:
            self.values += 1
            self._issue(node, PUT, key, f"v{self.values}".encode())
        else:
            self._issue(node, DELETE, key, None)

    def _issue(self, node: Node, kind: int, key: bytes, value: bytes | None, *, final: bool = False) -> str:
        self.op_ids += 1
        hid = str(self.op_ids)
        if final:
            self.final_ops.add(hid)  # before the call: a local read completes inside it
        if kind != GET:
            self.written.add(key)
        self.grid_stats["ops"] += 1
        lifetime = None
        share = self.sc.deadlines
        if share and not final and self.deadline_rng.random() < share:
            # From well under one attempt (1 s) to a few attempts: some expire before their first answer,
            # some between retries, some at an owner that holds the command.
            lifetime = self.deadline_rng.uniform(0.02, 3.0)
            self.grid_stats["ops_with_deadline"] += 1
        lifespan = None
        if kind == PUT and self.sc.lifespans and self.lifespan_rng.random() < self.sc.lifespans:
            # Entries that expire under faults, before the heal and (puts just before it) after: at most 4 s, so
            # every expiry falls before the grid can have converged (settle_time, 6 s, after the heal), and the
            # grid-expired checker can hold the final stores to having removed them.
            lifespan = self.lifespan_rng.uniform(0.05, 4.0)
            self.grid_stats["puts_with_lifespan"] += 1
        self.world.app_call(node.slot, self._app(node).start_op, kind, key, value, hid, lifetime, lifespan)
        return hid

    def op_done(self, app: GridApp, res: OpResult, now: float) -> None:
        hid = app.ops.pop(res.op_id, None)
        if hid is None:
            return
        self.grid_stats["ops_ok" if res.ok else "ops_failed"] += 1
        if res.reason == "full":
            self.grid_stats["puts_refused_full"] += 1
        self.history.add(
            now,
            app.node.name,
            "grid_end",
            id=hid,
            ok=res.ok,
            value=None if res.value is None else res.value.decode(errors="replace"),
            error=res.error or None,
        )
        self.final_ops.discard(hid)

    def _on_gone(self, node: Node, why: str) -> None:
        app = node.app
        if isinstance(app, GridApp) and why == "left":
            # The runtime fails what is still waiting when the member leaves (the write may have happened).
            for hid in list(app.ops.values()):
                self.history.add(
                    self.loop.now, node.name, "grid_end", id=hid, ok=False, value=None, error="member left"
                )
            app.ops.clear()
        super()._on_gone(node, why)

    # -- liveness ----------------------------------------------------------------------------------------------
    def _heal(self) -> None:
        self.exposures.clear()
        self.history.add(self.loop.now, "-", "grid_heal")
        super()._heal()

    def _pending_ops(self) -> int:
        return sum(len(a.ops) for a in self._apps())

    def _operator(self) -> None:
        """Play the operator after healing: a grid degraded for good (owners of the last stable topology are
        gone, and the members left cannot end it themselves: a segment lost every copy, or they are not a
        majority of that topology) is forced available, as docs/grid.md says an operator must do. Only once
        the group itself has converged and settled; the grid-liveness checker says when the grid should not
        have needed it."""
        if self.group_since is None or self.loop.now - self.group_since < self.sc.settle_time:
            return
        apps = self._apps()
        coord = next((a for a in apps if a.grid.planner is not None), None)
        t = coord.grid.topology if coord is not None else None
        if coord is None or t is None or t.availability != Availability.DEGRADED:
            return
        live = {a.me for a in apps}
        if set(t.stable_members) <= live:
            return
        self.history.add(self.loop.now, coord.node.name, "grid_force_available", topology_id=t.topology_id)
        self.grid_stats["forced_available"] += 1
        self.world.app_call(coord.node.slot, coord.grid.force_available)

    def _poll_convergence(self) -> None:
        if self.converged():
            if self.group_since is None:
                self.group_since = self.loop.now
            self._operator()
        else:
            self.group_since = None
        view = self.converged_view() if self.grid_whole() and not self._pending_ops() else None
        if view is not None:  # grid_whole: the group converged too
            key = (view.view_id, self._apps()[0].topology_id)
            if self.settling is None or self.settling[0] != key:
                self.settling = (key, self.loop.now)
            elif self.loop.now - self.settling[1] >= self.sc.settle_time:
                self.converged_at = self.loop.now
                self.history.add(self.loop.now, "-", "grid_converged")
                self._final_reads()
                return
        else:
            self.settling = None
        if self.loop.now >= self.safety_end + self.sc.converge_deadline:
            self.done = True
            return
        self.loop.after(POLL, self._poll_convergence)

    def _final_reads(self) -> None:
        self.final_started = True
        nodes = [n for n in self.world.live_nodes() if n.app is not None]
        rng = self.client_rng
        for key in sorted(self.written):
            node = rng.choice(nodes)
            self._issue(node, GET, key, None, final=True)
        self.final_deadline = self.loop.now + self.sc.deliver_deadline
        self.loop.after(0.05, self._poll_final)

    def _poll_final(self) -> None:
        if not self.final_ops or self.loop.now >= self.final_deadline:
            self._record_stores()
            self.loop.after(0.5, self._finish)
            return
        self.loop.after(0.05, self._poll_final)

    def _record_stores(self) -> None:
        now = self.loop.now
        self.grid_stats["entries_expired"] = sum(app.grid.metrics["grid.entries_expired"] for app in self._apps())
        names = {n.address: n.name for n in self.world.nodes if n is not None}
        for app in self._apps():
            t = app.grid.topology
            store = app.grid.store
            if t is None or store is None:
                continue
            if store.nbytes != store.count_bytes():
                self.byte_counts_wrong.append(
                    (app.node.name, f"its byte count says {store.nbytes}, its store holds {store.count_bytes()}")
                )
            owners = [[names.get(m, str(m)) for m in t.current.owners_of(s)] for s in range(t.num_segments)]
            data = {
                str(s): {k.decode(): v.decode() for k, (_, v) in sorted(entries.items()) if v is not None}
                for s, entries in sorted(store.segments.items())
            }
            self.history.add(now, app.node.name, "grid_store", topology_id=t.topology_id, owners=owners, data=data)

    def judge(self) -> list[Violation]:
        out = super().judge()
        if self.converged_at is None:
            if self.converged():
                # The group converged; the grid did not.
                out = [v for v in out if v.property != "merge-convergence"]
                apps = self._apps()
                states = "; ".join(
                    f"{a.node.name}: topology {a.topology_id} "
                    f"{a.grid.topology.phase.name if a.grid.topology else '-'}"
                    f"/{a.grid.topology.availability.name if a.grid.topology else '-'}, {len(a.ops)} ops pending"
                    f"{', leaving' if a.leave_requested else ''}"
                    for a in apps
                )
                out.append(
                    Violation(
                        "grid-convergence",
                        "-",
                        f"the grid did not converge within {self.sc.converge_deadline:g}s of healing "
                        f"(one balanced topology, no rebalance, every operation finished): {states}",
                    )
                )
        elif self.final_ops:
            out.append(
                Violation(
                    "grid-convergence", "-", f"{len(self.final_ops)} final reads never completed after convergence"
                )
            )
        # The running byte count max_bytes reads must equal what each store holds (store.count_bytes).
        out += [Violation("grid-store-bytes", member, detail) for member, detail in self.byte_counts_wrong]
        return out
