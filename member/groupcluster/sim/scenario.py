"""One simulated run per seed: start a group, inject the seed's faults, heal, and judge the history.

A run has two phases on the virtual clock:

1. **Safety** (``safety_time`` seconds): members start (some late), multicast and unicast test messages at
   random times, and the seed's fault mix hits the network and the members (loss, duplication, jitter,
   clogs, symmetric and asymmetric partitions, crashes and restarts, pauses, graceful leaves and rejoins).
2. **Liveness**: the network heals, paused members resume, no new faults. The group must converge to one
   view holding exactly the live members within ``converge_deadline``; then every live member multicasts
   and unicasts a few messages, which must reach every live member within ``deliver_deadline``.

Everything random comes from one ``random.Random(seed)`` (sub-generators are drawn from it in a fixed
order; the startup faults use a generator of their own, seeded from the seed too), and nothing reads the real
clock, so a seed replays exactly: :func:`check_determinism` runs a seed twice and compares the histories.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import logging
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import protocols  # noqa: F401  (registers every layer by name)
from ..core.address import Address
from ..core.events import UpdateHosts
from ..core.layer import LAYER_TYPES
from ..core.stack import resolve_config
from ..core.view import View
from ..stacks import PRESETS, load_stack_file, preset
from .checkers import check_all
from .faults import FaultPlan, draw_plan, draw_startup
from .grid import checkers, tx_checkers  # noqa: F401  (register the grid stacks' checkers)
from .history import History
from .history_index import Violation
from .loop import EventLoop
from .network import Link, LinkConfig, Network
from .world import LEAVING, PAUSED, RUNNING, AppFactory, Node, World, slot_endpoint

# ``--stack grid``: the data grid (:mod:`groupcluster.sim.grid.run`) on the group stack a grid member runs.
GRID_STACK = "grid"
GRID_TX_STACK = "grid-tx"  # the grid plus transactions (:mod:`groupcluster.sim.grid.tx_run`)
GRID_STACKS = (GRID_STACK, GRID_TX_STACK)
GRID_GROUP_STACK = "vsync"

# Simulated members log here (layers log under ``groupcluster.sim.members.<layer>``); the CLI keeps their
# warnings quiet unless asked, since faults make warnings the normal case.
MEMBER_LOG = logging.getLogger("groupcluster.sim.members")


@dataclass(frozen=True)
class Scenario:
    """The shape of every run; the seed decides the details."""

    members: int = 5
    stack: str | Sequence[Mapping[str, Any]] = "fifo"
    # Per-layer parameter overrides {layer: {key: value}} on top of the stack (e.g. faster timeouts).
    overrides: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    faults: bool = True
    # The startup kinds of the fault plan (partial host lists, staggered starts, shuffled endpoints; sim/faults.py)
    # on top of the others. Pinned regression scenarios set False: their seeds were found without them.
    startup_faults: bool = True
    safety_time: float = 25.0
    converge_deadline: float = 60.0
    # The converged view must stay unchanged this long before liveness traffic starts: suspicions raised
    # during the safety phase (failure detection timeout + verification) may still remove members after the
    # heal, and traffic sent into a view about to split is not owed to everyone.
    settle_time: float = 6.0
    deliver_deadline: float = 20.0
    send_rate: float = 10.0  # workload messages per member per virtual second
    liveness_messages: int = 3  # multicasts per live member after convergence (plus one unicast each)
    cluster: str = "sim"
    # Grid stacks: the share of client operations that carry a client deadline (docs/grid.md, "Client
    # deadlines"); the checkers then hold a failed write to having taken effect before its deadline.
    deadlines: float = 0.0
    # Grid stacks: the share of PUTs that give their entry a lifespan (docs/grid.md, "Expiry"), 0.05-4 virtual
    # seconds; the checkers then allow the key to read absent after it, and require it gone once converged.
    lifespans: float = 0.0
    # Grid stacks: every member's max_entries bound (docs/grid.md, "A bound on entries"; 0: none): PUTs of new
    # keys at a full primary fail, and the checkers hold that nothing of them was written.
    max_entries: int = 0
    # Grid stacks: every member's max_bytes bound on its live key and value bytes (0: none): PUTs that would grow
    # a primary past it fail, and the checkers hold that nothing of them was written.
    max_bytes: int = 0
    # Grid stacks: capacity changes per virtual second during the safety phase (docs/grid.md, "Capacity"): a
    # running member's capacity becomes 0, 0.5, 1 or 2, keeping num_owners members (at least two) with capacity.
    capacity_changes: float = 0.0

    def __post_init__(self) -> None:
        if self.members < 1:
            raise ValueError(f"members: need at least 1, got {self.members}")
        if self.members > 250:
            raise ValueError(f"members: at most 250 (endpoints are 10.0.0.1-250), got {self.members}")
        for name in ("safety_time", "converge_deadline", "settle_time", "deliver_deadline", "send_rate"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: cannot be negative, got {getattr(self, name)}")
        if not 0.0 <= self.deadlines <= 1.0:
            raise ValueError(f"deadlines: expected a share from 0 to 1, got {self.deadlines}")
        if not 0.0 <= self.lifespans <= 1.0:
            raise ValueError(f"lifespans: expected a share from 0 to 1, got {self.lifespans}")
        if self.capacity_changes < 0:
            raise ValueError(f"capacity_changes: cannot be negative, got {self.capacity_changes}")
        if self.max_entries < 0:
            raise ValueError(f"max_entries: cannot be negative, got {self.max_entries}")
        if self.max_bytes < 0:
            raise ValueError(f"max_bytes: cannot be negative, got {self.max_bytes}")

    def stack_name(self) -> str:
        return self.stack if isinstance(self.stack, str) else "custom"


@dataclass
class SeedResult:
    """What one seed produced. Everything but ``history`` is plain data (it crosses process boundaries)."""

    seed: int
    events: int
    violations: list[Violation]
    history_events: int
    end_time: float
    converged_at: float | None
    kinds: list[str]
    plan: str
    stats: dict[str, int]
    digest: str | None = None
    history: History | None = None

    @property
    def ok(self) -> bool:
        return not self.violations

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "ok": self.ok,
            "events": self.events,
            "history_events": self.history_events,
            "end_time": round(self.end_time, 6),
            "converged_at": None if self.converged_at is None else round(self.converged_at, 6),
            "faults": self.kinds,
            "plan": self.plan,
            "stats": self.stats,
            "digest": self.digest,
            "violations": [v.to_json() for v in self.violations],
        }


def build_spec(
    stack: str | Sequence[Mapping[str, Any]],
    endpoints: Sequence[tuple[str, int]],
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """The stack configuration every simulated member uses: a preset name, a YAML file or a list of layers,
    plus overrides. Every layer with an ``initial_hosts`` parameter (discovery) gets the static list of all
    endpoints unless the stack sets one."""
    if stack in GRID_STACKS:
        stack = GRID_GROUP_STACK
    if isinstance(stack, str):
        if stack in PRESETS:
            spec = preset(stack, {k: dict(v) for k, v in (overrides or {}).items()})
            overrides = None
        elif stack.endswith((".yaml", ".yml")) or Path(stack).is_file():
            spec = load_stack_file(stack)
        else:
            from ..core.errors import ConfigError

            raise ConfigError(
                f"stack: {stack!r} is neither a preset nor a YAML file; presets: {', '.join(sorted(PRESETS))}"
            )
    else:
        spec = [dict(e) for e in copy.deepcopy(list(stack))]
    for layer_name, params in (overrides or {}).items():
        entry = next((e for e in spec if e.get("layer") == layer_name), None)
        if entry is None:
            from ..core.errors import ConfigError

            raise ConfigError(
                f"stack overrides: layer {layer_name!r} is not in the stack; "
                f"allowed values: {', '.join(str(e.get('layer')) for e in spec)}"
            )
        entry.update(params)
    hosts = [f"{h}:{p}" for h, p in endpoints]
    for entry in spec:
        cls = LAYER_TYPES.get(str(entry.get("layer")))
        if cls is None or "initial_hosts" in entry:
            continue
        if any(f.name == "initial_hosts" for f in dataclasses.fields(cls.Config)):
            entry["initial_hosts"] = hosts
    return spec


class _Run:
    """The state of one seed's run (kept out of :func:`run_seed` so the schedule reads as methods)."""

    def __init__(self, seed: int, scenario: Scenario, logger: logging.Logger | None) -> None:
        self.seed = seed
        self.sc = scenario
        root = random.Random(seed)
        # Sub-generators in a fixed order: adding draws in one part does not shift the others.
        plan_rng = random.Random(root.getrandbits(64))
        net_rng = random.Random(root.getrandbits(64))
        world_rng = random.Random(root.getrandbits(64))
        self.work_rng = random.Random(root.getrandbits(64))
        self.fault_rng = random.Random(root.getrandbits(64))
        plan = draw_plan(plan_rng, scenario.members) if scenario.faults else FaultPlan()
        # The startup faults draw from a generator of their own, not from ``root``: with them off every other
        # draw of the seed is what it was before they existed, and with them on only the startup differs.
        startup_rng = random.Random(f"startup-{seed}")
        if scenario.faults and scenario.startup_faults:
            plan = draw_startup(startup_rng, plan, scenario.members, scenario.safety_time)
        self.plan = self._adjust_plan(plan)
        self.root = root  # later draws (a subclass's) come after these, so they shift nothing above
        order_rng, hosts_rng = (random.Random(startup_rng.getrandbits(64)) for _ in range(2))
        self.start_rng = random.Random(startup_rng.getrandbits(64))
        self.loop = EventLoop()
        plan = self.plan
        self.clean_link = LinkConfig(delay=plan.delay, jitter=plan.jitter)
        self.network = Network(
            self.loop, net_rng, LinkConfig(plan.delay, plan.jitter, loss=plan.loss, duplicate=plan.duplicate)
        )
        self.history = History()
        self.world = World(
            self.loop,
            self.network,
            self.history,
            self._spec_for,
            slots=scenario.members,
            rng=world_rng,
            cluster=scenario.cluster,
            logger=logger,
            app_factory=self._app_factory(),
            endpoints=self._endpoints(order_rng),
        )
        self.spec = build_spec(scenario.stack, self.world.endpoints, scenario.overrides)
        resolve_config(self.spec)  # a bad configuration fails here, once, with the key named
        # Per-slot stacks when the host lists are partial (keyed by endpoint: a restart gets its slot's list).
        self.host_lists = self._host_lists(hosts_rng)
        self.slot_specs = {
            ep: build_spec(scenario.stack, hosts, scenario.overrides) for ep, hosts in self.host_lists.items()
        }
        for slot, ep in enumerate(self.world.endpoints):
            if ep in self.host_lists:
                self.world.start_fields[slot] = {"hosts": [f"{h}:{p}" for h, p in self.host_lists[ep]]}
        if plan.loss:
            # Per-link loss: every directed link draws its own rate up to the plan's worst.
            for src in self.world.endpoints:
                for dst in self.world.endpoints:
                    if src != dst:
                        self.network.set_link(
                            src,
                            dst,
                            self.network.default.with_(loss=plan.loss * net_rng.uniform(0.3, 1.0)),
                        )
        self.world.on_gone = self._on_gone
        self.world.on_deliver = self._on_deliver
        self.safety_end = scenario.safety_time
        self.healed = False
        self.pending_starts = 0
        self.pause_tokens: dict[int, int] = {}
        self.active_cuts: dict[int, set[Link]] = {}
        self.next_token = 0
        self.converged_at: float | None = None
        self.settling: tuple[Any, float] | None = None  # (converged view id, since when)
        self.expected: set[tuple[str, str, str]] = set()
        self.seen: set[tuple[str, str, str]] = set()
        self.deliver_deadline = 0.0
        self.done = False

    def _spec_for(self, address: Address, endpoints: Sequence[tuple[str, int]]) -> list[dict[str, Any]]:
        return self.slot_specs.get(address.endpoint, self.spec)

    def _endpoints(self, rng: random.Random) -> list[tuple[str, int]]:
        """The slots' endpoints: in slot order, or shuffled (``shuffled_endpoints``) so that the address order
        of members differs from the order of their slots."""
        endpoints = [slot_endpoint(i) for i in range(self.sc.members)]
        if self.plan.shuffled_endpoints:
            rng.shuffle(endpoints)
        return endpoints

    def _host_lists(self, rng: random.Random) -> dict[tuple[str, int], list[tuple[str, int]]]:
        """Each slot's initial_hosts when they are partial (``partial_hosts``; empty: every slot lists all).

        In every pair of slots at least the later one lists the earlier one, so any two members, whoever else is
        alive, have a static way to reach each other: a real group started with these lists can always become
        one, and the convergence check keeps expecting one view. (Lists in which two live members can reach
        neither each other nor anyone alive who knows both would leave them apart in reality too; they are not
        drawn.)
        """
        share = self.plan.partial_hosts
        if not share:
            return {}
        eps = self.world.endpoints
        n = len(eps)
        lists: list[list[tuple[str, int]]] = [[eps[i], *eps[:i]] for i in range(n)]
        for i in range(n):
            for j in range(i + 1, n):
                if rng.random() >= share:
                    lists[i].append(eps[j])  # this pair lists each other
        return {eps[i]: sorted(lists[i]) for i in range(n)}

    def _adjust_plan(self, plan: FaultPlan) -> FaultPlan:
        return plan

    def _app_factory(self) -> AppFactory | None:
        """An application on every member instead of the test workload (the grid run sets one)."""
        return None

    def extra_stats(self) -> dict[str, int]:
        return {}

    # -- schedule ---------------------------------------------------------------------------------------
    def schedule(self) -> None:
        sc, plan, rng, loop = self.sc, self.plan, self.fault_rng, self.loop
        slots = list(range(sc.members))
        late = set(rng.sample(slots[1:], min(plan.late_joiners, len(slots) - 1))) if plan.late_joiners else set()
        for slot in slots:
            t = rng.uniform(1.0, max(1.0, self.safety_end * 0.7)) if slot in late else rng.uniform(0.0, 0.3)
            if plan.start_spread and slot not in late:
                # Drawn after the usual draw, from the startup generator: the fault generator's stream stays.
                t = self.start_rng.uniform(0.0, plan.start_spread)
            self.pending_starts += 1
            loop.at(t, self._start, slot)
        for slot in slots:
            if sc.send_rate > 0:
                loop.at(self.work_rng.expovariate(sc.send_rate), self._workload, slot)
        for rate, action in (
            (plan.crash_rate, self._crash),
            (plan.pause_rate, self._pause),
            (plan.leave_rate, self._leave),
            (plan.partition_rate, self._partition),
            (plan.asymmetric_rate, self._asymmetric),
            (plan.clog_rate, self._clog),
            (plan.update_hosts_rate, self._update_hosts),
        ):
            if rate > 0:
                t = rng.expovariate(rate)
                while t < self.safety_end:
                    loop.at(t, action)
                    t += rng.expovariate(rate)
        loop.at(self.safety_end, self._heal)

    def _token(self) -> int:
        self.next_token += 1
        return self.next_token

    # -- members -----------------------------------------------------------------------------------------
    def _start(self, slot: int) -> None:
        self.pending_starts -= 1
        if self.world.node(slot) is None:
            self.world.start(slot)

    def _later_start(self, slot: int, delay: float) -> None:
        self.pending_starts += 1
        self.loop.after(delay, self._start, slot)

    def _alive_others(self, node: Node) -> int:
        return sum(1 for n in self.world.live_nodes() if n is not node)

    def _pick(self, states: tuple[str, ...]) -> Node | None:
        candidates = [n for n in self.world.nodes if n is not None and n.state in states]
        return self.fault_rng.choice(candidates) if candidates else None

    def _crash(self) -> None:
        if self.healed:
            return
        node = self._pick((RUNNING, PAUSED))
        if node is None or self._alive_others(node) < 1:
            return  # at least one member stays alive
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
        token = self._token()
        self.pause_tokens[node.slot] = token
        self.world.pause(node.slot)
        self.loop.after(self.fault_rng.uniform(0.05, self.plan.max_pause), self._resume, node.slot, token)

    def _resume(self, slot: int, token: int) -> None:
        if self.pause_tokens.get(slot) == token:
            del self.pause_tokens[slot]
            self.world.resume(slot)

    def _leave(self) -> None:
        if self.healed:
            return
        candidates = [n for n in self.world.nodes if n is not None and n.state == RUNNING and n.view is not None]
        if not candidates:
            return
        node = self.fault_rng.choice(candidates)
        if self._alive_others(node) < 1:
            return
        self.world.leave(node.slot)

    def _on_gone(self, node: Node, why: str) -> None:
        if why == "left" and self.fault_rng.random() < self.plan.rejoin_probability:
            self._later_start(node.slot, self.fault_rng.uniform(0.2, 4.0))
        elif why == "join-failed":
            # A member that could not join tries again, as a real process supervisor would restart it.
            self._later_start(node.slot, self.fault_rng.uniform(0.5, 2.0))

    # -- network faults -------------------------------------------------------------------------------------
    def _apply_cuts(self) -> None:
        cuts: set[Link] = set()
        for links in self.active_cuts.values():
            cuts |= links
        self.network.cuts = cuts

    def _add_cuts(self, links: set[Link]) -> None:
        if not links:
            return
        token = self._token()
        self.active_cuts[token] = links
        self._apply_cuts()
        self.loop.after(self.fault_rng.uniform(0.3, self.plan.max_partition), self._end_cuts, token)

    def _end_cuts(self, token: int) -> None:
        if self.active_cuts.pop(token, None) is not None:
            self._apply_cuts()

    def _partition(self) -> None:
        if self.healed or self.sc.members < 2:
            return
        rng = self.fault_rng
        endpoints = list(self.world.endpoints)
        rng.shuffle(endpoints)
        groups = 2 if len(endpoints) < 4 or rng.random() < 0.7 else 3
        cuts = sorted(rng.sample(range(1, len(endpoints)), min(groups - 1, len(endpoints) - 1)))
        parts = [endpoints[a:b] for a, b in zip([0, *cuts], [*cuts, len(endpoints)], strict=True)]
        links = {(s, d) for i, a in enumerate(parts) for j, b in enumerate(parts) if i != j for s in a for d in b}
        self._add_cuts(links)

    def _asymmetric(self) -> None:
        if self.healed or self.sc.members < 2:
            return
        rng = self.fault_rng
        endpoints = list(self.world.endpoints)
        rng.shuffle(endpoints)
        k = rng.randint(1, len(endpoints) - 1)
        sources, destinations = endpoints[:k], endpoints[k:]
        if rng.random() < 0.5:
            # Only some of the links one way: a single one-way cut is the nastiest case for FD and merge.
            destinations = destinations[: rng.randint(1, len(destinations))]
        self._add_cuts({(s, d) for s in sources for d in destinations})

    def _clog(self) -> None:
        if self.healed or self.sc.members < 2:
            return
        rng = self.fault_rng
        until = self.loop.now + rng.uniform(0.02, self.plan.max_clog)
        endpoints = self.world.endpoints
        if rng.random() < 0.3:
            self.network.clog_endpoint(rng.choice(endpoints), until)
        else:
            src, dst = rng.sample(endpoints, 2)
            self.network.clog_link(src, dst, until)

    def _update_hosts(self) -> None:
        if self.healed:
            return
        node = self._pick((RUNNING,))
        if node is not None:
            hosts = list(self.world.endpoints)
            self.fault_rng.shuffle(hosts)
            self.world.control(node.slot, UpdateHosts(tuple(hosts)))

    # -- workload ----------------------------------------------------------------------------------------------
    def _workload(self, slot: int) -> None:
        if self.healed:
            return
        rng = self.work_rng
        self.loop.after(rng.expovariate(self.sc.send_rate), self._workload, slot)
        node = self.world.node(slot)
        if node is None or node.state != RUNNING or node.view is None or node.blocked:
            return
        size = rng.randint(1, 200)
        if self.plan.big_message_fraction and rng.random() < self.plan.big_message_fraction:
            size = rng.randint(60_000, 200_000)
        if rng.random() < 0.75:
            count = rng.randint(2, 6) if rng.random() < 0.1 else 1
            self.world.send(slot, None, count, size)
        else:
            others = [m for m in node.view.members if m != node.address]
            if others:
                self.world.send(slot, rng.choice(others), 1, size)

    # -- liveness -------------------------------------------------------------------------------------------------
    def _heal(self) -> None:
        self.healed = True
        self.active_cuts.clear()
        self.network.heal(self.clean_link)
        for slot in list(self.pause_tokens):
            del self.pause_tokens[slot]
            self.world.resume(slot)
        self.loop.after(0.1, self._poll_convergence)

    def converged(self) -> bool:
        return self.converged_view() is not None

    def converged_view(self) -> View | None:
        """The one view every live member installed, of exactly those members; None while they differ (or one
        is still starting or leaving)."""
        world = self.world
        if self.pending_starts or any(n is not None and n.state == LEAVING for n in world.nodes):
            return None
        live = world.live_nodes()
        if not live or live[0].view is None:
            return None
        view = live[0].view
        if {n.address for n in live} != set(view.members) or len(view.members) != len(live):
            return None
        return view if all(n.view is not None and n.view.view_id == view.view_id for n in live) else None

    def _poll_convergence(self) -> None:
        view = self.converged_view()
        if view is not None:
            view_id = view.view_id
            if self.settling is None or self.settling[0] != view_id:
                self.settling = (view_id, self.loop.now)
            elif self.loop.now - self.settling[1] >= self.sc.settle_time:
                self.converged_at = self.loop.now
                self._liveness_traffic()
                return
        else:
            self.settling = None
        if self.loop.now >= self.safety_end + self.sc.converge_deadline:
            self.done = True
            return
        self.loop.after(0.1, self._poll_convergence)

    def _liveness_traffic(self) -> None:
        live = self.world.live_nodes()
        names = [n.name for n in live]
        for i, node in enumerate(live):
            if self.sc.liveness_messages:
                for msg in self.world.send(node.slot, None, self.sc.liveness_messages, 32):
                    self.expected.update((r, node.name, msg) for r in names)
            if len(live) > 1:
                peer = live[(i + 1) % len(live)]
                for msg in self.world.send(node.slot, peer.address, 1, 32):
                    self.expected.add((peer.name, node.name, msg))
        self.deliver_deadline = self.loop.now + self.sc.deliver_deadline
        self.loop.after(0.05, self._poll_delivery)

    def _on_deliver(self, node: Node, sender: str, msg: str) -> None:
        if self.converged_at is not None:
            # Kept as a set, not matched against ``expected`` right away: loopback deliveries happen inside
            # the send step, before the sent ids are known.
            self.seen.add((node.name, sender, msg))

    def _poll_delivery(self) -> None:
        self.expected -= self.seen
        self.seen.clear()
        if not self.expected:
            # Everything arrived: run a little longer so late duplicates or stray views still show up.
            self.loop.after(0.5, self._finish)
            return
        if self.loop.now >= self.deliver_deadline:
            self.done = True
            return
        self.loop.after(0.05, self._poll_delivery)

    def _finish(self) -> None:
        self.done = True

    # -- run ----------------------------------------------------------------------------------------------------------
    def run(self) -> None:
        self.schedule()
        limit = self.safety_end + self.sc.converge_deadline + self.sc.deliver_deadline + 5.0
        self.loop.run_until(limit, lambda: self.done)

    def judge(self) -> list[Violation]:
        world = self.world
        live = [n.name for n in world.live_nodes()]
        out = list(world.errors)
        out.extend(check_all(self.history, live=live, converged_at=self.converged_at, stack=self.sc.stack_name()))
        leaving = [n.name for n in world.nodes if n is not None and n.state == LEAVING]
        if leaving:
            out.append(Violation("leave-completes", ", ".join(leaving), "a graceful leave never completed"))
        if self.converged_at is None and not any(v.property == "merge-convergence" for v in out):
            views = "; ".join(f"{n.name}: {n.view}" for n in world.live_nodes())
            out.append(
                Violation(
                    "merge-convergence",
                    "-",
                    f"no single view of all live members within {self.sc.converge_deadline:g}s of healing "
                    f"({views or 'no live member'})",
                )
            )
        elif (
            self.converged_at is not None and self.expected and not any(v.property == "liveness-delivery" for v in out)
        ):
            out.append(Violation("liveness-delivery", "-", f"{len(self.expected)} deliveries still missing"))
        return out


