"""Availability comes back by itself on real members: 3 grid members (2 owners, ``deny_read_writes``, the ``vsync``
stack), keys written, then the coordinator is SIGKILLed while the two survivors are cut off from each other
(``--faults-control``) past failure detection. Each survivor forms a view of one: half or more of the stable
topology is missing there, so each degrades. The partition heals, the survivors merge, and together they hold
a copy of every segment and are a majority of the stable topology: the grid is AVAILABLE again without anyone
calling ``POST /v1/force-available``, and every acknowledged key reads back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from groupcluster.grid.client import GridClient
from groupcluster.runtime.faults_control import HEAL_DOCUMENT, partition_document, write_control

from .grids import Grid
from .procs import Members, wait_until

KEYS = 3000


def test_the_survivors_of_a_killed_coordinator_merge_into_an_available_grid(tmp_path: Path) -> None:
    group = Members(tmp_path)
    try:
        grid = Grid(group, 3)
        names = [f"m{i}" for i in range(3)]
        control = {n: tmp_path / f"{n}.faults.json" for n in names}
        for i, n in enumerate(names):
            grid.start(i, "--stack", "vsync", "--faults-control", str(control[n]))
        wait_until("a balanced 3-member grid", lambda: grid.settled(names), 90, group)
        data = {f"key-{i}".encode(): f"value-{i}".encode() for i in range(KEYS)}
        client = GridClient(list(grid.urls.values()))
        try:
            client.put_many(data)  # raises unless every key is acknowledged
        finally:
            client.close()

        def status(n: str) -> dict[str, Any]:
            st = grid.status(n)
            assert st is not None, f"{n} does not answer /v1/status"
            return st

        first = status("m0")
        coord = next(n for n in names if status(n)["address"] == first["coordinator"])
        survivors = [n for n in names if n != coord]
        # Cut every member off from the others (each its own group) on the survivors, and wait until both apply
        # it: after the kill neither hears the other, so each forms a view of one, whatever the view change
        # protocol would have done with two members left.
        cut = partition_document([[grid.procs[n].endpoint] for n in names], 120)
        for n in survivors:
            write_control(control[n], cut)

        def applied(n: str) -> int:
            return int(((grid.procs[n].status() or {}).get("faults_control") or {}).get("applied") or 0)

        wait_until("both survivors to apply the cut", lambda: all(applied(n) >= 1 for n in survivors), 30, group)
        grid.procs[coord].kill()

        def alone_and_degraded(n: str) -> bool:
            st = grid.status(n)
            return (
                st is not None
                and len(st["view"]["members"]) == 1
                and st["grid"] is not None
                and st["grid"]["availability"] == "DEGRADED"
            )

        alive = [grid.procs[n] for n in survivors]
        wait_until(
            "each survivor degraded in a view of its own",
            lambda: all(map(alone_and_degraded, survivors)),
            60,
            group,
            alive,
        )
        for n in survivors:
            write_control(control[n], HEAL_DOCUMENT)

        def merged(n: str) -> bool:
            st = grid.status(n)
            return st is not None and len(st["view"]["members"]) == 2

        wait_until("the survivors to merge into one view", lambda: all(map(merged, survivors)), 90, group, alive)
        # Nobody forces it: the merged group holds every segment and is a majority of the stable three.
        wait_until(
            "the merged grid balanced and available by itself", lambda: grid.settled(survivors), 60, group, alive
        )
        for n in survivors:
            g = status(n)["grid"]
            assert g["availability"] == "AVAILABLE" and g["phase"] == "NO_REBALANCE", g

        client = GridClient([grid.urls[n] for n in survivors])
        try:
            assert client.get_many(list(data)) == data
            client.put(b"after", b"yes")
            assert client.get(b"after") == b"yes"
        finally:
            client.close()
    finally:
        group.kill_all()
