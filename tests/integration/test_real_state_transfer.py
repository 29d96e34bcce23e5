"""Real member processes on loopback: three members multicast without pause while a fourth joins and fetches
the group's state (a log of every multicast applied, padded to several megabytes so it travels in many
chunks). When the traffic ends, the joiner's state — the transferred part plus what it delivered after —
equals the others' state, per sender, message for message: nothing lost or applied twice at the cut."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from .procs import free_port, loopback_hosts

APP = Path(__file__).with_name("state_app.py")
SEND_COUNT = 1500
PADDING = 3 * 1024 * 1024


def status(out: Path, host: str) -> dict[str, Any] | None:
    try:
        return json.loads((out / f"{host}.status.json").read_text())
    except (OSError, ValueError):
        return None


def wait_for(what: str, pred: Any, timeout: float, procs: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        for p in procs:
            assert p.poll() is None, f"a member exited ({p.returncode}) while waiting for {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.mark.parametrize("stack", ["vsync", "total-order"])
def test_a_joiner_gets_a_consistent_state_while_the_group_keeps_sending(tmp_path: Path, stack: str) -> None:
    hosts = loopback_hosts(4)
    port = free_port(hosts, "udp")
    everyone = ",".join(f"{h}:{port}" for h in hosts)
    procs: list[subprocess.Popen[bytes]] = []

    def start(host: str, *extra: str) -> subprocess.Popen[bytes]:
        argv = [sys.executable, str(APP), "--bind", f"{host}:{port}", "--hosts", everyone]
        argv += ["--cluster", f"st-{tmp_path.name}", "--out", str(tmp_path), "--stack", stack, *extra]
        with open(tmp_path / f"{host}.out", "wb") as fh:
            p = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        procs.append(p)
        return p

    try:
        old = hosts[:3]
        for h in old:
            start(
                h,
                "--send-count",
                str(SEND_COUNT),
                "--send-rate",
                "300",
                "--padding",
                str(PADDING),
                "--wait-members",
                "3",
            )
        wait_for("a view of 3", lambda: all((status(tmp_path, h) or {}).get("view") == 3 for h in old), 60, procs)
        wait_for("traffic", lambda: all((status(tmp_path, h) or {}).get("sent", 0) >= 300 for h in old), 30, procs)
        joiner = hosts[3]
        start(joiner, "--fetch", "--send-count", "200", "--send-rate", "100", "--padding", str(PADDING))
        wait_for("the joiner's state", lambda: (status(tmp_path, joiner) or {}).get("state_ready"), 60, procs)
        st = status(tmp_path, joiner)
        assert st is not None and st["donor"] is not None
        # The group did not stop: the others were still sending when the state arrived.
        assert any((status(tmp_path, h) or {}).get("sent", 0) < SEND_COUNT for h in old)
        total = 3 * SEND_COUNT + 200
        wait_for(
            "every member to apply every multicast",
            lambda: all((status(tmp_path, h) or {}).get("applied", 0) >= total for h in hosts),
            90,
            procs,
        )
        for p in procs:
            p.terminate()
        for p in procs:
            assert p.wait(20) == 0, "a member failed to stop cleanly"
        logs = {h: (tmp_path / f"{h}.log.txt").read_text().split("\n") for h in hosts}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    def per_sender(lines: list[str]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for line in lines:
            sender, _, payload = line.partition(" ")
            out.setdefault(sender, []).append(payload)
        return out

    reference = per_sender(logs[hosts[0]])
    assert sorted(len(v) for v in reference.values()) == [200, SEND_COUNT, SEND_COUNT, SEND_COUNT]
    for sender, msgs in reference.items():
        assert msgs == [str(i) for i in range(len(msgs))], f"{sender}: not every message once, in order"
    for h in hosts[1:]:
        assert per_sender(logs[h]) == reference, f"{h} applied other messages than {hosts[0]}"
    if stack == "total-order":
        assert all(logs[h] == logs[hosts[0]] for h in hosts), "total order: the logs differ in order"
    # Identical per-sender logs at the joiner mean its state holds the multicasts sent before it started.
    assert per_sender(logs[hosts[3]])[next(iter(reference))][0] == "0"


def test_total_order_join_with_state_then_the_sequencer_is_killed(tmp_path: Path) -> None:
    """A real-process scenario: four processes multicast in total order, one of them joining with state
    transfer while the others send; then the coordinator (the sequencer) is killed mid-traffic. The three
    survivors end with the very same log — the joiner's transferred state included — holding every multicast
    each survivor sent exactly once, in order."""
    hosts = loopback_hosts(4)
    port = free_port(hosts, "udp")
    everyone = ",".join(f"{h}:{port}" for h in hosts)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    count = 1500

    def start(host: str, *extra: str) -> None:
        argv = [sys.executable, str(APP), "--bind", f"{host}:{port}", "--hosts", everyone, "--stack", "total-order"]
        argv += ["--cluster", f"tk-{tmp_path.name}", "--out", str(tmp_path), "--send-count", str(count), *extra]
        with open(tmp_path / f"{host}.out", "wb") as fh:
            procs[host] = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    try:
        old = hosts[:3]
        for h in old:
            start(h, "--send-rate", "300", "--padding", str(PADDING), "--wait-members", "3")
        running = list(procs.values())
        wait_for("a view of 3", lambda: all((status(tmp_path, h) or {}).get("view") == 3 for h in old), 60, running)
        wait_for("traffic", lambda: all((status(tmp_path, h) or {}).get("sent", 0) >= 200 for h in old), 30, running)
        joiner = hosts[3]
        start(joiner, "--fetch", "--send-rate", "300", "--padding", str(PADDING))
        running = list(procs.values())
        wait_for("the joiner's state", lambda: (status(tmp_path, joiner) or {}).get("state_ready"), 60, running)
        wait_for("the joiner to send", lambda: (status(tmp_path, joiner) or {}).get("sent", 0) >= 100, 30, running)
        # The first member founded the group: it is the coordinator, hence the sequencer.
        victim = hosts[0]
        assert (status(tmp_path, victim) or {}).get("sent", 0) < count, "traffic ended before the kill"
        procs[victim].kill()
        procs[victim].wait()
        survivors = hosts[1:]
        running = [procs[h] for h in survivors]
        wait_for(
            "a view of 3 without the sequencer",
            lambda: all((status(tmp_path, h) or {}).get("view") == 3 for h in survivors),
            60,
            running,
        )
        wait_for(
            "the survivors to finish sending",
            lambda: all((status(tmp_path, h) or {}).get("sent", 0) >= count for h in survivors),
            90,
            running,
        )

        def settled() -> bool:
            applied = {(status(tmp_path, h) or {}).get("applied") for h in survivors}
            return len(applied) == 1

        wait_for("the survivors to apply the same number of multicasts", settled, 60, running)
        time.sleep(1.0)
        assert settled()
        for h in survivors:
            procs[h].terminate()
        for h in survivors:
            assert procs[h].wait(20) == 0, "a member failed to stop cleanly"
        logs = {h: (tmp_path / f"{h}.log.txt").read_text().split("\n") for h in survivors}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()

    first = logs[survivors[0]]
    assert all(logs[h] == first for h in survivors), "the survivors' logs differ (order or content)"
    by_sender: dict[str, list[str]] = {}
    for line in first:
        sender, _, payload = line.partition(" ")
        by_sender.setdefault(sender, []).append(payload)
    addresses = {(status(tmp_path, h) or {}).get("address") for h in survivors}
    for sender, msgs in by_sender.items():
        if sender in addresses:
            assert msgs == [str(i) for i in range(count)], f"{sender}: not every message once, in order"
        else:  # the killed sequencer: what the survivors agreed on is a gap-free prefix of what it sent
            assert msgs == [str(i) for i in range(len(msgs))] and len(msgs) >= 200
