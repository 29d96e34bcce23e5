"""Rebalance benchmark: a 4th member joins a 3-member grid holding 1,000,000 entries of 100 B, under writes.

    .venv/bin/python bench/grid_rebalance.py [--entries 1000000] [--value-size 100] [--write-rate 200]
        [--idle-seconds 10] [--joins 5] [--pause-seconds 3] [--grid-set KEY=VALUE ...] [--member-args ARGS]
        [--profile DIR] [--json]

1. Starts 3 members (``groupcluster local`` machinery, 127.0.0.1, a temporary directory) and loads
   ``--entries`` entries through ``put_many`` (batched).
2. A writer *process* starts single PUTs (one at a time, ``--write-rate`` per second, 100-byte values) and
   records when each started and how long it took.
3. After ``--idle-seconds`` of writes on the idle grid, a 4th member starts. The rebalance runs from the
   joiner's first view until every member is back to a balanced ``NO_REBALANCE`` topology: the time the last
   member installed it (``topology_installed_at`` in ``/v1/status``), not the status poll that saw it.
4. ``--joins N`` (default 5) repeats step 3 on the same grid: the 4th member leaves (``groupcluster local
   scale 3``), the grid settles and frees what it handed off (``--pause-seconds``), and a new 4th member
   joins. Only the joins are measured. One 1-second move at 200 writes/s gives about 210 writes, so its p99
   is its 3rd-slowest write, which varied by about 1x idle between runs of the same code; the figures pool
   the writes of all joins (5 joins: the 11th-slowest of about 1,050) and each join is listed too.
5. Reported: entries and MB moved per join (the members' ``rebalance_*_received_total`` counters, summed; key
   and value bytes), entries/s and MB/s over the joins' rebalances, and the writer's latency p50/p99 on the
   idle grid (before the first join) against during the rebalances. The goals it is read against: >= 50 MB/s moved,
   p99 during <= 3x idle.
6. Also reported: the CPU time spent from each join to the end of its rebalance, per MB moved: the joiner's,
   the three old members' together, the writer's, and the whole machine's (``/proc/stat``: every process and
   the kernel's network work), with the share of the machine's cores that was busy and the share its host
   stole (a virtual machine's cores running someone else's work: a run with much of it is not comparable);
   ``--json`` gives the stolen time per MB too (``stolen_ms_per_mb``): a process's own CPU time may include
   stretches when its core was stolen, so the processes' figures can add up to more than the machine's busy
   time, never to more than busy plus stolen.
   Write latency during a move follows how busy the machine is, so this says what a change saved where, apart
   from the noise of the p99 of ~200 writes.

``--profile DIR`` (py-spy, from the ``bench`` extra) runs ``py-spy record`` on the joiner and on one source
member during the first join's rebalance, writes their collapsed stacks there (``joiner-m4.txt``,
``source-m1.txt``: input for flamegraph.pl or speedscope) and prints the functions with the most samples.
``--grid-set`` passes a grid parameter to every member (e.g. ``transfer_batch_bytes=1MiB``) to compare settings;
``--member-args`` passes more member arguments (e.g. ``'--transport tcp --set frag.frag_size=1MiB'``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from groupcluster.grid.client import GridClient
from groupcluster.tools.local import ProgressBar
from groupcluster.tools.local_cluster import LocalCluster

ENTRIES_RECEIVED = "groupcluster_grid_rebalance_entries_received_total"
BYTES_RECEIVED = "groupcluster_grid_rebalance_bytes_received_total"


def metric_sum(urls: list[str], name: str) -> float:
    total = 0.0
    for u in urls:
        with urllib.request.urlopen(u + "/metrics", timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " "):
                    total += float(line.split()[1])
    return total


def writer(urls: list[str], rate: float, size: int, stop: Any, out: Any) -> None:
    """Single PUTs at ``rate`` per second, one at a time; sends [(start wall time, seconds, ok), ...] at the end."""
    samples: list[tuple[float, float, bool]] = []
    value = os.urandom(size)
    rng = random.Random(1)
    parent = os.getppid()
    with GridClient(urls, timeout=60.0, retries=40) as c:
        next_at = time.monotonic()
        # Also stop if the bench itself is gone (killed, e.g. by a test's timeout): this process would otherwise
        # write on forever.
        while not stop.is_set() and os.getppid() == parent:
            now = time.monotonic()
            if now < next_at:
                time.sleep(next_at - now)
            next_at += 1.0 / rate
            key = f"lat-{rng.randrange(10_000)}".encode()
            t0 = time.time()
            p0 = time.perf_counter()
            ok = True
            try:
                c.put(key, value)
            except Exception:
                ok = False
            samples.append((t0, time.perf_counter() - p0, ok))
    out.send(samples)


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] * 1000 if xs else float("nan")


@dataclass
class JoinRound:
    """One measured join: wall-clock times (``time.time()``), what moved, and the stages the status showed."""

    joiner: str
    t_spawn: float
    t_joined: float
    t_done: float
    entries: float
    nbytes: float
    stages: list[tuple[float, str]] = field(default_factory=list)
    # CPU seconds used from the join until the status poll saw the grid settled (at most 0.25 s after the
    # rebalance ended): the joiner, the old members together, the writer process, and the whole machine (busy,
    # available and stolen by the host, all cores; busy includes the kernel's network work).
    cpu_joiner: float = 0.0
    cpu_old: float = 0.0
    cpu_writer: float = 0.0
    cpu_machine: tuple[float, float, float] = (0.0, 0.0, 0.0)

    @property
    def seconds(self) -> float:
        return max(1e-9, self.t_done - self.t_joined)


_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time a process used so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime (fields 14 and 15 of proc(5))


def machine_cpu() -> tuple[float, float, float]:
    """(busy, total, stolen) CPU seconds of the whole machine since boot, all cores (``/proc/stat``).

    Stolen time is when a virtual machine's cores wanted to run but its host ran something else: it is not
    ours, so it is not busy time, but a run with much of it was slowed by its neighbours."""
    user, nice, system, idle, iowait, irq, softirq, steal = (
        int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
    )
    busy = user + nice + system + irq + softirq  # guest time is counted in user already
    return busy / _TICK, (busy + idle + iowait + steal) / _TICK, steal / _TICK


def cpu_sample(joiner: int, old: list[int], writer: int) -> tuple[float, ...]:
    """CPU seconds so far: the joiner, the old members together, the writer, then :func:`machine_cpu`'s three."""
    return (cpu_seconds(joiner), sum(map(cpu_seconds, old)), cpu_seconds(writer), *machine_cpu())


