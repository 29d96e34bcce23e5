"""Real grid members for tests: start ``groupcluster member --grid --http`` processes on loopback hosts and
talk to their HTTP API (shared by the integration and Spark tests)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from .procs import FD_FLAGS, MemberProcess, Members, free_port, loopback_hosts


def http(
    method: str, url: str, body: bytes | None = None, timeout: float = 10.0, headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def http_json(method: str, url: str, body: bytes | None = None) -> tuple[int, Any]:
    status, data = http(method, url, body)
    return status, json.loads(data)


class Grid:
    """The members of one test and the HTTP URL of each."""

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

    def status(self, name: str) -> dict[str, Any] | None:
        try:
            code, body = http_json("GET", self.urls[name] + "/v1/status")
        except (OSError, ValueError):
            return None
        return body if code == 200 else None

    def ready(self, name: str) -> bool:
        try:
            return http("GET", self.urls[name] + "/readyz", timeout=2.0)[0] == 200
        except OSError:
            return False

    def settled(self, names: list[str]) -> bool:
        """Every named member is ready, sees exactly these members, and they agree on a balanced topology."""
        tops = set()
        for n in names:
            st = self.status(n)
            if st is None or st["grid"] is None or not self.ready(n):
                return False
            if len(st["view"]["members"]) != len(names):
                return False
            g = st["grid"]
            if g["phase"] != "NO_REBALANCE" or g["availability"] != "AVAILABLE":
                return False
            tops.add(g["topology_id"])
        return len(tops) == 1
