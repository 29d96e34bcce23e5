"""Frame authentication with real member processes on loopback (``transport.auth_secret_file``).

Three members hold the cluster key (one of them, the "spy", also writes every raw frame it receives to a file:
a legitimate member sees the same multicast frame bytes as the others). A member with another key and a member
without a key start with the same host list: they never get into the keyed members' view, and the keyed
members count their frames as rejected. Then the frames the spy captured are sent again to another member from
a raw UDP socket: they are dropped as replays, and nothing is delivered twice.
"""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

from groupcluster.core.errors import WireError
from groupcluster.core.wire import decode_frame
from groupcluster.protocols.auth import HEADER_SIZE, TAG_SIZE

from .procs import FD_FLAGS, MemberProcess, Members, free_port, loopback_hosts, view_of, wait_until

MESSAGES = 300

# A member that records every frame it receives (length-prefixed) before handling it, then runs the CLI.
SPY = """
import sys
from groupcluster.runtime import driver

out = open(sys.argv[1], "ab", buffering=0)
handle = driver.Driver._on_frames

def record(self, frames):
    out.write(b"".join(len(f).to_bytes(4, "big") + bytes(f) for f in frames))
    handle(self, frames)

driver.Driver._on_frames = record
from groupcluster.cli import main
sys.argv = ["groupcluster", *sys.argv[2:]]
sys.exit(main())
"""


def read_captured(path: Path) -> list[bytes]:
    data = path.read_bytes()
    frames, pos = [], 0
    while pos + 4 <= len(data):
        size = int.from_bytes(data[pos : pos + 4], "big")
        if pos + 4 + size > len(data):
            break
        frames.append(data[pos + 4 : pos + 4 + size])
        pos += 4 + size
    return frames


def test_only_key_holders_form_the_group_and_replays_are_dropped(members: Members, tmp_path: Path) -> None:
    key = tmp_path / "cluster.key"
    key.write_text("0f1e2d3c4b5a69788796a5b4c3d2e1f0-cluster-key\n")
    other_key = tmp_path / "other.key"
    other_key.write_text("another-key-of-somebody-else-0123456789\n")
    hosts = loopback_hosts(5)
    port = free_port(hosts)
    everyone = ",".join(f"{h}:{port}" for h in hosts)
    cluster = f"auth-{tmp_path.name}"
    common = ("--cluster", cluster, "--hosts", everyone, *FD_FLAGS)
    keyed = ("--set", f"transport.auth_secret_file={key}")
    capture = tmp_path / "spy.frames"

    m1 = members.start("m1", f"{hosts[0]}:{port}", *common, *keyed, "--send-count", str(MESSAGES),
                       "--start-when-members", "3", "--send-rate", "200")  # fmt: skip
    m2 = members.start("m2", f"{hosts[1]}:{port}", *common, *keyed)
    # The spy: a keyed member started through the recording wrapper (Members.start runs the plain CLI).
    spy_argv = [sys.executable, "-c", SPY, str(capture), "member", "--bind", f"{hosts[2]}:{port}", *common, *keyed,
                "--status-file", str(tmp_path / "spy.status.json")]  # fmt: skip
    spy = MemberProcess("spy", f"{hosts[2]}:{port}", tmp_path, spy_argv)
    members.procs.append(spy)
    wrong = members.start(
        "wrong-key", f"{hosts[3]}:{port}", *common, "--set", f"transport.auth_secret_file={other_key}"
    )
    nokey = members.start("no-key", f"{hosts[4]}:{port}", *common)
    keyed_procs = [m1, m2, spy]
    everybody = [*keyed_procs, wrong, nokey]

    def formed() -> bool:
        if not all(len(view_of(p) or ()) == 3 for p in keyed_procs):
            return False
        sts = [p.status() for p in keyed_procs]
        return all(st and st["delivered_total"] >= MESSAGES for st in sts)  # type: ignore[index]

    wait_until("the keyed members' view of 3 and every message delivered", formed, 60, members, everybody)
    # Outsiders keep probing; give them a few discovery rounds of being rejected.
    wait_until(
        "rejections from both outsiders",
        lambda: all(
            (st := p.status()) is not None
            and st["metrics"].get("transport.auth_unknown_key", 0) > 0
            and st["metrics"].get("transport.auth_unauthenticated", 0) > 0
            for p in (m1, m2)
        ),
        30,
        members,
        everybody,
    )
    keyed_addresses = {p.address() for p in keyed_procs}
    for p in keyed_procs:
        assert set(view_of(p) or ()) == keyed_addresses
    for outsider in (wrong, nokey):
        view = set(view_of(outsider) or ())
        assert not view & keyed_addresses, f"{outsider.name} got into a view with key holders: {view}"
    st1 = m1.status()
    assert st1 is not None and st1["metrics"]["transport.auth_rejected"] >= 2
    # The member without a key cannot read sealed frames either: they are bad frames to it.
    st_nokey = nokey.status()
    assert st_nokey is not None and st_nokey["metrics"].get("transport.bad_frames", 0) > 0

    # Replay: frames m1 multicast to the group, captured by the spy, sent again to m2 from a raw socket.
    m1_address = m1.address()
    captured = read_captured(capture)
    from_m1 = []
    for frame in captured:
        if frame[:1] != b"\xc1":
            continue  # the outsider without a key sends plain frames
        try:
            sender, msgs = decode_frame(frame[HEADER_SIZE:-TAG_SIZE], cluster)  # MAC mode: the frame is in clear
        except WireError:
            continue
        if str(sender) == m1_address and msgs and all(m.dest is None for m in msgs):
            from_m1.append(frame)
    assert len(from_m1) >= 10, f"the spy captured {len(captured)} frames, {len(from_m1)} multicasts from m1"

    def replayed_at_m2() -> int:
        st = m2.status()
        return st["metrics"].get("transport.auth_replayed", 0) if st else 0

    def replay(frames: list[bytes]) -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as raw:
            for frame in frames:
                raw.sendto(frame, (hosts[1], port))
                time.sleep(0.001)  # stay within the receive buffer

    before = m2.status()
    assert before is not None
    # First round: m2 received nearly all of them already (a frame multicast while m2 was not yet in m1's view,
    # or lost on the way, is new to m2: accepted once, and NAKACK drops what it carries as a duplicate).
    base = replayed_at_m2()
    replay(from_m1)
    wait_until(
        "the replayed frames counted at m2",
        lambda: replayed_at_m2() - base >= 0.9 * len(from_m1),
        20,
        members,
        keyed_procs,
    )
    time.sleep(1.0)
    # Second round: m2 has now seen every one of them, so every single frame is a replay.
    base = replayed_at_m2()
    replay(from_m1)
    wait_until("every frame of the second round counted", lambda: replayed_at_m2() - base >= len(from_m1), 20,
               members, keyed_procs)  # fmt: skip
    time.sleep(0.6)  # a status file is rewritten every 0.5 s: let a late count show before the exact check
    after = m2.status()
    assert after is not None
    assert after["metrics"]["transport.auth_replayed"] - base == len(from_m1)
    # Nothing was delivered again.
    assert after["delivered_total"] == before["delivered_total"] == MESSAGES
    assert after["metrics"].get("runtime.errors", 0) == 0
    assert all(p.alive() for p in everybody)
