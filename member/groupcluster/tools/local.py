"""``groupcluster local``: start, scale, inspect and stop a cluster of grid member processes on this machine.

::

    groupcluster local start --members 3        # 3 members on 127.0.0.1, ports chosen free
    groupcluster local scale 5                  # 2 more join; their segments move to them
    groupcluster local scale 2                  # 3 leave, one wave at a time, each after handing off
    groupcluster local status [--json]          # member, endpoint, view, topology, phase, segments, keys
    groupcluster local capacity m2 0            # m2 hands its segments to the others and stays a member
    groupcluster local stop

The terminal side: the command line, the progress bar and the status table. The processes, the state
directory and the rules for scaling down and capacity changes are :mod:`groupcluster.tools.local_cluster`.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from typing import Any, TextIO

from ..grid.consistent_hash import MAX_CAPACITY
from .local_cluster import DEFAULT_DIR, MAX_MEMBERS, LocalCluster, LocalError

_DIGITS = re.compile(r"[0-9][0-9,./%]*")


# ==== progress ==================================================================================================
class ProgressBar:
    """A one-line progress bar on a terminal; plain periodic lines otherwise (logs, pipes, CI).

    ``update`` may be called as often as convenient: a terminal is redrawn at most 10 times a second, a
    non-terminal gets a line every ``interval`` seconds, and at once when the text says something new.
    """

    def __init__(self, stream: TextIO | None = None, *, width: int = 30, interval: float = 2.0) -> None:
        self.stream = stream or sys.stdout
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.width = width
        self.interval = interval
        self._last = 0.0
        self._shown = False
        self._last_head = ""

    def update(self, fraction: float | None, text: str) -> None:
        now = time.monotonic()
        # What the text says, without its numbers: a new stage prints at once, new counts only periodically.
        head = _DIGITS.sub("", text.split("|", 1)[0])
        if self.tty:
            if now - self._last < 0.1:
                return
            self._last = now
            self.stream.write("\r" + self.render(fraction, text) + "\033[K")
            self.stream.flush()
            self._shown = True
        elif now - self._last >= self.interval or head != self._last_head:
            self._last = now
            self._last_head = head
            self.stream.write(self.render(fraction, text) + "\n")
            self.stream.flush()

    def render(self, fraction: float | None, text: str) -> str:
        if fraction is None:
            return f"  [{'.' * self.width}]      {text}"
        f = min(1.0, max(0.0, fraction))
        full = int(f * self.width)
        return f"  [{'#' * full}{'-' * (self.width - full)}] {f * 100:3.0f}% {text}"

    def finish(self, text: str | None = None) -> None:
        """End the bar (a terminal line is completed); ``text`` is printed as its own line."""
        if self.tty and self._shown:
            self.stream.write("\n")
        self._shown = False
        self._last = 0.0
        self._last_head = ""
        if text:
            self.stream.write(text + "\n")
        self.stream.flush()


# ==== status table ==============================================================================================
def format_table(rows: list[dict[str, Any]]) -> str:
    """The status rows as an aligned text table."""
    header = ["member", "endpoint", "view", "topology", "phase", "segments", "keys", ""]
    lines = []
    for r in rows:
        if not r["alive"]:
            lines.append([r["member"], r["endpoint"], "-", "-", "(not running)", "-", "-", ""])
            continue
        if r["view_id"] is None:
            lines.append([r["member"], r["endpoint"], "-", "-", "(not joined)", "-", "-", ""])
            continue
        view = f"{len(r['view'])} ({','.join(r['view'])})"
        segs = "-" if r["segments_owned"] is None else f"{r['segments_owned']} ({r['segments_primary']} primary)"
        keys = "-" if r["keys"] is None else f"{r['keys']:,}"
        notes = [n for n, on in (("coordinator", r["coordinator"]), ("leaving", r["leaving"])) if on]
        if r.get("capacity") not in (None, 1.0):
            notes.append(f"capacity {r['capacity']:g}")
        if r["availability"] not in (None, "AVAILABLE"):
            notes.append(r["availability"].lower())
        lines.append(
            [
                r["member"],
                r["endpoint"],
                view,
                str(r["topology_id"] if r["topology_id"] is not None else "-"),
                r["phase"] or "-",
                segs,
                keys,
                ", ".join(notes),
            ]
        )
    widths = [max(len(header[i]), *(len(ln[i]) for ln in lines)) for i in range(len(header))]
    right = {3, 6}  # numbers

    def fmt(cells: list[str]) -> str:
        out = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))]
        return "  ".join(out).rstrip()

    return "\n".join([fmt(header), *(fmt(ln) for ln in lines)])


# ==== command line ==============================================================================================
def _count(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of members, got {text!r}") from None
    if not 1 <= n <= MAX_MEMBERS:
        raise argparse.ArgumentTypeError(f"expected 1 to {MAX_MEMBERS} members, got {n}")
    return n


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = -1.0
    if not v > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return v


def _capacity(text: str) -> float:
    try:
        c = float(text)
    except ValueError:
        c = -1.0
    if not 0.0 <= c <= MAX_CAPACITY:  # NaN fails this too
        raise argparse.ArgumentTypeError(f"expected a capacity from 0 to {MAX_CAPACITY:.0f}, got {text!r}")
    return c


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--dir",
        default=DEFAULT_DIR,
        help=f"where the cluster's state, hosts file and logs live (default {DEFAULT_DIR})",
    )
    subs = parser.add_subparsers(dest="action", metavar="ACTION")
    subs.required = True
    start = subs.add_parser("start", parents=[common], help="start a local cluster of grid members")
    start.add_argument("--members", type=_count, default=3, metavar="N", help="members to start (default 3)")
    start.add_argument("--cluster", help="cluster name (default local-PID)")
    start.add_argument(
        "--grid-set",
        dest="grid_params",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="grid parameter for every member, e.g. num_owners=2 (repeatable)",
    )
    start.add_argument("--timeout", type=_seconds, default=120.0, help="give up waiting after this long (default 120)")
    scale = subs.add_parser("scale", parents=[common], help="grow or shrink the cluster to N members")
    scale.add_argument("n", type=_count, metavar="N", help=f"members wanted (1-{MAX_MEMBERS})")
    scale.add_argument("--timeout", type=_seconds, default=600.0, help="give up after this long (default 600)")
    status = subs.add_parser("status", parents=[common], help="a table of the members and their grid state")
    status.add_argument("--json", action="store_true", help="print the rows as JSON")
    capacity = subs.add_parser(
        "capacity",
        parents=[common],
        help="set a running member's capacity and wait for the rebalance (0: it owns no segments, stays a member)",
    )
    capacity.add_argument("member", metavar="MEMBER", help="the member's name, as status shows it (e.g. m2)")
    capacity.add_argument(
        "capacity", type=_capacity, metavar="C", help="its new capacity factor, 0 to 1000000 (1: an even share)"
    )
    capacity.add_argument("--timeout", type=_seconds, default=600.0, help="give up after this long (default 600)")
    subs.add_parser("stop", parents=[common], help="stop every member (the data goes with them)")


def run(args: argparse.Namespace) -> int:
    cluster = LocalCluster(args.dir)
    try:
        if args.action != "start" and not cluster.state_path.exists():
            cluster.require_running()  # the clear "no cluster in DIR" error, without creating DIR for the lock
        with cluster.locked():
            return _run(cluster, args)
    except LocalError as exc:
        print(f"groupcluster local: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("groupcluster local: interrupted (the members keep running; see groupcluster local status)")
        return 130


def _run(cluster: LocalCluster, args: argparse.Namespace) -> int:
    bar = ProgressBar()
    if args.action == "start":
        print(f"starting {args.members} members in {cluster.dir}")
        try:
            took = cluster.start(
                args.members,
                cluster=args.cluster,
                grid_params=args.grid_params,
                timeout=args.timeout,
                progress=bar.update,
            )
        finally:
            bar.finish()
        print(f"{args.members} members formed one grid in {took:.1f}s")
        print(format_table(cluster.status_rows()))
        return 0
    cluster.require_running()
    if args.action == "scale":
        before = len(cluster.live())
        print(f"scaling from {before} to {args.n} members")

        def say(line: str) -> None:
            bar.finish()
            print(line, flush=True)

        try:
            cluster.scale(args.n, timeout=args.timeout, progress=bar.update, report=say)
        finally:
            bar.finish()
        print(format_table(cluster.status_rows()))
        return 0
    if args.action == "capacity":
        try:
            took, old, moved = cluster.set_capacity(
                args.member, args.capacity, timeout=args.timeout, progress=bar.update
            )
        finally:
            bar.finish()
        was = "" if old is None else f" (was {old:g})"
        if moved:
            print(f"{args.member}: capacity {args.capacity:g}{was}; the grid rebalanced in {took:.1f}s")
        else:
            print(f"{args.member}: capacity {args.capacity:g}{was}; no segments moved (the grid was balanced for it)")
        print(format_table(cluster.status_rows()))
        return 0
    if args.action == "status":
        rows = cluster.status_rows()
        if args.json:
            print(json.dumps(rows, indent=2))
        else:
            print(f"cluster {cluster.cluster} in {cluster.dir}")
            print(format_table(rows))
        return 0
    stopped, killed = cluster.stop()
    print(f"stopped {stopped} members" + (f", killed {killed} that did not stop within 10s" if killed else ""))
    return 0