def py_spy() -> str:
    """The py-spy executable (on PATH or beside this Python), or ``""`` when neither has it."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    return spy if os.access(spy, os.X_OK) else ""


def join_once(cluster: LocalCluster, bar: ProgressBar, profile: str | None, writer_pid: int) -> JoinRound:
    """Start a 4th member and wait until the grid is balanced again; ``profile``: py-spy both sides into it."""
    old = [m.pid for m in cluster.members]
    urls = [m.http for m in cluster.members]
    before_entries = metric_sum(urls, ENTRIES_RECEIVED)
    before_bytes = metric_sum(urls, BYTES_RECEIVED)
    # What `groupcluster local scale 4` does, with the join time observed here.
    new, t_spawn, t_joined = cluster.spawn_and_wait_joined()
    cpu0 = cpu_sample(new.pid, old, writer_pid)
    spies: list[subprocess.Popen[bytes]] = []
    if profile:
        out = Path(profile)
        out.mkdir(parents=True, exist_ok=True)
        spy = py_spy()
        for role, m in (("joiner", new), ("source", cluster.members[0])):
            argv = [spy, "record", "-p", str(m.pid), "-o", str(out / f"{role}-{m.name}.txt"), "-f", "raw"]
            spies.append(subprocess.Popen([*argv, "-r", "100"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
    stages: list[tuple[float, str]] = []

    def watch(fraction: float | None, text: str) -> None:
        stage = " ".join(text.split(" (")[0].split(" ")[0:3])
        if not stages or stages[-1][1] != stage:
            stages.append((time.time(), stage))
        bar.update(fraction, text)

    try:
        cluster.wait_settled("the rebalance", 900, watch)
        t_settled = time.time()
        cpu1 = cpu_sample(new.pid, old, writer_pid)
        bar.finish()
        # The rebalance ended when the last member installed the final balanced topology; the members report
        # that time, so the result does not depend on how often the status was polled (every 0.25 s).
        statuses = cluster.statuses().values()
        installed = [((st or {}).get("grid") or {}).get("topology_installed_at") for st in statuses]
        t_done = max((t for t in installed if t), default=t_settled)
    finally:
        for s in spies:
            s.send_signal(2)  # SIGINT: py-spy writes its profile and exits
        for s in spies:
            try:
                s.wait(timeout=30)
            except subprocess.TimeoutExpired:
                s.kill()
    all_urls = [m.http for m in cluster.members]
    joiner_s, old_s, writer_s, *machine = (b - a for a, b in zip(cpu0, cpu1, strict=True))
    return JoinRound(
        joiner=new.name,
        t_spawn=t_spawn,
        t_joined=t_joined,
        t_done=t_done,
        entries=metric_sum(all_urls, ENTRIES_RECEIVED) - before_entries,
        nbytes=metric_sum(all_urls, BYTES_RECEIVED) - before_bytes,
        stages=stages,
        cpu_joiner=joiner_s,
        cpu_old=old_s,
        cpu_writer=writer_s,
        cpu_machine=(machine[0], machine[1], machine[2]),
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=1_000_000)
    ap.add_argument("--value-size", type=int, default=100)
    ap.add_argument("--write-rate", type=float, default=200.0, help="single PUTs per second during the run")
    ap.add_argument("--idle-seconds", type=float, default=10.0)
    ap.add_argument("--joins", type=int, default=5, help="4th members joining one after another (pooled figures)")
    ap.add_argument("--pause-seconds", type=float, default=3.0, help="idle time after a leave, before a join")
    ap.add_argument("--grid-set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument(
        "--member-args",
        default="",
        metavar="ARGS",
        help="more arguments for every member, one string (e.g. '--transport tcp --set frag.frag_size=1MiB')",
    )
    ap.add_argument("--profile", metavar="DIR", help="py-spy profiles of the joiner and a source member")
    ap.add_argument("--keep", action="store_true", help="keep the members' directory (logs)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.joins < 1:
        ap.error("--joins must be at least 1")
    if args.profile and not py_spy():
        # Checked before the grid is loaded (half a minute), not when the first join wants it.
        ap.error("--profile needs py-spy, which is in the bench extra: .venv/bin/pip install -e '.[bench]'")

    work = Path(tempfile.mkdtemp(prefix="grid-rebalance-"))
    cluster = LocalCluster(work)
    cluster.member_args = shlex.split(args.member_args)
    bar = ProgressBar(sys.stderr)
    stop = mp.Event()
    parent, child = mp.Pipe(duplex=False)
    proc: mp.Process | None = None
    rounds: list[JoinRound] = []
    try:
        cluster.start(3, grid_params=args.grid_set, progress=bar.update)
        bar.finish()
        urls = [m.http for m in cluster.members]
        t = time.monotonic()
        value = b"v" * args.value_size
        step = 50_000
        with GridClient(urls, timeout=120.0, batch_size=2000) as c:
            for start in range(0, args.entries, step):
                end = min(args.entries, start + step)
                c.put_many({f"bulk-{i:07d}".encode(): value for i in range(start, end)})
                bar.update(end / args.entries, f"loading {end:,}/{args.entries:,} entries")
        load_s = time.monotonic() - t
        bar.finish(f"loaded {args.entries:,} entries of {args.value_size} B in {load_s:.1f}s")

        # The writer talks to the 3 first members only: they stay for the whole run.
        proc = mp.Process(target=writer, args=(urls, args.write_rate, args.value_size, stop, child), daemon=True)
        proc.start()
        time.sleep(args.idle_seconds)
        for n in range(args.joins):
            if n:
                # The newest member leaves (`groupcluster local scale 3`), the grid settles back to 3 members
                # holding everything, and the old owners free what they handed off before the next join.
                cluster.scale(3, progress=bar.update)
                bar.finish()
                time.sleep(args.pause_seconds)
            rounds.append(join_once(cluster, bar, args.profile if n == 0 else None, proc.pid or 0))
        time.sleep(2.0)  # some writes after the rebalance too
        transports = member_transports(cluster)
        stop.set()
        samples: list[tuple[float, float, bool]] = parent.recv()
        proc.join(timeout=30)
    finally:
        stop.set()
        cluster.stop(grace=5.0)
        cluster.kill_all()
        if proc is not None and proc.is_alive():
            proc.kill()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    res = results(args, load_s, rounds, samples)
    res["transports"] = transports
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    print_report(args, res)
    return 0


def member_transports(cluster: LocalCluster) -> list[str]:
    """The transports the members report in their status files (what ``--member-args`` may have changed)."""
    seen: set[str] = set()
    for m in cluster.members:
        try:
            seen.add(str(json.loads((cluster.dir / f"{m.name}.status.json").read_text()).get("transport")))
        except (OSError, ValueError):
            seen.add("unknown")
    return sorted(seen)


def results(args: argparse.Namespace, load_s: float, rounds: list[JoinRound], samples: list[Any]) -> dict[str, Any]:
    """The figures of a run: pooled over the joins, and per join."""
    ok = [(t0, d) for t0, d, good in samples if good]
    idle = [d for t0, d in ok if t0 < rounds[0].t_spawn]
    per_join = []
    during: list[float] = []
    for r in rounds:
        lat = [d for t0, d in ok if r.t_joined <= t0 <= r.t_done]
        during += lat
        # Where the slow writes are: per 0.5 s from the join, writes started, their slowest, and the stage seen.
        timeline = []
        for b in range(int(r.seconds / 0.5) + 3):
            lo = r.t_joined + b * 0.5
            in_bucket = [d for t0, d in ok if lo <= t0 < lo + 0.5]
            stage = next((st for ts, st in reversed(r.stages) if ts <= lo + 0.5), "joining")
            timeline.append(
                {
                    "t": round(b * 0.5, 1),
                    "writes": len(in_bucket),
                    "max_ms": round(max(in_bucket, default=0) * 1000, 1),
                    "stage": stage,
                }
            )
        per_join.append(
            {
                "joiner": r.joiner,
                "seconds_from_join": round(r.seconds, 2),
                "seconds_from_start": round(r.t_done - r.t_spawn, 2),
                "entries_moved": int(r.entries),
                "mb_per_s": round(r.nbytes / 1e6 / r.seconds, 2),
                "writes_during": len(lat),
                "during_p50_ms": round(pct(lat, 50), 2),
                "during_p99_ms": round(pct(lat, 99), 2),
                "p99_ratio": round(pct(lat, 99) / pct(idle, 99), 2) if idle and lat else None,
                "cpu_ms_per_mb": cpu_per_mb([r]),
                **machine_shares([r]),
                "timeline": timeline,
            }
        )
    seconds = sum(r.seconds for r in rounds)
    n = len(rounds)
    res: dict[str, Any] = {
        "entries_loaded": args.entries,
        "value_size": args.value_size,
        "load_seconds": round(load_s, 2),
        "load_entries_per_s": round(args.entries / load_s),
        "joins": n,
        # Per join, averaged over the joins.
        "rebalance_seconds_from_join": round(seconds / n, 2),
        "rebalance_seconds_from_start": round(sum(r.t_done - r.t_spawn for r in rounds) / n, 2),
        "entries_moved": int(sum(r.entries for r in rounds) / n),
        "mb_moved": round(sum(r.nbytes for r in rounds) / n / 1e6, 2),
        # Over all joins' rebalances together.
        "entries_per_s": round(sum(r.entries for r in rounds) / seconds),
        "mb_per_s": round(sum(r.nbytes for r in rounds) / 1e6 / seconds, 2),
        "write_rate": args.write_rate,
        "writes_idle": len(idle),
        "writes_during": len(during),
        "writes_failed": sum(1 for _, _, good in samples if not good),
        "idle_p50_ms": round(pct(idle, 50), 2),
        "idle_p99_ms": round(pct(idle, 99), 2),
        "during_p50_ms": round(pct(during, 50), 2),
        "during_p99_ms": round(pct(during, 99), 2),
        "cpu_ms_per_mb": cpu_per_mb(rounds),
        # The host's stolen time per MB, apart from "machine" (busy time only): a process's own CPU time may
        # include stretches when its core was stolen, so only busy plus stolen bounds what the processes report.
        "stolen_ms_per_mb": round(
            sum(r.cpu_machine[2] for r in rounds) * 1000 / max(1e-9, sum(r.nbytes for r in rounds) / 1e6), 1
        ),
        **machine_shares(rounds),
        "grid_set": args.grid_set,
        "member_args": shlex.split(args.member_args),
        "per_join": per_join,
    }
    res["p99_ratio"] = round(res["during_p99_ms"] / res["idle_p99_ms"], 2) if idle and during else None
    return res


def cpu_per_mb(rounds: list[JoinRound]) -> dict[str, float]:
    """CPU milliseconds per MB moved, by who spent them, over ``rounds``."""
    mb = max(1e-9, sum(r.nbytes for r in rounds) / 1e6)
    return {
        "joiner": round(sum(r.cpu_joiner for r in rounds) * 1000 / mb, 1),
        "old_members": round(sum(r.cpu_old for r in rounds) * 1000 / mb, 1),
        "writer": round(sum(r.cpu_writer for r in rounds) * 1000 / mb, 1),
        "machine": round(sum(r.cpu_machine[0] for r in rounds) * 1000 / mb, 1),
    }


def machine_shares(rounds: list[JoinRound]) -> dict[str, float]:
    """The shares of the machine's cores busy and stolen by the host during ``rounds``."""
    available = max(1e-9, sum(r.cpu_machine[1] for r in rounds))
    return {
        "machine_busy": round(sum(r.cpu_machine[0] for r in rounds) / available, 2),
        "machine_stolen": round(sum(r.cpu_machine[2] for r in rounds) / available, 2),
    }


