"""``groupcluster demo --group``: a local cluster of member processes on loopback that loses a member and loses
nothing (the group-communication demo; ``groupcluster demo`` without ``--group`` is the data-grid demo).

Starts ``--members`` (4) ``groupcluster member`` processes on 127.0.0.11, .12, ... (one port), waits for one
view of all of them, lets each multicast ``--messages`` test messages, kills one with SIGKILL halfway through
its sending, waits for the survivors to install a view without it and to finish, makes them leave, and then
judges the recorded histories with the property checkers of :mod:`groupcluster.sim.checkers`.

The last line is ``demo: <M> messages delivered, <L> lost``: M counts distinct messages delivered by at least
one member; L counts messages sent by a survivor that some survivor never delivered (what reliable FIFO
multicast promises: a member that stays delivers everything sent by the members that stay). Messages of the
killed member that only some survivors delivered are reported on their own line. The exit status is 1 if L
is not zero or a checker found a violation.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from types import FrameType
from typing import Any

from ..sim.history import History, HistoryEvent

HOST_BASE = "127.0.0.{}"
FIRST_HOST = 11


def add_group_arguments(group: argparse._ArgumentGroup) -> None:
    """The options of the group demo (``--dir`` and ``--timeout`` are shared with the grid demo)."""
    group.add_argument("--members", type=int, default=4, help="member processes to start (2-9, default 4)")
    group.add_argument("--messages", type=int, default=2000, help="messages each member multicasts (default 2000)")
    group.add_argument("--rate", type=float, default=1000.0, help="messages per second per member (default 1000)")
    group.add_argument("--size", type=int, default=100, help="payload bytes (default 100)")
    group.add_argument("--transport", choices=("udp", "tcp"), default="udp")
    group.add_argument("--port", type=int, default=7800, help="port on every loopback address (default 7800)")
    group.add_argument("--victim", type=int, default=0, help="member number to kill (1-based; default the last)")


GROUP_TIMEOUT = 45.0


def _view_sizes(st: dict[str, Any]) -> str:
    """Progress line: each member's view size."""
    parts = []
    for name, s in st.items():
        size = len(s["view"]["members"]) if s and s.get("view") else 0
        parts.append(f"{name}:{size}")
    return "view sizes " + " ".join(parts)


def _sending(st: dict[str, Any]) -> str:
    """Progress line: messages sent in all, and delivered per member."""
    sent = sum(s["sent"] for s in st.values() if s)
    delivered = [s["delivered_total"] if s else 0 for s in st.values()]
    return f"sent {sent}, delivered per member {' '.join(map(str, delivered))}"


class DemoError(Exception):
    pass


def _port_free(hosts: Iterable[str], port: int, transport: str) -> bool:
    kinds = (socket.SOCK_DGRAM,) if transport == "udp" else (socket.SOCK_STREAM,)
    for host in hosts:
        for kind in kinds:
            with socket.socket(socket.AF_INET, kind) as s:
                try:
                    s.bind((host, port))
                except OSError:
                    return False
    return True


def pick_port(hosts: list[str], preferred: int, transport: str) -> int:
    """``preferred`` if it is free on every host, else a nearby or system-chosen port free on all of them."""
    for port in [preferred + i for i in range(20)]:
        if 0 < port < 65536 and _port_free(hosts, port, transport):
            return port
    for _ in range(20):
        kind = socket.SOCK_DGRAM if transport == "udp" else socket.SOCK_STREAM
        with socket.socket(socket.AF_INET, kind) as s:
            s.bind((hosts[0], 0))
            port = s.getsockname()[1]
        if _port_free(hosts, port, transport):
            return port
    raise DemoError(f"no free port found on {', '.join(hosts)}")


Statuses = dict[str, dict[str, Any] | None]  # member name -> its status file (None: not readable just now)


def _status(st: Statuses, p: Proc) -> dict[str, Any]:
    """``p``'s status in ``st``, which a wait's predicate found complete."""
    s = st[p.name]
    if s is None:
        raise DemoError(f"{p.name} ({p.endpoint}): no status read from {p.status_file}")
    return s


