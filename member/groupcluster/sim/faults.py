"""Fault mixes: each seed draws which kinds of fault are on and how hard they hit.

Every kind is on for about half of the seeds, independently, so a few hundred seeds cover every kind and
many combinations. Intensities are drawn per seed too (loss up to 30 %, pauses up to a few seconds, ...).

The startup kinds (:data:`STARTUP_KINDS`: partial host lists, staggered starts, shuffled endpoints) are drawn by
:func:`draw_startup` from a generator of their own, so switching them on or off changes no other draw of a seed.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import asdict, dataclass, fields

# Every fault kind a plan can switch on; tests check that a batch of seeds covers them all.
FAULT_KINDS = (
    "loss",
    "duplicate",
    "jitter",
    "clog",
    "partition",
    "asymmetric",
    "crash",
    "pause",
    "leave",
    "late-join",
    "update-hosts",
    "big-messages",
    "partial-hosts",
    "staggered-start",
    "endpoint-order",
)
# The kinds :func:`draw_startup` adds: how members are configured and started rather than what hits them later.
STARTUP_KINDS = ("partial-hosts", "staggered-start", "endpoint-order")


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """What one seed does to the group during its safety phase. Rates are events per virtual second."""

    delay: float = 0.001  # base one-way delay of every link
    jitter: float = 0.0  # extra uniform delay: reorders frames
    loss: float = 0.0  # the worst link's loss probability; each link draws its own, up to this
    duplicate: float = 0.0
    clog_rate: float = 0.0
    max_clog: float = 0.0
    partition_rate: float = 0.0
    asymmetric_rate: float = 0.0
    max_partition: float = 0.0
    crash_rate: float = 0.0
    restart_probability: float = 0.0
    pause_rate: float = 0.0
    max_pause: float = 0.0
    leave_rate: float = 0.0
    rejoin_probability: float = 0.0
    late_joiners: int = 0
    update_hosts_rate: float = 0.0
    big_message_fraction: float = 0.0
    # Startup faults (draw_startup). partial_hosts: the share of slot pairs in which only the later slot lists
    # the earlier one in its initial_hosts (1.0: slot i lists exactly slots 0..i); the other pairs list each
    # other. start_spread: members that are not late joiners start at random within this many seconds instead
    # of together. shuffled_endpoints: slots get the endpoints in a random order, so address order (merge
    # leaders, coordinators) does not follow slot order (host lists, who is never a late joiner).
    partial_hosts: float = 0.0
    start_spread: float = 0.0
    shuffled_endpoints: bool = False

    def kinds(self) -> list[str]:
        """The fault kinds this plan switches on, in :data:`FAULT_KINDS` order."""
        on = {
            "loss": self.loss > 0,
            "duplicate": self.duplicate > 0,
            "jitter": self.jitter > 0,
            "clog": self.clog_rate > 0,
            "partition": self.partition_rate > 0,
            "asymmetric": self.asymmetric_rate > 0,
            "crash": self.crash_rate > 0,
            "pause": self.pause_rate > 0,
            "leave": self.leave_rate > 0,
            "late-join": self.late_joiners > 0,
            "update-hosts": self.update_hosts_rate > 0,
            "big-messages": self.big_message_fraction > 0,
            "partial-hosts": self.partial_hosts > 0,
            "staggered-start": self.start_spread > 0,
            "endpoint-order": self.shuffled_endpoints,
        }
        return [k for k in FAULT_KINDS if on[k]]

    def describe(self) -> str:
        parts = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value is True:
                parts.append(f.name)
            elif value:
                parts.append(f"{f.name}={value:.3g}" if isinstance(value, float) else f"{f.name}={value}")
        return " ".join(parts) or "no faults"

    def to_json(self) -> dict[str, float | bool]:
        return asdict(self)


def draw_plan(rng: random.Random, members: int) -> FaultPlan:
    """Draw one seed's fault mix. Every draw happens whether or not the kind is on, so adding a kind at the
    end does not change the plans of existing seeds for the kinds before it."""

    def on() -> bool:
        return rng.random() < 0.5

    delay = rng.uniform(0.0005, 0.005)
    jitter = rng.uniform(0.001, 0.03) if on() else 0.0
    loss = rng.uniform(0.01, 0.30) if on() else 0.0
    duplicate = rng.uniform(0.01, 0.10) if on() else 0.0
    clog = on()
    clog_rate, max_clog = rng.uniform(0.1, 0.8), rng.uniform(0.1, 2.5)
    partition = on()
    partition_rate = rng.uniform(0.05, 0.3)
    asymmetric = on()
    asymmetric_rate = rng.uniform(0.05, 0.3)
    max_partition = rng.uniform(0.5, 5.0)
    crash = on()
    crash_rate, restart_probability = rng.uniform(0.05, 0.3), rng.uniform(0.3, 1.0)
    pause = on()
    pause_rate, max_pause = rng.uniform(0.05, 0.4), rng.uniform(0.05, 4.0)
    leave = on()
    leave_rate, rejoin_probability = rng.uniform(0.05, 0.25), rng.uniform(0.3, 1.0)
    late = on()
    late_joiners = rng.randint(1, max(1, members // 2)) if members > 1 else 0
    update_hosts = on()
    update_hosts_rate = rng.uniform(0.1, 1.0)
    big = on()
    big_message_fraction = rng.uniform(0.005, 0.03)
    return FaultPlan(
        delay=delay,
        jitter=jitter,
        loss=loss,
        duplicate=duplicate,
        clog_rate=clog_rate if clog else 0.0,
        max_clog=max_clog if clog else 0.0,
        partition_rate=partition_rate if partition else 0.0,
        asymmetric_rate=asymmetric_rate if asymmetric and members > 1 else 0.0,
        max_partition=max_partition if (partition or asymmetric) else 0.0,
        crash_rate=crash_rate if crash else 0.0,
        restart_probability=restart_probability if crash else 0.0,
        pause_rate=pause_rate if pause else 0.0,
        max_pause=max_pause if pause else 0.0,
        leave_rate=leave_rate if leave else 0.0,
        rejoin_probability=rejoin_probability if leave else 0.0,
        late_joiners=late_joiners if late else 0,
        update_hosts_rate=update_hosts_rate if update_hosts else 0.0,
        big_message_fraction=big_message_fraction if big else 0.0,
    )


def draw_startup(rng: random.Random, plan: FaultPlan, members: int, safety_time: float = 25.0) -> FaultPlan:
    """Add the startup kinds to ``plan``, each on for about half of the seeds; ``rng`` is theirs alone (every
    draw happens whether or not the kind is on, like :func:`draw_plan`). Starts spread over at most half the
    safety phase, so the other faults still hit a group that has formed."""

    def on() -> bool:
        return rng.random() < 0.5

    partial = on()
    # Half of the partial seeds get the pure prefix: the first slot lists only itself.
    partial_hosts = 1.0 if rng.random() < 0.5 else rng.uniform(0.2, 1.0)
    stagger = on()
    start_spread = rng.uniform(0.5, max(0.5, min(8.0, safety_time / 2)))
    shuffled = on()
    if members < 2:
        return plan
    return dataclasses.replace(
        plan,
        partial_hosts=partial_hosts if partial else 0.0,
        start_spread=start_spread if stagger else 0.0,
        shuffled_endpoints=shuffled,
    )
