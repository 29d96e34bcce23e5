"""A partition between real processes, made by the ``faults`` layer, splits the group and heals by a merge.

Four members on 127.0.0.11-14 run a stack file with ``faults`` directly above the transport and a
partition window {11, 12} | {13, 14}. Each side must install a view of exactly its own two members, and
after the window ends all four must install one merged view. The recorded histories (with light traffic
crossing the split) must satisfy every safety property.
"""

from __future__ import annotations

import copy
import time

import yaml
from groupcluster.sim import checkers
from groupcluster.sim.history import History
from groupcluster.stacks import FIFO

from .procs import FD_INTERVAL, FD_TIMEOUT, FD_VERIFY, Members, before, free_port, loopback_hosts, view_of, wait_until

PARTITION_START = 4.0
PARTITION_END = 12.0


def _stack_file(path, groups: list[list[str]]) -> str:  # type: ignore[no-untyped-def]
    spec = copy.deepcopy(FIFO)
    overrides = {
        "fd": {"interval": f"{FD_INTERVAL}s", "timeout": f"{FD_TIMEOUT}s", "verify_timeout": f"{FD_VERIFY}s"},
        "merge": {"min_interval": "500ms", "max_interval": "1s", "check_interval": "1500ms"},
    }
    for entry in spec:
        entry.update(overrides.get(entry["layer"], {}))
    faults = {
        "layer": "faults",
        "partitions": [{"start": f"{PARTITION_START}s", "end": f"{PARTITION_END}s", "groups": groups}],
    }
    spec.insert(1, faults)  # directly above the transport
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def test_partition_splits_into_two_views_and_heals_into_one(members: Members, tmp_path) -> None:  # type: ignore[no-untyped-def]
    hosts = loopback_hosts(4)
    port = free_port(hosts)
    endpoints = [f"{h}:{port}" for h in hosts]
    groups = [endpoints[:2], endpoints[2:]]
    stack = _stack_file(tmp_path / "partition.yaml", groups)
    started = time.monotonic()
    procs = [
        members.start(
            f"m{i + 1}",
            ep,
            "--hosts",
            ",".join(endpoints),
            "--stack",
            stack,
            # About 15 s of traffic: before, during and after the partition, and through the merge.
            "--send-count",
            "600",
            "--send-rate",
            "40",
        )
        for i, ep in enumerate(endpoints)
    ]

    def endpoints_of(view: list[str] | None) -> set[str]:
        return {m.split("#")[0] for m in view or ()}

    seen_split = [False] * 4

    def split() -> bool:
        for i, p in enumerate(procs):
            own = set(groups[i // 2])
            if endpoints_of(view_of(p)) == own:
                seen_split[i] = True
        return all(seen_split)

    wait_until("each side to install a view of its own two members", split, 30, members, procs)

    def merged() -> bool:
        views = [view_of(p) for p in procs]
        return all(v is not None and len(v) == 4 for v in views) and len({tuple(v) for v in views}) == 1  # type: ignore[arg-type]

    remaining = PARTITION_END - (time.monotonic() - started)
    wait_until("one merged view of all four", merged, max(remaining, 0) + 30, members, procs)
    # Judge a quiet end: every message sent, and deliveries no longer changing, before anyone is stopped.
    wait_until(
        "every member to finish sending",
        lambda: all((p.status() or {}).get("send_done") for p in procs),
        30,
        members,
        procs,
    )
    counts: list[object] = []

    def settled() -> bool:
        now = [(p.status() or {}).get("delivered_total") for p in procs]
        counts.append(now)
        return len(counts) > 10 and counts[-11] == now  # unchanged for a second

    wait_until("deliveries to settle", settled, 20, members, procs)
    assert merged(), "the merged view did not last until the end"

    histories = [p.history() for p in procs]
    for events in histories:
        views = [ev for ev in events if ev.kind == "view"]
        assert any(len(v.data["members"]) == 2 for v in views), f"{events[0].member} never saw the split"
        last = views[-1]
        assert len(last.data["members"]) == 4 and last.data["merge"], f"{last.member} ended in {last.data}"

    stopping_at = time.time()
    for p in procs:
        p.terminate()
    for p in procs:
        assert p.wait(15) == 0, p.log_text()
    events = [ev for p in procs for ev in before(p.history(), stopping_at)]
    events.sort(key=lambda e: e.t)
    violations = checkers.check_safety(History(events))
    assert not violations, "\n".join(map(str, violations[:20]))
