"""The Prometheus text of ``GET /metrics``, rendered from :data:`METRICS`: one row per metric family (name, type,
help, how to read its samples from the member, and when it is present)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..invalidation import InvalidationNode

if TYPE_CHECKING:
    from ...core.view import View
    from ...runtime.channel import Channel
    from ..caches import CacheRuntime, CacheSet
    from ..driver.grid_runtime import GridRuntime
    from ..node import GridNode
    from .context import MemberContext

# A family's samples: (labels, value), labels in Prometheus form (``{op="get"}``) or "" for none.
Samples = Sequence[tuple[str, float]]


@dataclass(frozen=True, slots=True)
class _State:
    """What one rendering reads: the member context, its channel and view, and the channel's counters. The grid
    and cache properties are read only by rows whose ``when`` holds."""

    ctx: MemberContext
    ch: Channel | None
    view: View | None
    proto: dict[str, int]

    @classmethod
    def of(cls, ctx: MemberContext) -> _State:
        ch = ctx.channel()
        return cls(ctx, ch, ch.view if ch is not None else None, ch.metrics() if ch is not None else {})

    @property
    def grid(self) -> GridRuntime:
        assert self.ctx.grid is not None
        return self.ctx.grid

    @property
    def node(self) -> GridNode:
        node = self.grid.node
        assert node is not None
        return node

    @property
    def gm(self) -> Counter[str]:
        """The grid node's counters."""
        return self.node.metrics

    @property
    def ops(self) -> Counter[str]:
        """The grid runtime's counters (client operations, batches, persistence, transactions)."""
        return self.grid.counters

    @property
    def caches(self) -> CacheSet:
        assert self.ctx.caches is not None
        return self.ctx.caches

    def named_caches(self) -> list[tuple[str, str, CacheRuntime]]:
        """(name, labels ``cache="...",mode="..."``, runtime) of every named cache, in declaration order."""
        caches = self.caches
        return [
            (name, f'cache="{_label(name)}",mode="{caches.mode_of(name)}"', rt) for name, rt in caches.named.items()
        ]


@dataclass(frozen=True, slots=True)
class Metric:
    """One metric family: rendered as its HELP and TYPE lines and then one line per sample, when ``when`` holds."""

    name: str
    kind: str  # "gauge" or "counter"
    help: str
    samples: Callable[[_State], Samples]
    when: Callable[[_State], bool] | None = None


def _one(read: Callable[[_State], float]) -> Callable[[_State], Samples]:
    """The samples of a family with a single unlabelled value."""
    return lambda s: [("", read(s))]


def _sum(metrics: dict[str, int], suffix: str) -> int:
    return sum(v for k, v in metrics.items() if k.endswith(suffix))


def _label(text: str) -> str:
    return json.dumps(text)[1:-1]


def _has_grid(s: _State) -> bool:
    return s.ctx.grid is not None and s.ctx.grid.node is not None


def _has_store(s: _State) -> bool:
    return _has_grid(s) and s.node.store is not None


def _has_caches(s: _State) -> bool:
    return s.ctx.caches is not None


def _owned(s: _State) -> int:
    t = s.node.topology
    return len(t.current.segments_owned(s.node.address)) if t else 0


def _cache_entries(rt: CacheRuntime) -> int:
    node = rt.node
    if isinstance(node, InvalidationNode):
        return len(node.entries)
    if node is not None and node.store is not None:
        return len(node.store)
    return 0


def _cache_counters(s: _State) -> Samples:
    out: list[tuple[str, float]] = []
    for _, lab, rt in s.named_caches():
        if rt.node is not None:
            out += [(f'{{{lab},name="{_label(k)}"}}', v) for k, v in sorted(rt.node.metrics.items())]
    return out


