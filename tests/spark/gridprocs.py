"""Real grid members for the Spark tests (``groupcluster member --grid --http`` on loopback)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

from tests.integration.procs import FD_FLAGS, MemberProcess, Members, free_port, loopback_hosts


def http(method: str, url: str, body: bytes | None = None, timeout: float = 5.0) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


class SparkGrid:
    """The members of one grid and the HTTP endpoint of each (``m0`` on 127.0.0.11, ``m1`` on .12, ...)."""

    def __init__(self, members: Members, n_hosts: int) -> None:
        self.members = members
        self.hosts = loopback_hosts(n_hosts)
        self.port = free_port(self.hosts, "udp")
        self.http_port = free_port(self.hosts, "tcp")
        self.urls: dict[str, str] = {}
        self.procs: dict[str, MemberProcess] = {}

    def start(self, i: int, *extra: str) -> MemberProcess:
        host = self.hosts[i]
        everyone = ",".join(f"{h}:{self.port}" for h in self.hosts)
        name = f"m{i}"
        proc = self.members.start(
            name,
            f"{host}:{self.port}",
            "--hosts",
            everyone,
            "--grid",
            "--http",
            f"{host}:{self.http_port}",
            *FD_FLAGS,
            *extra,
            record=False,
        )
        self.procs[name] = proc
        self.urls[name] = f"http://{host}:{self.http_port}"
        return proc

    def endpoints(self, names: list[str] | None = None) -> str:
        """The ``members`` option: comma-separated host:port of the named (default: all) members."""
        return ",".join(self.urls[n].removeprefix("http://") for n in (names or list(self.urls)))

    def status(self, name: str) -> dict[str, Any] | None:
        try:
            code, body = http("GET", self.urls[name] + "/v1/status")
            return json.loads(body) if code == 200 else None
        except (OSError, ValueError):
            return None

    def topology_ids(self, names: list[str]) -> set[int]:
        out = set()
        for n in names:
            st = self.status(n)
            if st and st.get("grid"):
                out.add(st["grid"]["topology_id"])
        return out

    def settled(self, names: list[str]) -> bool:
        """Every named member is ready, sees exactly these members, and all agree on a topology at rest."""
        tops = set()
        for n in names:
            st = self.status(n)
            if st is None or st.get("grid") is None:
                return False
            try:
                if http("GET", self.urls[n] + "/readyz", timeout=2.0)[0] != 200:
                    return False
            except OSError:
                return False
            if len(st["view"]["members"]) != len(names):
                return False
            g = st["grid"]
            if g["phase"] != "NO_REBALANCE" or g["availability"] != "AVAILABLE":
                return False
            tops.add(g["topology_id"])
        return len(tops) == 1

    def wait_settled(self, names: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self.settled(names):
            for n in names:
                p = self.procs[n]
                assert p.alive(), f"{n} exited ({p.popen.returncode})\n{self.members.describe()}"
            if time.monotonic() > deadline:
                raise AssertionError(f"grid {names} not settled after {timeout}s\n{self.members.describe()}")
            time.sleep(0.2)
