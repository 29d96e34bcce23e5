"""``groupcluster demo``: a local data grid scales 3 -> 5 -> 2 members while a writer writes, and loses nothing.

1. Starts 3 grid members on 127.0.0.1 (:class:`~groupcluster.tools.local_cluster.LocalCluster`, ports chosen free).
2. Writes ``--keys`` (100,000) keys of ``--value-size`` bytes in batches (``put_many``, ``POST /v1/batch``).
3. Starts a writer (its own client, in a thread) that keeps writing batches: new keys, and new values for
   keys written in step 2.
4. Scales to 5 members (2 join; their segments move to them), then to 2 (3 leave through ``POST /v1/leave``,
   one at a time because each segment has 2 owners, each after handing its segments off). A progress bar
   shows the rebalance (plain periodic lines when stdout is not a terminal).
5. Stops the writer and reads every key back: the initial ones and every one the writer had acknowledged,
   each of which must hold its last acknowledged value.

The summary ends in exactly the line ``demo: <K> keys, <L> lost``: K distinct keys checked, L of them missing
or holding another value. The exit status is 0 only if L is 0. (A write the grid did *not* acknowledge, e.g.
because the client gave up retrying, may or may not have been applied: either value is accepted for it.)

``groupcluster demo --group`` runs the group-communication demo instead (:mod:`.group_demo`).
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from .group_demo import add_group_arguments
from .local import ProgressBar, format_table
from .local_cluster import LocalCluster, LocalError

LOAD_BATCH = 1000
READ_BATCH = 5000
WRITER_BATCH = 100
WRITER_PAUSE = 0.02  # between writer batches: the rebalance shares a 2-core machine with it
GRID_TIMEOUT = 300.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--keys", type=int, default=100_000, help="keys to write before scaling (default 100000)")
    parser.add_argument("--value-size", type=int, default=100, help="bytes per value (default 100)")
    parser.add_argument("--dir", help="keep the members' state, logs and status files here (default: a temp dir)")
    parser.add_argument("--timeout", type=float, default=None, help="give up on any step after this long")
    parser.add_argument("--group", action="store_true", help="run the group-communication demo instead")
    add_group_arguments(parser.add_argument_group("with --group"))


class DemoError(Exception):
    pass


def _value(i: int, size: int, tag: str) -> bytes:
    head = f"{tag}:{i}:".encode()
    return (head + b"." * size)[:size] if size >= len(head) else head


@dataclass
class Writer:
    """Writes batches until stopped: ``WRITER_BATCH // 2`` new keys and as many overwrites of loaded keys."""

    endpoints: list[str]
    loaded: int
    size: int
    acked: dict[bytes, bytes] = field(default_factory=dict)
    # Keys whose last write was not acknowledged: any of these values (None: absent) is a correct read.
    maybe: dict[bytes, set[bytes | None]] = field(default_factory=dict)
    batches: int = 0
    failed_batches: int = 0
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    stats: dict[str, int] = field(default_factory=dict)

    def run(self) -> None:
        from ..grid.client import GridBatchError, GridClient, GridClientError

        n = 0
        with GridClient(self.endpoints, timeout=120.0, retries=60) as client:
            while not self.stop.is_set():
                items: dict[bytes, bytes] = {}
                for _ in range(WRITER_BATCH // 2):
                    items[f"writer-{n}".encode()] = _value(n, self.size, "w")
                    if self.loaded:
                        # A loaded key gets a new value: the read-back must see the new one, not the loaded one.
                        k = (n * 7919) % self.loaded
                        items[f"key-{k}".encode()] = _value(n, self.size, "o")
                    n += 1
                try:
                    client.put_many(items)
                    failed: dict[bytes, str] = {}
                except GridBatchError as exc:
                    failed = exc.failed
                    self.failed_batches += 1
                    self.errors.append(str(exc))
                except GridClientError as exc:
                    failed = dict.fromkeys(items, str(exc))
                    self.failed_batches += 1
                    self.errors.append(str(exc))
                for key, val in items.items():
                    if key in failed:
                        self.maybe.setdefault(key, set()).add(val)
                    else:
                        self.acked[key] = val
                        self.maybe.pop(key, None)
                self.batches += 1
                self.stop.wait(WRITER_PAUSE)
            self.stats = dict(client.stats)


class GridDemo:
    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        if args.keys < 0:
            raise DemoError(f"--keys: expected 0 or more, got {args.keys}")
        if not 1 <= args.value_size <= 1024 * 1024:
            raise DemoError(f"--value-size: expected 1 to 1048576 bytes, got {args.value_size}")
        self.args = args
        self.timeout = args.timeout or GRID_TIMEOUT
        self.cluster = LocalCluster(workdir)
        self.bar = ProgressBar()
        self.t0 = time.monotonic()
        self.writer: Writer | None = None
        self.writer_thread: threading.Thread | None = None

    def say(self, text: str) -> None:
        self.bar.finish()
        print(f"[{time.monotonic() - self.t0:5.1f}s] {text}", flush=True)

    def progress(self, fraction: float | None, text: str) -> None:
        w = self.writer
        if w is not None:
            text += f" | writer: {len(w.acked):,} keys acknowledged"
        self.bar.update(fraction, text)

    def endpoints(self) -> list[str]:
        return [m.http for m in self.cluster.members]

    def table(self) -> None:
        self.bar.finish()
        for line in format_table(self.cluster.status_rows()).splitlines():
            print("    " + line)

    def run(self) -> int:
        from ..grid.client import GridClient

        args = self.args
        self.say(f"starting 3 grid members on 127.0.0.1 (state and logs in {self.cluster.dir})")
        took = self.cluster.start(3, cluster=f"demo-{id(self) % 100000}", timeout=self.timeout, progress=self.progress)
        self.say(f"3 members formed one grid in {took:.1f}s (256 segments, 2 owners each)")
        self.table()

        client = GridClient(self.endpoints(), timeout=120.0, retries=60)
        t = time.monotonic()
        self.say(f"writing {args.keys:,} keys of {args.value_size} B in batches of {LOAD_BATCH:,}")
        for start in range(0, args.keys, LOAD_BATCH * 5):
            stop = min(args.keys, start + LOAD_BATCH * 5)
            client.put_many({f"key-{i}".encode(): _value(i, args.value_size, "v") for i in range(start, stop)})
            self.bar.update(stop / args.keys, f"{stop:,}/{args.keys:,} keys written")
        dt = max(1e-9, time.monotonic() - t)
        self.say(f"wrote {args.keys:,} keys in {dt:.1f}s ({args.keys / dt:,.0f} keys/s)")
        self.table()

        writer = self.writer = Writer(self.endpoints(), args.keys, args.value_size)
        self.writer_thread = threading.Thread(target=writer.run, name="demo-writer", daemon=True)
        self.writer_thread.start()
        self.say(
            f"a writer keeps writing from now on: batches of {WRITER_BATCH // 2} new keys "
            f"and {WRITER_BATCH // 2} new values for loaded keys"
        )
        timings = {}
        for target in (5, 2):
            before = len(self.cluster.members)
            how = "members join" if target > before else "members leave one at a time, each after handing off"
            self.say(f"scaling {before} -> {target} ({how})")
            t = time.monotonic()
            self.cluster.scale(
                target, timeout=self.timeout, progress=self.progress, report=lambda line: self.say(f"  {line}")
            )
            timings[f"{before}->{target}"] = time.monotonic() - t
            self.say(f"scaled to {target} members in {timings[f'{before}->{target}']:.1f}s")
            self.table()

        writer.stop.set()
        self.writer_thread.join(timeout=180)
        if self.writer_thread.is_alive():
            raise DemoError("the writer did not stop within 180s")
        self.writer = None
        self.say(
            f"writer stopped: {writer.batches:,} batches, {len(writer.acked):,} keys acknowledged"
            + (f", {writer.failed_batches} batches not fully acknowledged" if writer.failed_batches else "")
            + f"; client {writer.stats}"
        )

        expected: dict[bytes, bytes] = {f"key-{i}".encode(): _value(i, args.value_size, "v") for i in range(args.keys)}
        maybe: dict[bytes, set[bytes | None]] = {}
        for k, vals in writer.maybe.items():
            if k in expected or k in writer.acked:
                maybe[k] = set(vals)
        expected.update(writer.acked)

        self.say(
            f"reading every key back: {len(expected):,} keys "
            f"({args.keys:,} loaded, {len(writer.acked):,} by the writer)"
        )
        client.refresh()
        missing = wrong = 0
        examples: list[str] = []
        keys = list(expected)
        done = 0
        for chunk in _chunks(keys, READ_BATCH):
            got = client.get_many(chunk)
            for k in chunk:
                v = got[k]
                if v == expected[k] or v in maybe.get(k, ()):
                    continue
                if v is None:
                    missing += 1
                else:
                    wrong += 1
                if len(examples) < 5:
                    examples.append(f"{k!r}: read {v!r:.40}, expected {expected[k]!r:.40}")
            done += len(chunk)
            self.bar.update(done / len(keys), f"{done:,}/{len(keys):,} keys read")
        client.close()
        lost = missing + wrong
        self.bar.finish()

        print()
        print("Summary")
        print(
            f"  members: 3 -> 5 in {timings['3->5']:.1f}s, 5 -> 2 in {timings['5->2']:.1f}s; "
            f"total {time.monotonic() - self.t0:.1f}s"
        )
        print(
            f"  keys: {args.keys:,} loaded, {len(writer.acked):,} written during the scaling, "
            f"{len(expected):,} distinct"
        )
        if maybe:
            print(f"  {len(maybe)} writes were not acknowledged (either value accepted)")
        print(f"  read back: {len(expected) - lost:,} correct, {missing:,} missing, {wrong:,} with another value")
        for e in examples:
            print(f"    e.g. {e}")
        print(f"demo: {len(expected)} keys, {lost} lost", flush=True)
        return 0 if lost == 0 else 1

    def shutdown(self) -> None:
        if self.writer is not None:
            self.writer.stop.set()
        if self.writer_thread is not None:
            self.writer_thread.join(timeout=10)
        self.bar.finish()
        try:
            self.cluster.stop(grace=5.0)
        finally:
            self.cluster.kill_all()


def _chunks(items: list[bytes], n: int) -> Iterator[list[bytes]]:
    for i in range(0, len(items), n):
        yield items[i : i + n]


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    if args.group:
        from . import group_demo

        return group_demo.run(args)
    workdir = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="groupcluster-demo-"))
    try:
        demo = GridDemo(args, workdir)
    except DemoError as exc:
        print(f"groupcluster demo: error: {exc}", file=sys.stderr)
        return 2
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    code = 1
    try:
        code = demo.run()
    except (DemoError, LocalError) as exc:
        demo.bar.finish()
        print(f"demo: failed: {exc}", flush=True)
    except KeyboardInterrupt:
        demo.bar.finish()
        print("demo: interrupted; stopping the members", flush=True)
        code = 130
    except Exception as exc:  # a client error after its retries: report it, never leave members behind
        demo.bar.finish()
        print(f"demo: failed: {type(exc).__name__}: {exc}", flush=True)
    finally:
        demo.shutdown()
        signal.signal(signal.SIGTERM, previous)
        if not args.dir and code == 0:
            shutil.rmtree(workdir, ignore_errors=True)
        elif not args.dir:
            print(f"demo: logs and status files kept in {workdir}", flush=True)
    return code


__all__ = ["GridDemo", "add_arguments", "run"]