def print_report(args: argparse.Namespace, res: dict[str, Any]) -> None:
    settings = [f"transport {'/'.join(res['transports'])}", *res["grid_set"]]
    if res["member_args"]:
        settings.append(f"member arguments {' '.join(res['member_args'])}")
    print("members: " + ", ".join(settings))
    print(
        f"loaded {args.entries:,} entries of {args.value_size} B into 3 members in {res['load_seconds']:.1f}s "
        f"({res['load_entries_per_s']:,} entries/s)"
    )
    print(
        f"{res['joins']} joins of a 4th member: {res['entries_moved']:,} entries, {res['mb_moved']:.1f} MB moved "
        f"per join in {res['rebalance_seconds_from_join']:.2f}s after its join "
        f"({res['rebalance_seconds_from_start']:.2f}s from process start): "
        f"{res['entries_per_s']:,} entries/s, {res['mb_per_s']:.1f} MB/s (target >= 50 MB/s)"
    )
    print(
        f"single PUTs at {args.write_rate:g}/s: idle p50 {res['idle_p50_ms']:.1f} ms p99 {res['idle_p99_ms']:.1f} ms "
        f"({res['writes_idle']} writes); during the rebalances p50 {res['during_p50_ms']:.1f} ms "
        f"p99 {res['during_p99_ms']:.1f} ms ({res['writes_during']} writes); p99 ratio {res['p99_ratio']} "
        f"(target <= 3); {res['writes_failed']} failed"
    )
    cpu = res["cpu_ms_per_mb"]
    print(
        f"CPU per MB moved: joiner {cpu['joiner']:.1f} ms, the 3 old members {cpu['old_members']:.1f} ms, "
        f"writer {cpu['writer']:.1f} ms; whole machine {cpu['machine']:.1f} ms "
        f"({res['machine_busy']:.0%} of its {os.cpu_count()} cores busy during the moves, "
        f"{res['machine_stolen']:.0%} stolen by the host)"
    )
    for i, j in enumerate(res["per_join"], 1):
        slow = " ".join(f"{row['max_ms']:.1f}" for row in j["timeline"])
        print(
            f"  join {i} ({j['joiner']}): {j['seconds_from_join']:.2f}s, {j['mb_per_s']:.1f} MB/s, "
            f"p50 {j['during_p50_ms']:.1f} ms p99 {j['during_p99_ms']:.1f} ms ({j['writes_during']} writes), "
            f"ratio {j['p99_ratio']}, machine {j['machine_busy']:.0%} busy, {j['machine_stolen']:.0%} stolen; "
            "slowest write per 0.5 s from the join: "
            f"{slow} ms"
        )
    if args.profile:
        for f in sorted(Path(args.profile).glob("*.txt")):
            print(f"\nprofile {f} (share of busy samples: own time / with callees):")
            for line in top_functions(f):
                print("  " + line)


def top_functions(path: Path, n: int = 15) -> list[str]:
    """The functions with the most samples in a py-spy raw (collapsed) profile; idle waiting left out."""
    own: dict[str, int] = {}
    total: dict[str, int] = {}
    samples = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        frames = stack.split(";")
        if "select (selectors.py" in frames[-1]:
            continue  # the event loop waiting for I/O
        c = int(count)
        samples += c
        own[frames[-1]] = own.get(frames[-1], 0) + c
        for f in set(frames):
            total[f] = total.get(f, 0) + c
    if not samples:
        return ["(no samples)"]
    out = [f"{samples} busy samples"]
    for f, c in sorted(own.items(), key=lambda kv: -kv[1])[:n]:
        out.append(f"{c / samples * 100:5.1f}% / {total[f] / samples * 100:5.1f}%  {f}")
    return out


if __name__ == "__main__":
    sys.exit(main())
