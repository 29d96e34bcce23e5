"""A member's memory (RSS) under a slow receiver and under a flood of bogus fragments.

    python bench/memory_resources.py [--scenario slow|flood|both] [--seconds 20] [--json]

* ``slow``: three members on loopback; two multicast 1 KiB messages as fast as flow control lets them, the
  third is a slow receiver (SIGSTOP for 400 ms, SIGCONT for 100 ms, over and over: it stays in the view but
  drains a fifth of the time). Flow control (``flow.max_credits``, 4 MiB per receiver) must stop the senders,
  so their retransmission buffers and everyone's receive windows stay bounded: we sample every member's RSS
  and report the peak against the first sample taken in the view.
* ``flood``: two members; a raw UDP socket sends the first member frames that claim to come from the second,
  each carrying a fragment of a message announced as 65536 fragments (the most a header may claim), with new
  message ids and 1 KiB payloads: several hundred MB of offered fragments. FRAG must hold at most
  ``frag.max_pending`` (64 MiB by default, counting each announced message's slot list) and drop the oldest.
  The flood is paced so that the member reads nearly all of it (the figure "partial messages dropped" says how
  many fragments reached FRAG and were thrown away).

Figures are read from /proc/PID/status (VmRSS, VmHWM) and the members' counters.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from groupcluster.core import protocol_ids
from groupcluster.core.address import Address
from groupcluster.core.message import NO_FLOW_CONTROL, NO_RELIABILITY, Message
from groupcluster.core.wire import encode_messages
from groupcluster.protocols.frag import MAX_FRAGMENTS, FragHeader

MIB = 1024 * 1024


def rss(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) in bytes."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) * 1024
    return fields["VmRSS"], fields["VmHWM"]


def free_udp_port(hosts: list[str]) -> int:
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind((hosts[0], 0))
            port = s.getsockname()[1]
        try:
            for h in hosts[1:]:
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                    s.bind((h, port))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port")


class Cluster:
    def __init__(self, n: int, workdir: Path, cluster: str) -> None:
        self.hosts = [f"127.0.0.{41 + i}" for i in range(n)]
        self.port = free_udp_port(self.hosts)
        self.workdir = workdir
        self.cluster = cluster
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, i: int, *extra: str) -> subprocess.Popen[bytes]:
        everyone = ",".join(f"{h}:{self.port}" for h in self.hosts)
        argv = [sys.executable, "-m", "groupcluster.cli", "member", "--cluster", self.cluster,
                "--bind", f"{self.hosts[i]}:{self.port}", "--hosts", everyone,
                "--status-file", str(self.status_path(i)), *extra]  # fmt: skip
        log = open(self.workdir / f"m{i}.log", "wb")  # noqa: SIM115  # closed with the process
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def status_path(self, i: int) -> Path:
        return self.workdir / f"m{i}.json"

    def status(self, i: int) -> dict[str, Any] | None:
        try:
            return json.loads(self.status_path(i).read_text())
        except (OSError, ValueError):
            return None

    def wait_view(self, n: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            sts = [self.status(i) for i in range(n)]
            if all(st and st.get("view") and len(st["view"]["members"]) == n for st in sts):
                return
            time.sleep(0.2)
        raise SystemExit(f"no view of {n} within {timeout}s (logs in {self.workdir})")

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
                p.kill()
                p.wait()


def slow_receiver(seconds: float, workdir: Path) -> dict[str, Any]:
    c = Cluster(3, workdir, f"mem-slow-{os.getpid()}")
    try:
        fd = ("--set", "fd.timeout=30s")  # a paused receiver must stay in the view: it is slow, not dead
        for i in range(2):
            c.start(i, *fd, "--send-count", "100000000", "--payload-size", "1024", "--send-rate", "unlimited",
                    "--start-when-members", "3", "--record", os.devnull)  # fmt: skip
        slow = c.start(2, *fd)
        c.wait_view(3)
        base = [rss(p.pid)[0] for p in c.procs]
        peak = list(base)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            os.kill(slow.pid, signal.SIGSTOP)
            time.sleep(0.4)
            peak = [max(pk, rss(p.pid)[0]) for pk, p in zip(peak, c.procs, strict=True)]
            os.kill(slow.pid, signal.SIGCONT)
            time.sleep(0.1)
            peak = [max(pk, rss(p.pid)[0]) for pk, p in zip(peak, c.procs, strict=True)]
        sts = [c.status(i) or {} for i in range(3)]
        return {
            "seconds": seconds,
            "members": [
                {
                    "role": "slow receiver" if i == 2 else "sender",
                    "rss_start_mib": round(base[i] / MIB, 1),
                    "rss_peak_mib": round(peak[i] / MIB, 1),
                    "delivered": sts[i].get("delivered_total"),
                    "sent": sts[i].get("sent"),
                    "blocked_now": sts[i].get("blocked"),
                    "view": len((sts[i].get("view") or {}).get("members", [])),
                }
                for i in range(3)
            ],
        }
    finally:
        c.stop()


def fragment_flood(fragments: int, workdir: Path) -> dict[str, Any]:
    c = Cluster(2, workdir, f"mem-flood-{os.getpid()}")
    try:
        victim = c.start(0)
        c.start(1)
        c.wait_view(2)
        st1 = c.status(1)
        assert st1 is not None
        claimed = Address.parse(st1["address"])  # frames claim to come from the other member (no auth here)
        base = rss(victim.pid)[0]
        peak = base
        payload = b"F" * 1024
        sent_bytes = 0
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as raw:
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * MIB)
            batch = 40
            for first in range(0, fragments, batch):
                msgs = [
                    Message(None, payload, flags=NO_RELIABILITY | NO_FLOW_CONTROL,
                            headers={protocol_ids.FRAG: FragHeader(10**9 + first + k, 0, MAX_FRAGMENTS)})
                    for k in range(batch)
                ]  # fmt: skip
                data = encode_messages(c.cluster, claimed, msgs)
                raw.sendto(data, (c.hosts[0], c.port))
                sent_bytes += len(data)
                # Paced so the member reads (nearly) all of it: we measure its memory, not the kernel's drops.
                time.sleep(0.005)
                if first % 2000 == 0:
                    peak = max(peak, rss(victim.pid)[0])
        time.sleep(2.0)
        peak = max(peak, rss(victim.pid)[0])
        st0 = c.status(0) or {}
        metrics = st0.get("metrics", {})
        return {
            "fragments_offered": fragments,
            "offered_mib": round(sent_bytes / MIB, 1),
            "announced_slots_mib": round(fragments * MAX_FRAGMENTS * 8 / MIB),
            "rss_start_mib": round(base / MIB, 1),
            "rss_peak_mib": round(peak / MIB, 1),
            "rss_hwm_mib": round(rss(victim.pid)[1] / MIB, 1),
            "dropped_partial": metrics.get("frag.dropped_partial", 0),
            "udp_receive_errors": metrics.get("runtime.udp_receive_errors", 0),
            "still_in_view": len((st0.get("view") or {}).get("members", [])),
        }
    finally:
        c.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=("slow", "flood", "both"), default="both")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of the slow-receiver run")
    parser.add_argument("--fragments", type=int, default=40_000, help="bogus fragments in the flood")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="gc-mem-bench-"))
    result: dict[str, Any] = {}
    if args.scenario in ("slow", "both"):
        result["slow_receiver"] = slow_receiver(args.seconds, workdir)
    if args.scenario in ("flood", "both"):
        result["fragment_flood"] = fragment_flood(args.fragments, workdir)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    if "slow_receiver" in result:
        r = result["slow_receiver"]
        print(f"slow receiver ({r['seconds']:g}s, paused 80% of the time), RSS in MiB:")
        print(f"  {'member':>14} {'start':>7} {'peak':>7} {'sent':>9} {'delivered':>10} {'view':>5}")
        for m in r["members"]:
            print(f"  {m['role']:>14} {m['rss_start_mib']:>7} {m['rss_peak_mib']:>7} {m['sent'] or 0:>9} "
                  f"{m['delivered'] or 0:>10} {m['view']:>5}")  # fmt: skip
    if "fragment_flood" in result:
        f = result["fragment_flood"]
        print(
            f"fragment flood: {f['fragments_offered']} bogus fragments ({f['offered_mib']} MiB offered, announcing "
            f"{f['announced_slots_mib']} MiB of slots): RSS {f['rss_start_mib']} -> peak {f['rss_peak_mib']} MiB "
            f"(high-water {f['rss_hwm_mib']}), {f['dropped_partial']} partial messages dropped, "
            f"view of {f['still_in_view']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
