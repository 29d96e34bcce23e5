"""The Prometheus text of ``GET /metrics``."""

from __future__ import annotations

import json
from collections.abc import Sequence

from ..caches import CacheSet
from ..invalidation import InvalidationNode
from .context import MemberContext


def _metric(lines: list[str], name: str, kind: str, help_text: str, samples: Sequence[tuple[str, float]]) -> None:
    lines.append(f"# HELP {name} {help_text}")
    lines.append(f"# TYPE {name} {kind}")
    for labels, value in samples:
        v = int(value) if float(value).is_integer() else value
        lines.append(f"{name}{labels} {v}")


def _sum(metrics: dict[str, int], suffix: str) -> int:
    return sum(v for k, v in metrics.items() if k.endswith(suffix))


def render_metrics(ctx: MemberContext) -> str:
    """The Prometheus exposition: named gauges and counters, then every raw counter with a ``name`` label."""
    ch = ctx.channel()
    grid = ctx.grid
    lines: list[str] = []
    view = ch.view if ch is not None else None
    proto = ch.metrics() if ch is not None else {}
    _metric(lines, "groupcluster_members", "gauge", "members in the installed view", [("", len(view) if view else 0)])
    _metric(
        lines,
        "groupcluster_view_id",
        "gauge",
        "sequence number of the installed view",
        [("", view.view_id.seq if view else 0)],
    )
    _metric(lines, "groupcluster_joined", "gauge", "1 once joined", [("", 1 if ch is not None and ch.joined else 0)])
    _metric(
        lines,
        "groupcluster_views_installed_total",
        "counter",
        "views this member installed (each after its first follows a flush on the flushed presets)",
        [("", ch.views_installed if ch is not None else 0)],
    )
    _metric(
        lines,
        "groupcluster_messages_sent_total",
        "counter",
        "messages the application sent",
        [("", ch.sent if ch else 0)],
    )
    _metric(
        lines,
        "groupcluster_messages_delivered_total",
        "counter",
        "messages delivered to the application",
        [("", ch.delivered if ch else 0)],
    )
    _metric(
        lines,
        "groupcluster_retransmissions_total",
        "counter",
        "messages retransmitted by this member",
        [("", _sum(proto, "xmit_sent") + _sum(proto, "xmit_sent_for_others"))],
    )
    _metric(
        lines,
        "groupcluster_retransmission_requests_total",
        "counter",
        "retransmissions this member asked for",
        [("", _sum(proto, "xmit_requests"))],
    )
    if grid is not None and grid.node is not None:
        node = grid.node
        gm = node.metrics
        t = node.topology
        _metric(
            lines,
            "groupcluster_grid_topology_id",
            "gauge",
            "installed grid topology id",
            [("", t.topology_id if t else 0)],
        )
        _metric(
            lines,
            "groupcluster_grid_rebalancing",
            "gauge",
            "1 while a rebalance is in progress",
            [("", 1 if t is not None and t.rebalancing else 0)],
        )
        _metric(
            lines,
            "groupcluster_grid_degraded",
            "gauge",
            "1 while the topology is degraded (partition)",
            [("", 1 if t is not None and t.availability.name != "AVAILABLE" else 0)],
        )
        owned = len(t.current.segments_owned(node.address)) if t else 0
        _metric(lines, "groupcluster_grid_segments_owned", "gauge", "segments this member owns", [("", owned)])
        _metric(
            lines,
            "groupcluster_grid_peer_clock_ahead_seconds",
            "gauge",
            "how far the clock of the member most ahead of ours is ahead, at least (from its last member info)",
            [("", round(grid.max_peer_clock_ahead(), 6))],
        )
        entries = len(node.store) if node.store is not None else 0
        _metric(lines, "groupcluster_grid_entries", "gauge", "entries held by this member", [("", entries)])
        _metric(
            lines,
            "groupcluster_grid_rebalance_entries_received_total",
            "counter",
            "entries received by state transfer",
            [("", gm["grid.xfer_entries_in"])],
        )
        _metric(
            lines,
            "groupcluster_grid_rebalance_entries_sent_total",
            "counter",
            "entries sent by state transfer",
            [("", gm["grid.xfer_entries_out"])],
        )
        _metric(
            lines,
            "groupcluster_grid_rebalance_bytes_received_total",
            "counter",
            "key and value bytes received by state transfer",
            [("", gm["grid.xfer_bytes_in"])],
        )
        _metric(
            lines,
            "groupcluster_grid_entries_expired_total",
            "counter",
            "entries this member removed as their primary owner because their lifespan ended",
            [("", gm["grid.entries_expired"])],
        )
        _metric(
            lines,
            "groupcluster_grid_writes_refused_full_total",
            "counter",
            "PUTs this member refused as their primary owner at its max_entries or max_bytes bound",
            [("", gm["grid.writes_refused_full"])],
        )
        _metric(
            lines,
            "groupcluster_grid_max_entries",
            "gauge",
            "this member's max_entries bound (0: none)",
            [("", node.config.max_entries)],
        )
        _metric(
            lines,
            "groupcluster_grid_max_bytes",
            "gauge",
            "this member's max_bytes bound on its live key and value bytes (0: none)",
            [("", node.config.max_bytes)],
        )
        if node.store is not None:
            _metric(
                lines,
                "groupcluster_grid_store_bytes",
                "gauge",
                "key and value bytes of the live entries this member holds",
                [("", node.store.nbytes)],
            )
        ops = grid.counters
        _metric(
            lines,
            "groupcluster_grid_operations_total",
            "counter",
            "client operations completed here",
            [(f'{{op="{op}"}}', ops[f"ops_{op}"]) for op in ("get", "put", "delete")],
        )
        _metric(
            lines,
            "groupcluster_grid_entry_events_total",
            "counter",
            "entry events produced here (only while a listener or grid.count_events wants them; docs/grid.md)",
            [(f'{{kind="{k}"}}', gm[f"grid.events_{k}"]) for k in ("arrived", "departed", "written")],
        )
        _metric(
            lines,
            "groupcluster_grid_listener_errors_total",
            "counter",
            "entry listener calls that raised (logged)",
            [("", ops["listener_errors"])],
        )
        _metric(
            lines,
            "groupcluster_grid_persist_steps_total",
            "counter",
            "steps written to the persistent store (one SQLite transaction each); errors: failed writes",
            [("", ops["persist_steps"]), ('{result="error"}', ops["persist_errors"])],
        )
        _metric(
            lines,
            "groupcluster_grid_persist_seconds_total",
            "counter",
            "time spent writing the persistent store, on the event loop",
            [("", ops["persist_us"] / 1e6)],
        )
        _metric(
            lines,
            "groupcluster_grid_batches_total",
            "counter",
            "batch requests (POST /v1/batch) completed here",
            [("", ops["batches"])],
        )
        _metric(
            lines,
            "groupcluster_grid_operations_failed_total",
            "counter",
            "client operations that failed",
            [("", ops["ops_failed"])],
        )
        _metric(
            lines,
            "groupcluster_grid_transactions_total",
            "counter",
            "transactions this member originated, by outcome (conflict: aborted by validation; expired: interactive, "
            "rolled back after tx_timeout without a request)",
            [
                (f'{{outcome="{o}"}}', ops[f"tx_{o}"])
                for o in ("committed", "aborted", "conflicts", "rolled_back", "expired")
            ],
        )
        _metric(
            lines,
            "groupcluster_grid_transactions_in_doubt",
            "gauge",
            "transactions in doubt on this member (prepared, originator gone): groupcluster tx in-doubt",
            [("", len(node.tx_in_doubt()))],
        )
        _metric(
            lines,
            "groupcluster_grid_counter",
            "counter",
            "every grid node counter, by name",
            [(f'{{name="{_label(k)}"}}', v) for k, v in sorted(gm.items())],
        )
    if ctx.caches is not None:
        _cache_metrics(lines, ctx.caches)
    _metric(
        lines,
        "groupcluster_protocol_counter",
        "counter",
        "every protocol and runtime counter, by name",
        [(f'{{name="{_label(k)}"}}', v) for k, v in sorted(proto.items())],
    )
    _metric(
        lines,
        "groupcluster_http_requests_total",
        "counter",
        "key/value and leave requests served (deadline_expired: refused, read after the client's deadline)",
        [(f'{{kind="{k}"}}', v) for k, v in sorted(ctx.http_requests.items())],
    )
    return "\n".join(lines) + "\n"


