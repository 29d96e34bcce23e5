"""Bad input to a real member process: a bad stack file fails at start naming the key; garbage on the wire is
counted and does not stop the member from delivering."""

from __future__ import annotations

import random
import socket
import subprocess
import sys

import msgpack
import pytest
from groupcluster.core.address import Address
from groupcluster.core.message import Message
from groupcluster.core.wire import encode_messages

from .procs import Members, free_port, loopback_hosts, view_of, wait_until


def _member(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "groupcluster.cli", "member", "--cluster", "bad", "--bind", "127.0.0.1:0", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("- layer: transport\n- layer: fd\n  timout: 2s\n", "unknown key 'timout'; allowed keys: interval, timeout"),
        ("- layer: transport\n- layer: fd\n  timeout: soon\n", "stack[1] (fd).timeout"),
        ("- layer: transport\n- layer: nakak\n", "stack[1].layer: unknown layer 'nakak'; allowed values:"),
        ("preset: fifo\noverrides:\n  gms: {join_timeout: -1}\n", "gms"),
        ("[unclosed\n", "stack file"),
    ],
)
def test_bad_stack_file_exits_2_naming_the_key(tmp_path, text: str, expected: str) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "stack.yaml"
    path.write_text(text)
    result = _member("--stack", str(path))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("groupcluster member: error: ") and expected in lines[0], lines[0]


def test_bad_flags_are_argparse_errors() -> None:
    for args, expected in [
        (("--transport", "sctp"), "invalid choice: 'sctp'"),
        (("--hosts", "nohost"), "expected HOST:PORT"),
        (("--send-rate", "fast"), "'unlimited'"),
        (("--set", "fdtimeout"), "LAYER.KEY=VALUE"),
    ]:
        result = _member(*args)
        assert result.returncode == 2 and expected in result.stderr, (args, result.stderr)
    result = _member("--set", "fd.timout=2s")
    assert result.returncode == 2 and "unknown key 'timout'" in result.stderr, result.stderr
    result = _member("--stack", "nosuchpreset")
    assert result.returncode == 2 and "is neither a preset (fifo, " in result.stderr, result.stderr


def test_member_counts_garbage_datagrams_and_still_delivers(members: Members) -> None:
    hosts = loopback_hosts(2)
    port = free_port(hosts)
    everyone = ",".join(f"{h}:{port}" for h in hosts)
    procs = [
        members.start(
            f"m{i + 1}", f"{h}:{port}", "--hosts", everyone, "--send-count", "1000", "--start-when-members", "2"
        )
        for i, h in enumerate(hosts)
    ]
    wait_until("one view of 2", lambda: all(len(view_of(p) or ()) == 2 for p in procs), 30, members, procs)
    rng = random.Random(7)
    garbage = [rng.randbytes(rng.randint(1, 1500)) for _ in range(300)]
    # Well-formed msgpack that is not a frame, and a valid frame of another cluster: dropped the same way.
    garbage.append(msgpack.packb([1, "x"]))
    garbage.append(encode_messages("another-cluster", Address("127.0.0.99", 1, 5), [Message(None, b"hi")]))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for data in garbage:
            s.sendto(data, (hosts[0], port))

    def done() -> bool:
        sts = [p.status() for p in procs]
        return all(st and st["delivered_total"] >= 2000 for st in sts) and sts[0]["metrics"].get(  # type: ignore[index]
            "transport.bad_frames"
        ) == len(garbage)

    wait_until("deliveries and the garbage count", done, 60, members, procs)
    sts = [p.status() for p in procs]
    assert [st["delivered_total"] for st in sts] == [2000, 2000]  # type: ignore[index]
    assert sts[0]["metrics"].get("runtime.errors", 0) == 0  # type: ignore[index]
    assert all(p.alive() for p in procs)


def test_endpoint_in_use_and_unusable_files_fail_with_one_line() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "groupcluster.cli", "member", "--cluster", "bad", "--bind", f"127.0.0.1:{port}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 1
    assert (
        result.stderr.strip() == f"groupcluster member: error: cannot bind udp 127.0.0.1:{port}: Address already in use"
    )
    result = _member("--record", "/nonexistent-dir/h.jsonl")
    assert result.returncode == 1 and "cannot open the history file /nonexistent-dir/h.jsonl" in result.stderr
