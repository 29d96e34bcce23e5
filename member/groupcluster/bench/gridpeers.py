"""The grid peers of the peers suite, pure part: configurations, the harness's lines, and the figures.

Infinispan (embedded, a distributed cache, 256 segments, 2 owners) and Hazelcast (embedded IMap, 1 backup) run in
member JVMs built from ``bench/peers/grid`` (:mod:`groupcluster.bench.gridpeers_run` starts them); our grid runs
as ``groupcluster member --grid --http`` processes. Nothing here starts a process or reads a clock, so it is
unit-tested (tests/unit/test_bench_gridpeers.py): the XML files each peer gets, the lines the harness prints,
what a rebalance moved (from the segments each member held before and after, and the keys per segment), and
the statistics of a workload's runs (median, spread, CPU per MB or per operation).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from xml.sax.saxutils import escape

from .fair import summarize
from .model import (
    GROUPCLUSTER,
    HAZELCAST,
    HAZELCAST_TUNED,
    INFINISPAN,
    INFINISPAN_TUNED,
    Result,
)

SEGMENTS = 256  # Infinispan's segments (and ours)
OWNERS = 2
HAZELCAST_BACKUPS = 1
CACHE = "bench"  # the cache / map name
KEY_BYTES = len("bulk-0000000")  # the loaded keys; a move's bytes are its entries' key and value bytes
# The documented bulk-transfer tuning of each peer's "-tuned" row (default settings otherwise):
# Infinispan: the state-transfer chunk size (entries per state chunk; default 512);
# Hazelcast: migrations in flight at once (hazelcast.partition.max.parallel.migrations; default 10).
INFINISPAN_TUNED_CHUNK = 10_000
HAZELCAST_TUNED_PARALLEL = 32
TUNING = {
    INFINISPAN_TUNED: f'state-transfer chunk-size="{INFINISPAN_TUNED_CHUNK}" (default 512)',
    HAZELCAST_TUNED: f"hazelcast.partition.max.parallel.migrations={HAZELCAST_TUNED_PARALLEL} (default 10)",
}
BASE_SYSTEM = {INFINISPAN: INFINISPAN, INFINISPAN_TUNED: INFINISPAN, HAZELCAST: HAZELCAST, HAZELCAST_TUNED: HAZELCAST}
OPS_STEPS = ("single-put", "single-get", "batch-put", "batch-get")
# The JVM options of every member and client JVM; a member of the 1,000,000-entry grid holds ~1/2 of it.
MEMBER_JVM_OPTS = ("-Xms512m", "-Xmx2g", "-Djava.net.preferIPv4Stack=true", "-Dhazelcast.phone.home.enabled=false")
CLIENT_JVM_OPTS = ("-Xms128m", "-Xmx512m", "-Djava.net.preferIPv4Stack=true", "-Dhazelcast.phone.home.enabled=false")


class HarnessError(ValueError):
    """A harness line that does not parse, or figures that cannot be computed from a run."""


# -- configurations -------------------------------------------------------------------------------------------
def infinispan_xml(cluster: str, name: str, jgroups_ports: Sequence[int], tuned: bool = False) -> str:
    """An Infinispan configuration: its default TCP stack with TCPPING on 127.0.0.1 in place of MPING.

    The member's own address and port come from system properties (:func:`infinispan_properties`), as the
    stock ``default-jgroups-tcp.xml`` reads them; only discovery is replaced (multicast discovery does not
    reach across loopback members reliably). The cache: distributed, synchronous, 256 segments, 2 owners.
    """
    hosts = ",".join(f"127.0.0.1[{p}]" for p in jgroups_ports)
    state = f'\n      <state-transfer chunk-size="{INFINISPAN_TUNED_CHUNK}"/>' if tuned else ""
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<infinispan xmlns="urn:infinispan:config:15.0">
  <jgroups>
    <stack name="bench-tcp" extends="tcp">
      <TCPPING initial_hosts="{escape(hosts)}" port_range="0" stack.combine="REPLACE" stack.position="MPING"/>
    </stack>
  </jgroups>
  <cache-container name="{escape(cluster)}">
    <transport cluster="{escape(cluster)}" stack="bench-tcp" node-name="{escape(name)}"/>
    <distributed-cache name="{CACHE}" mode="SYNC" owners="{OWNERS}" segments="{SEGMENTS}">{state}
    </distributed-cache>
  </cache-container>
</infinispan>
"""


def infinispan_properties(port: int) -> list[str]:
    """The system properties the stock TCP stack reads for the address (FD_SOCK2 at port + 100)."""
    return ["-Djgroups.bind.address=127.0.0.1", f"-Djgroups.bind.port={port}", "-Djgroups.fd.port-offset=100"]