class Proc:
    """One member process and its files."""

    def __init__(self, number: int, host: str, port: int, workdir: Path) -> None:
        self.number = number
        self.name = f"m{number}"
        self.endpoint = f"{host}:{port}"
        self.record = workdir / f"{self.name}.jsonl"
        self.status_file = workdir / f"{self.name}.status.json"
        self.log = workdir / f"{self.name}.log"
        self._popen: subprocess.Popen[bytes] | None = None
        self.killed_at: float | None = None

    def start(self, argv: list[str]) -> None:
        with open(self.log, "wb") as out:
            self._popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    @property
    def started(self) -> bool:
        return self._popen is not None

    @property
    def popen(self) -> subprocess.Popen[bytes]:
        """The member's process (a DemoError before :meth:`start`)."""
        if self._popen is None:
            raise DemoError(f"{self.name} ({self.endpoint}) was never started")
        return self._popen

    def status(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.status_file.read_text())
        except (OSError, ValueError):
            return None

    def alive(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    def log_tail(self, lines: int = 8) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class Demo:
    def __init__(self, args: argparse.Namespace) -> None:
        if not 2 <= args.members <= 9:
            raise DemoError(f"--members: expected 2 to 9, got {args.members}")
        if args.messages < 1 or args.rate <= 0 or args.size < 1:
            raise DemoError("--messages, --rate and --size must be positive")
        victim = args.victim or args.members
        if not 1 <= victim <= args.members:
            raise DemoError(f"--victim: expected 1 to {args.members}, got {args.victim}")
        self.args = args
        self.victim_number = victim
        self.procs: list[Proc] = []
        # Set once a member was killed: from then on a failed run still judges what was recorded.
        self.judgeable: tuple[dict[str, str], Proc] | None = None
        # When the demo began stopping the survivors: the checkers judge what happened before.
        self.stopping_at = float("inf")
        self.t0 = time.monotonic()

    # -- output ------------------------------------------------------------------------------------------
    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.t0:5.1f}s] {text}", flush=True)

    # -- processes ---------------------------------------------------------------------------------------
    def start_members(self, workdir: Path) -> None:
        args = self.args
        hosts = [HOST_BASE.format(FIRST_HOST + i) for i in range(args.members)]
        port = pick_port(hosts, args.port, args.transport)
        cluster = f"demo-{os.getpid()}"
        all_hosts = ",".join(f"{h}:{port}" for h in hosts)
        self.say(
            f"starting {args.members} members on {hosts[0]}..{hosts[-1].rsplit('.', 1)[1]} port {port} "
            f"({args.transport}); files in {workdir}"
        )
        for i, host in enumerate(hosts):
            proc = Proc(i + 1, host, port, workdir)
            argv = [
                sys.executable,
                "-m",
                "groupcluster.cli",
                "member",
                "--cluster",
                cluster,
                "--bind",
                proc.endpoint,
                "--hosts",
                all_hosts,
                "--transport",
                args.transport,
                "--record",
                str(proc.record),
                "--status-file",
                str(proc.status_file),
                "--send-count",
                str(args.messages),
                "--send-rate",
                str(args.rate),
                "--payload-size",
                str(args.size),
                "--start-when-members",
                str(args.members),
                # Quick failure detection so the demo shows the crash handled within seconds.
                "--set",
                "fd.interval=500ms",
                "--set",
                "fd.timeout=2s",
                "--set",
                "fd.verify_timeout=500ms",
            ]
            proc.start(argv)
            self.procs.append(proc)

    def statuses(self) -> Statuses:
        return {p.name: p.status() for p in self.procs}

    def check_alive(self, procs: Iterable[Proc]) -> None:
        for p in procs:
            if not p.alive():
                code = p.popen.returncode if p.started else None
                raise DemoError(f"{p.name} ({p.endpoint}) exited early with status {code}:\n{p.log_tail()}")

    def wait(self, what: str, predicate: Any, procs: list[Proc], progress: Any) -> tuple[float, Statuses]:
        """Poll status files until ``predicate(statuses)``; print ``progress(statuses)`` every second. Returns how
        long it took and the statuses that satisfied it (a later read may find a file being rewritten)."""
        start = time.monotonic()
        last_print = start
        while True:
            st = self.statuses()
            if predicate(st):
                return time.monotonic() - start, st
            self.check_alive(procs)
            now = time.monotonic()
            if now - start > self.args.timeout:
                raise DemoError(f"gave up after {self.args.timeout:g}s waiting for {what}: {progress(st)}")
            if now - last_print >= 1.0:
                self.say(f"  {what}: {progress(st)}")
                last_print = now
            time.sleep(0.1)

    def stop_gracefully(self) -> None:
        """SIGTERM every live member (they leave and flush their records), then wait a little."""
        live = [p for p in self.procs if p.alive()]
        self.stopping_at = min(self.stopping_at, time.time())
        for p in live:
            p.popen.send_signal(signal.SIGTERM)
        for p in live:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.popen.wait(timeout=10)

    def shutdown(self) -> None:
        for p in self.procs:
            if p.alive():
                p.popen.kill()
        for p in self.procs:
            if p.started:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.popen.wait(timeout=5)

    # -- the run -------------------------------------------------------------------------------------------
    def run(self, workdir: Path) -> int:
        args = self.args
        n = args.members
        self.start_members(workdir)
        procs = self.procs
        victim = procs[self.victim_number - 1]
        survivors = [p for p in procs if p is not victim]
        short = {}  # address string -> m1..mN, filled as members report their addresses

        def one_view(st: dict[str, Any]) -> bool:
            ids = {json.dumps(s["view"]["id"]) for s in st.values() if s and s.get("view")}
            sizes = [len(s["view"]["members"]) for s in st.values() if s and s.get("view")]
            return len(ids) == 1 and sizes == [n] * n

        took, st = self.wait(f"one view of {n} members", one_view, procs, _view_sizes)
        for p in procs:
            short[_status(st, p)["address"]] = p.name
        first = _status(st, procs[0])
        self.say(f"joined: one view of {n} members in {took:.1f}s: {self._view_text(first['view'], short)}")

        self.say(f"each member multicasts {args.messages} messages of {args.size} B at {args.rate:g}/s")

        half = max(1, args.messages // 2)
        self.wait(
            f"{victim.name} to send {half}",
            lambda st: bool(st[victim.name]) and st[victim.name]["sent"] >= half,
            procs,
            _sending,
        )
        victim.killed_at = time.time()
        victim.popen.kill()
        victim.popen.wait()
        pid = victim.popen.pid
        self.say(f"SIGKILL {victim.name} ({victim.endpoint}, pid {pid}) while it sends (it reported {half}+ sent)")
        victim_addr = next(a for a, name in short.items() if name == victim.name)
        self.judgeable = (short, victim)

        def excluded(st: dict[str, Any]) -> bool:
            return all(
                st[p.name] and st[p.name]["view"] and victim_addr not in st[p.name]["view"]["members"]
                for p in survivors
            )

        took, st = self.wait(f"survivors to remove {victim.name}", excluded, survivors, _view_sizes)
        self.say(
            f"survivors installed a view without {victim.name} {took:.1f}s after the kill: "
            f"{self._view_text(_status(st, survivors[0])['view'], short)}"
        )

        survivor_addrs = [a for a, name in short.items() if name != victim.name]

        # Messages of the killed member still in flight may reach some survivors and not others: without
        # FLUSH nothing promises otherwise, so the demo waits for those counts to settle, not to agree.
        settled: dict[str, Any] = {"counts": None, "since": 0.0}

        def finished(st: dict[str, Any]) -> bool:
            if not all(st[p.name] and st[p.name]["send_done"] for p in survivors):
                return False
            for p in survivors:
                d = st[p.name]["delivered"]
                if any(d.get(a, 0) < args.messages for a in survivor_addrs):
                    return False
            counts = tuple(st[p.name]["delivered"].get(victim_addr, 0) for p in survivors)
            now = time.monotonic()
            if counts != settled["counts"]:
                settled["counts"], settled["since"] = counts, now
            return len(set(counts)) == 1 or now - settled["since"] >= 2.0

        self.wait("survivors to finish", finished, survivors, _sending)
        time.sleep(0.6)  # one more status/record flush
        final = self.statuses()
        self.say("survivors leave (SIGTERM, graceful leave)")
        self.stopping_at = time.time()
        for p in survivors:
            p.popen.send_signal(signal.SIGTERM)
        for p in survivors:
            try:
                code = p.popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                raise DemoError(f"{p.name} did not exit within 15s of SIGTERM") from None
            if code != 0:
                raise DemoError(f"{p.name} exited with status {code}:\n{p.log_tail()}")

        self.print_tables(final, short, victim)
        return self.judge(short, victim)

    @staticmethod
    def _view_text(view: dict[str, Any], short: dict[str, str]) -> str:
        creator = short.get(view["id"][1], view["id"][1])
        return f"[{creator}|{view['id'][0]}] ({', '.join(short.get(m, m) for m in view['members'])})"

    def print_tables(self, final: dict[str, Any], short: dict[str, str], victim: Proc) -> None:
        print()
        print("Views installed (from the recorded histories, before the survivors began to leave):")
        print(f"  {'member':<8}{'view id':<12}members")
        for p in self.procs:
            for ev in _read(p.record):
                if ev.kind == "view" and ev.t < self.stopping_at:
                    vid = ev.data["view_id"]
                    label = f"{short.get(vid[1], vid[1])}|{vid[0]}"
                    members = ", ".join(short.get(m, m) for m in ev.data["members"])
                    print(f"  {p.name:<8}{label:<12}{members}")
        senders = [p.name for p in self.procs]
        print()
        print("Messages delivered (rows: member, columns: sender):")
        print("  " + f"{'member':<8}" + "".join(f"{s:>8}" for s in senders) + f"{'total':>9}")
        for p in self.procs:
            st = final.get(p.name)
            note = ""
            if p is victim:
                counts: dict[str, int] = defaultdict(int)
                for ev in _read(p.record):
                    if ev.kind == "deliver":
                        counts[short.get(ev.data["sender"], ev.data["sender"])] += 1
                note = "  (killed; from its record)"
            else:
                counts = {short.get(a, a): c for a, c in (st["delivered"] if st else {}).items()}
            row = "".join(f"{counts.get(s, 0):>8}" for s in senders)
            print(f"  {p.name:<8}{row}{sum(counts.values()):>9}{note}")
        print()

    def judge(self, short: dict[str, str], victim: Proc) -> int:
        from ..sim import checkers

        events: list[HistoryEvent] = []
        victim_addr = next(a for a, name in short.items() if name == victim.name)
        for p in self.procs:
            # The survivors leave only after delivering everything; judging them as members that stayed (up to
            # their leave) is the stricter check, since the checkers owe nothing to a member that left.
            events.extend(ev for ev in _read(p.record) if ev.t < self.stopping_at)
        assert victim.killed_at is not None
        events.append(HistoryEvent(victim.killed_at, victim_addr, "crash"))
        events.sort(key=lambda e: e.t)
        history = History(events)
        violations = checkers.check_safety(history)
        violations += checkers.check_merge_convergence(history)

        survivors = {a for a in short if a != victim_addr}
        sent: dict[tuple[str, str], None] = {}
        delivered: dict[str, set[tuple[str, str]]] = defaultdict(set)
        for ev in events:
            if ev.kind == "send" and ev.data.get("dest") is None:
                sent[(ev.member, ev.data["msg"])] = None
            elif ev.kind == "deliver" and ev.data.get("dest") is None:
                delivered[ev.member].add((ev.data["sender"], ev.data["msg"]))
        everything = set().union(*delivered.values()) if delivered else set()
        lost = {m for m in sent if m[0] in survivors and any(m not in delivered[r] for r in survivors)}
        from_victim = {m for m in everything if m[0] == victim_addr}
        partial = {m for m in from_victim if any(m not in delivered[r] for r in survivors)}

        by_property: dict[str, int] = defaultdict(int)
        for v in violations:
            by_property[v.property] += 1
        names = [*checkers.SAFETY_CHECKERS, "merge-convergence"]
        results = (f"{name} {by_property[name] or 'ok'}" for name in names)
        print("Checkers: " + ", ".join(results))
        for v in violations[:10]:
            print(f"  violation: {v}")
        print(
            f"Messages of the killed {victim.name}: {len(from_victim)} delivered, "
            f"{len(partial)} of them not by every survivor"
        )
        print(f"demo: {len(everything)} messages delivered, {len(lost)} lost", flush=True)
        return 1 if lost or violations else 0


def _read(path: Path) -> list[HistoryEvent]:
    try:
        return History.read(path).events
    except FileNotFoundError:
        return []


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    if getattr(args, "timeout", None) is None:
        args.timeout = GROUP_TIMEOUT
    try:
        demo = Demo(args)
    except DemoError as exc:
        print(f"groupcluster demo: error: {exc}", file=sys.stderr)
        return 2
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    workdir = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="groupcluster-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    code = 1
    try:
        code = demo.run(workdir)
    except DemoError as exc:
        print(f"demo: failed: {exc}", flush=True)
        code = 1
        if demo.judgeable is not None:
            demo.stop_gracefully()
            demo.judge(*demo.judgeable)
    except KeyboardInterrupt:
        print("demo: interrupted; stopping the members", flush=True)
        code = 130
    finally:
        demo.shutdown()
        signal.signal(signal.SIGTERM, previous)
        if not args.dir and code == 0:
            shutil.rmtree(workdir, ignore_errors=True)
        elif not args.dir:
            print(f"demo: records, status files and logs kept in {workdir}", flush=True)
    return code