# In rendering order: the member's group membership and messaging, then its grid (with a grid node), then its named
# caches (with ``--cache``), then every raw protocol counter and the HTTP request counts.
METRICS: tuple[Metric, ...] = (
    # ---- group membership and messaging ----
    Metric(
        "groupcluster_members", "gauge", "members in the installed view", _one(lambda s: len(s.view) if s.view else 0)
    ),
    Metric(
        "groupcluster_view_id",
        "gauge",
        "sequence number of the installed view",
        _one(lambda s: s.view.view_id.seq if s.view else 0),
    ),
    Metric(
        "groupcluster_joined", "gauge", "1 once joined", _one(lambda s: 1 if s.ch is not None and s.ch.joined else 0)
    ),
    Metric(
        "groupcluster_views_installed_total",
        "counter",
        "views this member installed (each after its first follows a flush on the flushed presets)",
        _one(lambda s: s.ch.views_installed if s.ch is not None else 0),
    ),
    Metric(
        "groupcluster_messages_sent_total",
        "counter",
        "messages the application sent",
        _one(lambda s: s.ch.sent if s.ch else 0),
    ),
    Metric(
        "groupcluster_messages_delivered_total",
        "counter",
        "messages delivered to the application",
        _one(lambda s: s.ch.delivered if s.ch else 0),
    ),
    Metric(
        "groupcluster_retransmissions_total",
        "counter",
        "messages retransmitted by this member",
        _one(lambda s: _sum(s.proto, "xmit_sent") + _sum(s.proto, "xmit_sent_for_others")),
    ),
    Metric(
        "groupcluster_retransmission_requests_total",
        "counter",
        "retransmissions this member asked for",
        _one(lambda s: _sum(s.proto, "xmit_requests")),
    ),
    # ---- the grid (default cache) ----
    Metric(
        "groupcluster_grid_topology_id",
        "gauge",
        "installed grid topology id",
        _one(lambda s: s.node.topology.topology_id if s.node.topology else 0),
        _has_grid,
    ),
    Metric(
        "groupcluster_grid_rebalancing",
        "gauge",
        "1 while a rebalance is in progress",
        _one(lambda s: 1 if s.node.topology is not None and s.node.topology.rebalancing else 0),
        _has_grid,
    ),
    Metric(
        "groupcluster_grid_degraded",
        "gauge",
        "1 while the topology is degraded (partition)",
        _one(lambda s: 1 if s.node.topology is not None and s.node.topology.availability.name != "AVAILABLE" else 0),
        _has_grid,
    ),
    Metric("groupcluster_grid_segments_owned", "gauge", "segments this member owns", _one(_owned), _has_grid),
    Metric(
        "groupcluster_grid_peer_clock_ahead_seconds",
        "gauge",
        "how far the clock of the member most ahead of ours is ahead, at least (from its last member info)",
        _one(lambda s: round(s.grid.max_peer_clock_ahead(), 6)),
        _has_grid,
    ),
    Metric(
        "groupcluster_grid_entries",
        "gauge",
        "entries held by this member",
        _one(lambda s: len(s.node.store) if s.node.store is not None else 0),
        _has_grid,
    ),
    Metric(
        "groupcluster_grid_rebalance_entries_received_total",
        "counter",
        "entries received by state transfer",
        _one(lambda s: s.gm["grid.xfer_entries_in"]),
        _has_grid,
    ),
    Metric(
        "groupcluster_grid_rebalance_entries_sent_total",
        "counter",
        "entries sent by state transfer",
        _one(lambda s: s.gm["grid.xfer_entries_out"]),
        _has_grid,
    ),
    Metric(
        "groupcluster_grid_rebalance_bytes_received_total",
        "counter",
        "key and value bytes received by state transfer",
        _one(lambda s: s.gm["grid.xfer_bytes_in"]),
        _has_grid,
    ),
    Metric(
        "groupcluster_grid_entries_expired_total",
        "counter",
        "entries this member removed as their primary owner because their lifespan ended",
        _one(lambda s: s.gm["grid.entries_expired"]),
        _has_grid,
    ),
    Metric(
        "groupcluster_grid_writes_refused_full_total",
        "counter",
        "PUTs this member refused as their primary owner at its max_entries or max_bytes bound",
        _one(lambda s: s.gm["grid.writes_refused_full"]),
        _has_grid,
    ),
    Metric(
        "groupcluster_grid_max_entries",
        "gauge",
        "this member's max_entries bound (0: none)",
        _one(lambda s: s.node.config.max_entries),
        _has_grid,
    ),
    Metric(
        "groupcluster_grid_max_bytes",
        "gauge",
        "this member's max_bytes bound on its live key and value bytes (0: none)",
        _one(lambda s: s.node.config.max_bytes),
        _has_grid,
    ),
    Metric(
        "groupcluster_grid_store_bytes",
        "gauge",
        "key and value bytes of the live entries this member holds",
        _one(lambda s: s.node.store.nbytes if s.node.store is not None else 0),
        _has_store,
    ),
    Metric(
        "groupcluster_grid_operations_total",
        "counter",
        "client operations completed here",
        lambda s: [(f'{{op="{op}"}}', s.ops[f"ops_{op}"]) for op in ("get", "put", "delete")],
        _has_grid,
    ),
    Metric(
        "groupcluster_grid_entry_events_total",
        "counter",
        "entry events produced here (only while a listener or grid.count_events wants them; docs/grid.md)",
        lambda s: [(f'{{kind="{k}"}}', s.gm[f"grid.events_{k}"]) for k in ("arrived", "departed", "written")],
        _has_grid,
    ),
    Metric(
        "groupcluster_grid_listener_errors_total",
        "counter",
        "entry listener calls that raised (logged)",
        _one(lambda s: s.ops["listener_errors"]),
        _has_grid,
    ),
    Metric(
        "groupcluster_grid_persist_steps_total",
        "counter",
        "steps written to the persistent store (one SQLite transaction each); errors: failed writes",
        lambda s: [("", s.ops["persist_steps"]), ('{result="error"}', s.ops["persist_errors"])],
        _has_grid,
    ),
    Metric(
        "groupcluster_grid_persist_seconds_total",
        "counter",
        "time spent writing the persistent store, on the event loop",
        _one(lambda s: s.ops["persist_us"] / 1e6),
        _has_grid,
    ),
    Metric(
        "groupcluster_grid_batches_total",
        "counter",
        "batch requests (POST /v1/batch) completed here",
        _one(lambda s: s.ops["batches"]),
        _has_grid,
    ),
    Metric(
        "groupcluster_grid_operations_failed_total",
        "counter",
        "client operations that failed",
        _one(lambda s: s.ops["ops_failed"]),
        _has_grid,
    ),
    Metric(
        "groupcluster_grid_transactions_total",
        "counter",
        "transactions this member originated, by outcome (conflict: aborted by validation; expired: interactive, "
        "rolled back after tx_timeout without a request)",
        lambda s: [
            (f'{{outcome="{o}"}}', s.ops[f"tx_{o}"])
            for o in ("committed", "aborted", "conflicts", "rolled_back", "expired")
        ],
        _has_grid,
    ),
    Metric(
        "groupcluster_grid_transactions_in_doubt",
        "gauge",
        "transactions in doubt on this member (prepared, originator gone): groupcluster tx in-doubt",
        _one(lambda s: len(s.node.tx_in_doubt())),
        _has_grid,
    ),
    Metric(
        "groupcluster_grid_counter",
        "counter",
        "every grid node counter, by name",
        lambda s: [(f'{{name="{_label(k)}"}}', v) for k, v in sorted(s.gm.items())],
        _has_grid,
    ),
    # ---- named caches: labelled with the cache's name and mode ----
    Metric(
        "groupcluster_cache_entries",
        "gauge",
        "entries held here, per named cache",
        lambda s: [(f"{{{lab}}}", _cache_entries(rt)) for _, lab, rt in s.named_caches()],
        _has_caches,
    ),
    Metric(
        "groupcluster_cache_operations_total",
        "counter",
        "client operations per named cache (get_local: gets answered from this member's own copy)",
        lambda s: [
            (f'{{{lab},op="{op}"}}', rt.counters[f"ops_{op}"])
            for _, lab, rt in s.named_caches()
            for op in ("get", "get_local", "put", "delete", "failed")
        ],
        _has_caches,
    ),
    Metric(
        "groupcluster_cache_mode_mismatch_members",
        "gauge",
        "members declaring the cache with another mode (their payloads are dropped)",
        lambda s: [(f"{{{lab}}}", len(s.caches.mismatches.get(name, {}))) for name, lab, _ in s.named_caches()],
        _has_caches,
    ),
    Metric(
        "groupcluster_cache_payloads_dropped_total",
        "counter",
        "named-cache payloads dropped: for a cache this member lacks, with another mode, or malformed",
        lambda s: [
            (f'{{reason="{r}"}}', s.caches.counters[f"cache_{r}"]) for r in ("unknown", "mode_mismatch", "bad_payloads")
        ],
        _has_caches,
    ),
    Metric(
        "groupcluster_cache_counter",
        "counter",
        "every named cache's node counter, by name",
        _cache_counters,
        _has_caches,
    ),
    # ---- raw counters ----
    Metric(
        "groupcluster_protocol_counter",
        "counter",
        "every protocol and runtime counter, by name",
        lambda s: [(f'{{name="{_label(k)}"}}', v) for k, v in sorted(s.proto.items())],
    ),
    Metric(
        "groupcluster_http_requests_total",
        "counter",
        "key/value and leave requests served (deadline_expired: refused, read after the client's deadline)",
        lambda s: [(f'{{kind="{k}"}}', v) for k, v in sorted(s.ctx.http_requests.items())],
    ),
)


def render_metrics(ctx: MemberContext) -> str:
    """The Prometheus exposition (text format 0.0.4) of every family of :data:`METRICS` present on this member."""
    state = _State.of(ctx)
    lines: list[str] = []
    for metric in METRICS:
        if metric.when is not None and not metric.when(state):
            continue
        lines.append(f"# HELP {metric.name} {metric.help}")
        lines.append(f"# TYPE {metric.name} {metric.kind}")
        for labels, value in metric.samples(state):
            v = int(value) if float(value).is_integer() else value
            lines.append(f"{metric.name}{labels} {v}")
    return "\n".join(lines) + "\n"