def hazelcast_xml(cluster: str, port: int, member_ports: Sequence[int], tuned: bool = False) -> str:
    """A Hazelcast member configuration: TCP-IP join on 127.0.0.1, the map with 1 backup, defaults otherwise."""
    members = "\n".join(f"          <member>127.0.0.1:{p}</member>" for p in member_ports)
    props = ['    <property name="hazelcast.phone.home.enabled">false</property>']
    if tuned:
        props.append(
            f'    <property name="hazelcast.partition.max.parallel.migrations">{HAZELCAST_TUNED_PARALLEL}</property>'
        )
    properties = "\n".join(props)
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<hazelcast xmlns="http://www.hazelcast.com/schema/config">
  <cluster-name>{escape(cluster)}</cluster-name>
  <properties>
{properties}
  </properties>
  <network>
    <!-- A member that leaves and joins again in the same JVM binds its port again at once. -->
    <reuse-address>true</reuse-address>
    <port auto-increment="false">{port}</port>
    <interfaces enabled="true">
      <interface>127.0.0.1</interface>
    </interfaces>
    <join>
      <auto-detection enabled="false"/>
      <multicast enabled="false"/>
      <tcp-ip enabled="true">
        <member-list>
{members}
        </member-list>
      </tcp-ip>
    </join>
  </network>
  <map name="{CACHE}">
    <backup-count>{HAZELCAST_BACKUPS}</backup-count>
  </map>
