"""Real grid members for the Spark tests: the integration tests' :class:`Grid` plus what the Spark options need."""

from __future__ import annotations

import time

from tests.integration.grids import Grid, http

__all__ = ["SparkGrid", "http"]


class SparkGrid(Grid):
    """The members of one grid and the HTTP endpoint of each (``m0`` on 127.0.0.11, ``m1`` on .12, ...)."""

    def endpoints(self, names: list[str] | None = None) -> str:
        """The ``members`` option: comma-separated host:port of the named (default: all) members."""
        return ",".join(self.urls[n].removeprefix("http://") for n in (names or list(self.urls)))

    def topology_ids(self, names: list[str]) -> set[int]:
        out = set()
        for n in names:
            st = self.status(n)
            if st and st.get("grid"):
                out.add(st["grid"]["topology_id"])
        return out

    def wait_settled(self, names: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self.settled(names):
            for n in names:
                p = self.procs[n]
                assert p.alive(), f"{n} exited ({p.popen.returncode})\n{self.members.describe()}"
            if time.monotonic() > deadline:
                raise AssertionError(f"grid {names} not settled after {timeout}s\n{self.members.describe()}")
            time.sleep(0.2)
