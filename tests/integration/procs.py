"""Helpers for real-process tests: start ``groupcluster member`` processes on loopback and read what they report."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from groupcluster.sim.history import History, HistoryEvent

# Failure detection quick enough for tests: silent for TIMEOUT, then VERIFY to answer.
FD_INTERVAL = 0.5
FD_TIMEOUT = 2.0
FD_VERIFY = 0.5
FD_FLAGS = (
    "--set",
    f"fd.interval={FD_INTERVAL}",
    "--set",
    f"fd.timeout={FD_TIMEOUT}",
    "--set",
    f"fd.verify_timeout={FD_VERIFY}",
)


def loopback_hosts(n: int) -> list[str]:
    """Distinct loopback addresses 127.0.0.11, .12, ... (all of 127/8 reaches the loopback interface)."""
    return [f"127.0.0.{11 + i}" for i in range(n)]


def free_port(hosts: Iterable[str], transport: str = "udp") -> int:
    """A port that is free for ``transport`` on every host."""
    hosts = list(hosts)
    kind = socket.SOCK_DGRAM if transport == "udp" else socket.SOCK_STREAM
    for _ in range(50):
        with socket.socket(socket.AF_INET, kind) as s:
            s.bind((hosts[0], 0))
            port = s.getsockname()[1]
        ok = True
        for host in hosts[1:]:
            with socket.socket(socket.AF_INET, kind) as s:
                try:
                    s.bind((host, port))
                except OSError:
                    ok = False
                    break
        if ok:
            return port
    raise RuntimeError(f"no common free port on {hosts}")


class MemberProcess:
    """One ``groupcluster member`` child process with its record, status and log files."""

    def __init__(self, name: str, endpoint: str, workdir: Path, argv: list[str]) -> None:
        self.name = name
        self.endpoint = endpoint
        self.record = workdir / f"{name}.jsonl"
        self.status_file = workdir / f"{name}.status.json"
        self.log = workdir / f"{name}.log"
        self.argv = argv
        with open(self.log, "wb") as out:
            self.popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def status(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.status_file.read_text())
        except (OSError, ValueError):
            return None

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        if self.alive():
            self.popen.kill()
        self.popen.wait()

    def terminate(self) -> None:
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout=timeout)

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def history(self) -> list[HistoryEvent]:
        return History.read(self.record).events if self.record.exists() else []

    def address(self) -> str:
        st = self.status()
        assert st and st["address"], f"{self.name} has not reported its address"
        return st["address"]


class Members:
    """Every child started by a test; ``kill_all`` runs at the end of the test, even on failure."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: list[MemberProcess] = []

    def start(self, name: str, bind: str, *args: str, record: bool = True) -> MemberProcess:
        argv = [sys.executable, "-m", "groupcluster.cli", "member", "--bind", bind, *args]
        if "--cluster" not in args:
            argv += ["--cluster", f"it-{self.workdir.name}"]
        status = self.workdir / f"{name}.status.json"
        argv += ["--status-file", str(status)]
        if record:
            argv += ["--record", str(self.workdir / f"{name}.jsonl")]
        proc = MemberProcess(name, bind, self.workdir, argv)
        self.procs.append(proc)
        return proc

    def kill_all(self) -> None:
        for p in self.procs:
            if p.alive():
                p.popen.kill()
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.popen.wait(timeout=10)

    def describe(self) -> str:
        """Status summaries and log tails, for assertion messages."""
        parts = []
        for p in self.procs:
            st = p.status()
            summary = (
                "no status"
                if st is None
                else f"view={len(st['view']['members']) if st.get('view') else 0} members, sent={st['sent']}, "
                f"delivered={st['delivered_total']}, metrics={st['metrics']}"
            )
            tail = "\n    ".join(p.log_text().splitlines()[-6:])
            parts.append(f"{p.name} ({p.endpoint}, alive={p.alive()}): {summary}\n    {tail}")
        return "\n".join(parts)


def wait_until(
    what: str, predicate: Callable[[], bool], timeout: float, members: Members, procs: Iterable[MemberProcess] = ()
) -> float:
    """Poll ``predicate`` every 0.1 s; fail with every member's status if it is not true within ``timeout``."""
    start = time.monotonic()
    watched = list(procs)
    while not predicate():
        for p in watched:
            assert p.alive(), f"{p.name} exited ({p.popen.returncode}) while waiting for {what}\n{members.describe()}"
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{members.describe()}")
        time.sleep(0.1)
    return time.monotonic() - start


def view_of(proc: MemberProcess) -> list[str] | None:
    st = proc.status()
    return st["view"]["members"] if st and st.get("view") else None


def check_fifo_complete(events: list[HistoryEvent], senders: list[str], count: int) -> None:
    """The member delivered exactly ids 0..count-1 from each sender, in that order (multicasts)."""
    by_sender: dict[str, list[str]] = {s: [] for s in senders}
    for ev in events:
        if ev.kind == "deliver" and ev.data["dest"] is None:
            assert ev.data["sender"] in by_sender, f"{ev.member} delivered a message from unknown {ev.data['sender']}"
            by_sender[ev.data["sender"]].append(ev.data["msg"])
    expected = [str(i) for i in range(count)]
    for sender, ids in by_sender.items():
        if ids != expected:
            missing = len(set(expected) - set(ids))
            first_bad = next((i for i, (a, b) in enumerate(zip(ids, expected, strict=False)) if a != b), None)
            raise AssertionError(
                f"{events[0].member if events else '?'} delivered {len(ids)} messages from {sender}: "
                f"{missing} missing, first out-of-order position {first_bad}"
            )


def before(events: list[HistoryEvent], t: float) -> list[HistoryEvent]:
    """A member's events before time ``t``, when the test began stopping the members.

    Members that stay to the end are stopped only after everything was delivered; judging them as members
    that stayed (the checkers owe nothing to a member that left) is the stricter check.
    """
    return [ev for ev in events if ev.t < t]