</hazelcast>
"""


# -- the harness's lines --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StateLine:
    """``STATE epoch_ms members owned stable``: what a member held when it changed."""

    t: float  # seconds since the epoch
    members: int
    owned: int
    stable: bool


def parse_view(line: str) -> tuple[float, int] | None:
    """``VIEW epoch_ms n`` -> (seconds since the epoch, n); None for any other line."""
    if not line.startswith("VIEW "):
        return None
    parts = line.split()
    if len(parts) != 3:
        raise HarnessError(f"bad VIEW line {line!r}")
    return float(parts[1]) / 1000.0, int(parts[2])


def parse_state(line: str) -> StateLine | None:
    if not line.startswith("STATE "):
        return None
    parts = line.split()
    if len(parts) != 5:
        raise HarnessError(f"bad STATE line {line!r}")
    return StateLine(float(parts[1]) / 1000.0, int(parts[2]), int(parts[3]), parts[4] == "1")


def parse_list(line: str, tag: str) -> list[Any]:
    """The JSON after ``TAG `` (``OWNED [..]``, ``SEGCOUNTS [..]``, ``SAMPLES [[..],..]``)."""
    if not line.startswith(tag + " "):
        raise HarnessError(f"expected {tag}, got {line[:80]!r}")
    value = json.loads(line[len(tag) + 1 :])
    if not isinstance(value, list):
        raise HarnessError(f"{tag}: not a list: {line[:80]!r}")
    return value


def parse_done(line: str) -> dict[str, float]:
    """``DONE {json}`` of an OPS step: start, end (epoch ms), ops, errors, p50_ms, p99_ms."""
    if not line.startswith("DONE "):
        raise HarnessError(f"expected DONE, got {line[:80]!r}")
    doc = json.loads(line[len("DONE ") :])
    for key in ("start", "end", "ops", "errors", "p50_ms", "p99_ms"):
        if not isinstance(doc.get(key), int | float):
            raise HarnessError(f"DONE without a number {key!r}: {line[:120]!r}")
    return {k: float(v) for k, v in doc.items() if isinstance(v, int | float)}


# -- a rebalance ----------------------------------------------------------------------------------------------
def entries_moved(
    before: Mapping[str, Sequence[int]], after: Mapping[str, Sequence[int]], counts: Sequence[int]
) -> int:
    """Entries copied to members that did not hold them: per member, the segments it holds now and did not.

    A copy promoted from backup to primary moves nothing, and a member losing a segment receives nothing, so
    this counts what the peer had to send (the loaded keys only: ``counts[s]`` keys of the load are in ``s``).
    """
    moved = 0
    for member, segs in after.items():
        had = set(before.get(member, ()))
        moved += sum(counts[s] for s in set(segs) - had)
    return moved


def end_of_rebalance(states: Mapping[str, Sequence[StateLine]], members: int, since: float) -> float | None:
    """When the last member installed its final balanced state, or None while the grid is not balanced.

    Balanced: every member's last state has ``members`` members, no migration running, and a share of the
    segments (the joiner holds some). The time is the latest of those last states (the same rule as ours: the
    time the last member installed the balanced topology, not when a poll saw it).
    """
    if len(states) != members:
        return None
    last = []
    for lines in states.values():
        if not lines:
            return None
        s = lines[-1]
        if s.members != members or not s.stable or s.owned == 0:
            return None
        last.append(max(s.t, since))
    return max(last)


def pct(values: Sequence[float], p: float) -> float:
    """The p-th percentile (nearest rank below, as bench/grid_rebalance.py), or nan for no values."""
    xs = sorted(values)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")


@dataclass
class RebalanceRun:
    """One run of one system: a load, a discarded warm-up join and leave, then the measured join."""

    system: str
    entries_loaded: int
    value_size: int
    t_joined: float  # seconds since the epoch: the first view with the joiner
    t_done: float  # the last member's balanced state
    entries: int  # moved in the measured join
    nbytes: float
    cpu_members: float  # CPU seconds of all member processes from the join to the end
    samples: list[tuple[float, float, bool]]  # the writer's (start epoch s, ms, ok)
    idle_from: float  # writes started in [idle_from, idle_to) are the idle ones
    idle_to: float
    warmup_seconds: float = 0.0

    @property
    def seconds(self) -> float:
        return max(1e-9, self.t_done - self.t_joined)

    def figures(self) -> dict[str, float]:
        ok = [(t, ms) for t, ms, good in self.samples if good]
        idle = [ms for t, ms in ok if self.idle_from <= t < self.idle_to]
        during = [ms for t, ms in ok if self.t_joined <= t <= self.t_done]
        mb = self.nbytes / 1e6
        return {
            "mb_per_s": mb / self.seconds,
            "entries_per_s": self.entries / self.seconds,
            "idle_p99_ms": pct(idle, 99),
            "during_p99_ms": pct(during, 99),
            "cpu_ms_per_mb": self.cpu_members * 1000 / max(1e-9, mb),
            "seconds": self.seconds,
            "entries_moved": float(self.entries),
            "mb_moved": mb,
            "writes_idle": float(len(idle)),
            "writes_during": float(len(during)),
            "writes_failed": float(sum(1 for _, _, good in self.samples if not good)),
        }


@dataclass
class OpsStep:
    """One step (e.g. single-put) of one run: every client's DONE object, and the members' CPU seconds."""

    clients: list[dict[str, float]]
    cpu_members: float
    cpu_clients: float

    def figures(self) -> dict[str, float]:
        if not self.clients:
            raise HarnessError("an OPS step without clients")
        start = min(c["start"] for c in self.clients) / 1000.0
        end = max(c["end"] for c in self.clients) / 1000.0
        ops = sum(c["ops"] for c in self.clients)
        return {
            "ops_per_s": ops / max(1e-9, end - start),
            # The medians over the clients of each client's request percentiles.
            "p50_ms": statistics.median(c["p50_ms"] for c in self.clients),
            "p99_ms": statistics.median(c["p99_ms"] for c in self.clients),
            "cpu_us_per_op": self.cpu_members * 1e6 / max(1.0, ops),
            "client_cpu_us_per_op": self.cpu_clients * 1e6 / max(1.0, ops),
            "errors": sum(c["errors"] for c in self.clients),
        }


# -- results --------------------------------------------------------------------------------------------------
def grid_result(
    workload: str,
    system: str,
    unit: str,
    samples: Sequence[float],
    cpu: Sequence[float] = (),
    cpu_unit: str = "",
    note: str = "",
) -> Result:
    """A grid-peer figure: the median of the runs, their spread, and the CPU the members spent for it."""
    if not samples:
        raise HarnessError(f"{workload}/{system}: no samples")
    s = summarize(samples)
    return Result(
        workload,
        system,
        s["median"],
        unit,
        [float(x) for x in samples],
        note,
        spread=s,
        cpu_samples=[float(x) for x in cpu],
        cpu=statistics.median(cpu) if cpu else None,
        cpu_unit=cpu_unit,
    )


def system_note(system: str) -> str:
    """What the system's row ran, for the JSON's note."""
    if system in TUNING:
        return "tuned for bulk transfer: " + TUNING[system]
    if system == INFINISPAN:
        return "Infinispan 15.0 embedded, DIST_SYNC, 256 segments, 2 owners, default settings"
    if system == HAZELCAST:
        return "Hazelcast 5.5 embedded IMap, backup count 1, default settings"
    if system == GROUPCLUSTER:
        return "groupcluster members (groupcluster member --grid --http)"
    return ""