def run_seed(
    seed: int,
    scenario: Scenario | None = None,
    *,
    record: str | Path | None = None,
    digest: bool = False,
    keep_history: bool = False,
    logger: logging.Logger | None = None,
) -> SeedResult:
    """Run one seed and judge it. ``record`` writes the history as JSON lines; ``digest`` hashes them."""
    sc = scenario or Scenario()
    if sc.stack == GRID_STACK:
        from .grid.run import GridRun

        run: _Run = GridRun(seed, sc, logger or MEMBER_LOG)
    elif sc.stack == GRID_TX_STACK:
        from .grid.tx_run import GridTxRun

        run = GridTxRun(seed, sc, logger or MEMBER_LOG)
    else:
        run = _Run(seed, sc, logger or MEMBER_LOG)
    run.run()
    violations = run.judge()
    lines: list[str] | None = None
    if record is not None or digest:
        lines = run.history.to_lines()
    if record is not None:
        Path(record).write_text("".join(line + "\n" for line in lines or ()))
    stats = {
        "members_started": run.world.stats["started"],
        "sent": run.world.stats["sent"],
        "delivered": run.world.stats["delivered"],
        "crashes": run.world.stats["crashed"],
        "pauses": run.world.stats["paused"],
        "leaves": run.world.stats["leaves"],
        "frames": run.network.stats["sent"],
        "frames_lost": run.network.stats["lost"],
        "frames_cut": run.network.stats["cut"],
        "frames_duplicated": run.network.stats["duplicated"],
        "frames_held": run.network.stats["held"],
        **run.extra_stats(),
    }
    return SeedResult(
        seed=seed,
        events=run.loop.processed,
        violations=violations,
        history_events=len(run.history),
        end_time=run.loop.now,
        converged_at=run.converged_at,
        kinds=run.plan.kinds(),
        plan=run.plan.describe(),
        stats=stats,
        digest=history_digest(lines) if lines is not None else None,
        history=run.history if keep_history else None,
    )


def history_digest(lines: Sequence[str]) -> str:
    """SHA-256 of a history's JSON lines: equal digests mean equal runs."""
    h = hashlib.sha256()
    for line in lines:
        h.update(line.encode())
        h.update(b"\n")
    return h.hexdigest()


@dataclass(frozen=True)
class DeterminismReport:
    seed: int
    same: bool
    digests: tuple[str, str]
    first_difference: str | None


def check_determinism(seed: int, scenario: Scenario | None = None) -> DeterminismReport:
    """Run ``seed`` twice; the histories must be identical line for line."""
    a = run_seed(seed, scenario, keep_history=True)
    b = run_seed(seed, scenario, keep_history=True)
    assert a.history is not None and b.history is not None
    la, lb = a.history.to_lines(), b.history.to_lines()
    da, db = history_digest(la), history_digest(lb)
    first: str | None = None
    if da != db:
        for i, (x, y) in enumerate(zip(la, lb, strict=False)):
            if x != y:
                first = f"line {i + 1}: {x} != {y}"
                break
        else:
            first = f"lengths differ: {len(la)} != {len(lb)} lines"
    return DeterminismReport(seed, da == db, (da, db), first)