def _cache_metrics(lines: list[str], caches: CacheSet) -> None:
    """Per named cache: entries, operations and every node counter, labelled with the cache's name and mode."""
    entries, ops, counters, mismatched = [], [], [], []
    for name, rt in caches.named.items():
        lab = f'cache="{_label(name)}",mode="{caches.mode_of(name)}"'
        node = rt.node
        n = 0
        if isinstance(node, InvalidationNode):
            n = len(node.entries)
        elif node is not None and node.store is not None:
            n = len(node.store)
        entries.append((f"{{{lab}}}", n))
        for op in ("get", "get_local", "put", "delete", "failed"):
            ops.append((f'{{{lab},op="{op}"}}', rt.counters[f"ops_{op}"]))
        if node is not None:
            counters += [(f'{{{lab},name="{_label(k)}"}}', v) for k, v in sorted(node.metrics.items())]
        mismatched.append((f"{{{lab}}}", len(caches.mismatches.get(name, {}))))
    _metric(lines, "groupcluster_cache_entries", "gauge", "entries held here, per named cache", entries)
    _metric(
        lines,
        "groupcluster_cache_operations_total",
        "counter",
        "client operations per named cache (get_local: gets answered from this member's own copy)",
        ops,
    )
    _metric(
        lines,
        "groupcluster_cache_mode_mismatch_members",
        "gauge",
        "members declaring the cache with another mode (their payloads are dropped)",
        mismatched,
    )
    _metric(
        lines,
        "groupcluster_cache_payloads_dropped_total",
        "counter",
        "named-cache payloads dropped: for a cache this member lacks, with another mode, or malformed",
        [(f'{{reason="{r}"}}', caches.counters[f"cache_{r}"]) for r in ("unknown", "mode_mismatch", "bad_payloads")],
    )
    _metric(lines, "groupcluster_cache_counter", "counter", "every named cache's node counter, by name", counters)


def _label(text: str) -> str:
    return json.dumps(text)[1:-1]
