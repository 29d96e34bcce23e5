"""``groupcluster bench --suite peers``: our stack and its peers on the same workloads, in one invocation.

    groupcluster bench --suite peers --quick                 # headline workloads, a short smoke run
    groupcluster bench --suite peers --out docs/benchmarks   # everything; table, JSON and PNGs
    groupcluster bench --suite peers --workloads 'fifo-*' --systems groupcluster,raw-asyncio --json
    groupcluster bench --list

The multicast and counter workloads keep every system's member processes up for the whole workload and run
``--warmup`` discarded rounds, then ``--repeat`` measured rounds, systems interleaved round by round
(:mod:`groupcluster.bench.fair`); each figure is the median of the measured rounds, with their spread and the
CPU time (user+sys of all member processes) per delivered message. The grid workloads interleave our grid,
Infinispan and Hazelcast run by run after a warm-up of their own (:mod:`groupcluster.bench.gridpeers_run`),
with the members' CPU per MB moved or per operation. Progress goes to stderr; stdout gets the table, or with
``--json`` one JSON object whose ``results`` entries carry ``workload``, ``system``, ``value`` (the median),
``unit``, ``spread``, ``cpu_us_per_message`` (multicast) and ``cpu`` / ``cpu_unit`` (grid), and whose
``by_workload`` has the same per workload and system. Systems that cannot run (a missing JDK, say) are
reported and skipped, and the exit status is then 1.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import compiled
from .fair import by_workload
from .model import (
    LIFECYCLE_KINDS,
    OPTIONAL_WORKLOADS,
    QUICK_WORKLOADS,
    REBALANCE_ENTRIES,
    SYSTEMS,
    WORKLOADS,
    Result,
    environment,
    format_table,
    select,
    to_json,
    with_peaks,
)


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--suite", choices=("peers",), default="peers", help="benchmark suite (default peers)")
    parser.add_argument("--quick", action="store_true", help="headline workloads, 1 run each, fewer messages")
    parser.add_argument("--workloads", type=_csv, metavar="PATTERNS", help="comma-separated names or globs")
    parser.add_argument("--systems", type=_csv, metavar="PATTERNS", help=f"comma-separated of {', '.join(SYSTEMS)}")
    parser.add_argument(
        "--repeat", type=int, help="measured rounds (multicast) or runs (lifecycle) per figure; median (default 5)"
    )
    parser.add_argument("--warmup", type=int, help="discarded rounds before them, same processes (default 2)")
    parser.add_argument("--messages", type=int, help="messages per sender when all send (default 200000)")
    parser.add_argument("--counter-ops", type=int, help="increments per node and round, counter (default 50000)")
    parser.add_argument("--mperf-seconds", type=int, help="length of a round of JGroups' MPerf (default 20)")
    parser.add_argument(
        "--jgroups-threads", type=int, help="threads sending each JGroups member's unpaced messages (default 8)"
    )
    parser.add_argument("--latency-seconds", type=float, help="length of a paced latency run (default 4, quick 2)")
    parser.add_argument("--join-rounds", type=int, help="joins per run of join-4 / join-flush-4 (default 3, quick 2)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument(
        "--out",
        metavar="DIR",
        help="also write DIR/results.json and DIR/results.txt (after every workload, so an interrupted run keeps "
        "what it finished) and PNG plots at the end",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="with --out: keep the workloads DIR/results.json already holds (same settings only) and run the rest",
    )
    parser.add_argument("--list", action="store_true", help="list the workloads and their systems, then exit")


def _settings(args: argparse.Namespace) -> Any:
    from .runner import Settings

    s = Settings()
    if args.quick:
        s.repeat, s.warmup, s.messages, s.counter_ops, s.latency_seconds = 2, 1, 20000, 5000, 2.0
        s.join_rounds, s.grid_single_ops, s.grid_batch_ops, s.mperf_seconds = 2, 500, 10000, 3
        s.join_warm_rounds, s.state_repeat, s.grid_entries = 3, 3, 50_000
    names = ("repeat", "warmup", "messages", "counter_ops", "latency_seconds", "join_rounds", "mperf_seconds")
    for name in (*names, "jgroups_threads"):
        value = getattr(args, name)
        if value is not None:
            if value <= 0 and not (name == "warmup" and value == 0):
                raise SystemExit(f"groupcluster bench: --{name.replace('_', '-')} must be positive")
            setattr(s, name, value)
    return s


def _chosen(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """The workloads and systems the arguments name (every one by default, the quick set with --quick)."""
    patterns = args.workloads or (list(QUICK_WORKLOADS) if args.quick else ["*"])
    names = with_peaks(select(patterns, WORKLOADS))
    if not args.workloads:  # the 100 MB and 1 GB states run only when named
        names = [n for n in names if n not in select(OPTIONAL_WORKLOADS, WORKLOADS)]
    if not names:
        raise SystemExit(f"groupcluster bench: no workload matches {patterns}; see --list")
    systems = select(args.systems, SYSTEMS) if args.systems else list(SYSTEMS)
    if args.systems and not systems:
        raise SystemExit(f"groupcluster bench: no system matches {args.systems}; allowed: {', '.join(SYSTEMS)}")
    return names, systems


def _settings_doc(settings: Any, runner: Any, names: list[str], systems: list[str]) -> dict[str, Any]:
    """The settings a results document records (and a resumed run must share)."""
    return {
        "repeat": settings.repeat,
        "warmup_rounds": settings.warmup,
        "messages_per_sender": settings.messages,
        "counter_ops_per_node": settings.counter_ops,
        "counter_window": settings.counter_window,
        "raw_factor": settings.raw_factor,
        "mperf_seconds": settings.mperf_seconds,
        "jgroups_threads": settings.jgroups_threads,
        "tcp_bundler_capacity": settings.tcp_bundler_capacity,
        "jgroups_configs": runner.config_diffs,
        "latency_seconds": settings.latency_seconds,
        "join_rounds": settings.join_rounds,
        "rebalance_idle_seconds": settings.rebalance_idle_seconds,
        "grid_rebalance_entries": settings.grid_entries or REBALANCE_ENTRIES,
        "grid_single_ops_per_client": settings.grid_single_ops,
        "grid_batch_ops_per_client": settings.grid_batch_ops,
        "workloads": names,
        "systems": systems,
    }


# What a resumed run may differ in from the one it resumes; every other setting must match, or the rows would
# not be comparable.
_RESUME_MAY_DIFFER = ("jgroups_configs", "workloads", "systems")


def _resumed(path: Path, settings: dict[str, Any]) -> tuple[list[Result], list[dict[str, Any]]]:
    """The results and invocations of an earlier run of the same settings, or SystemExit saying why not."""
    try:
        doc = json.loads(path.read_text())
        kept = [Result(**entry) for entry in doc["results"]]
        before = doc["settings"]
        invocations = list(doc["environment"].get("invocations") or [])
    except FileNotFoundError:
        return [], []
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(f"groupcluster bench: --resume: cannot read {path}: {exc!r}") from None
    differ = [k for k in settings if k not in _RESUME_MAY_DIFFER and before.get(k) != settings.get(k)]
    if differ:
        pairs = ", ".join(f"{k} {before.get(k)!r} there, {settings.get(k)!r} here" for k in differ)
        raise SystemExit(f"groupcluster bench: --resume: {path} was measured with other settings: {pairs}")
    if not invocations:
        invocations = [{"started": doc["environment"].get("date"), "workloads": sorted({r.workload for r in kept})}]
    return kept, invocations


def _measure(
    runner: Any,
    w: Any,
    systems: list[str],
    results: list[Result],
    failures: list[str],
    progress: Callable[[str], None],
) -> None:
    """Run one workload on the chosen systems (interleaved rounds, or one system after another)."""
    if w.kind not in LIFECYCLE_KINDS:
        done, failed = runner.measure_interleaved(w, [x for x in w.systems if x in systems])
        results.extend(done)
        failures.extend(failed)
        return
    for system in w.systems:
        if system not in systems:
            continue
        try:
            results.extend(runner.measure(system, w))
        except Exception as exc:  # one peer failing must not lose the others' figures
            failures.append(f"{w.name} / {system}: {exc}")
            progress(f"  {w.name:<24} {system:<18} FAILED: {exc}")


def _plots(doc: dict[str, Any], out: Path, failures: list[str], progress: Callable[[str], None]) -> None:
    try:
        from .plots import write_plots

        for path in write_plots(doc, out):
            progress(f"  wrote {path}")
    except ImportError:
        failures.append("plots: matplotlib is missing (pip install 'groupcluster[bench]')")
        progress("  no plots: matplotlib is missing (pip install 'groupcluster[bench]')")


def run(args: argparse.Namespace) -> int:
    if args.list:
        for w in WORKLOADS.values():
            print(f"{w.name:<36} {w.unit:<17} {w.description}; systems: {', '.join(w.systems)}")
        return 0
    names, systems = _chosen(args)
    all_names = list(names)

    from .runner import Runner

    settings = _settings(args)

    def progress(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    started = datetime.datetime.now(datetime.UTC)
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    progress(f"bench peers: {len(names)} workloads, systems {', '.join(systems)}; {settings.repeat} run(s) each")
    if load is not None:
        progress(f"  load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores")
    # SIGTERM unwinds like Ctrl-C, so the runner's cleanup kills the member processes of the current run.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    settings.systems = tuple(systems)  # the grid workloads interleave the chosen systems run by run
    runner = Runner(settings, progress)
    results: list[Result] = []
    failures: list[str] = []
    out = Path(args.out) if args.out else None
    invocations: list[dict[str, Any]] = []
    if args.resume:
        if out is None:
            raise SystemExit("groupcluster bench: --resume needs --out DIR (the run to resume)")
        results, invocations = _resumed(out / "results.json", _settings_doc(settings, runner, names, systems))
        done = {r.workload for r in results}
        for r in results:  # the latency workloads pace against peaks measured before
            runner.peaks[(r.workload, r.system)] = r.value
        progress(f"  resumed: {len(done)} workloads kept from {out / 'results.json'}")
        names = [n for n in names if n not in done]
    invocations.append({"started": started.strftime("%Y-%m-%d %H:%M UTC"), "workloads": list(names)})

    def document() -> dict[str, Any]:
        elapsed = (datetime.datetime.now(datetime.UTC) - started).total_seconds()
        env = environment(started.strftime("%Y-%m-%d %H:%M UTC"), load, os.cpu_count())
        env["minutes"] = round(elapsed / 60, 1)
        env["loadavg_at_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
        env["invocations"] = invocations
        env["groupcluster_modules"] = compiled.status().describe()
        doc = to_json(results, env, _settings_doc(settings, runner, all_names, systems))
        doc["by_workload"] = by_workload(results)
        doc["failures"] = failures
        doc["workloads_done"] = sorted({r.workload for r in results})
        doc["complete"] = False
        return doc

    def save(doc: dict[str, Any]) -> None:
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            (out / "results.json").write_text(json.dumps(doc, indent=2) + "\n")
            (out / "results.txt").write_text(format_table(results) + "\n")

    for name in names:
        _measure(runner, WORKLOADS[name], systems, results, failures, progress)
        save(document())
    elapsed = (datetime.datetime.now(datetime.UTC) - started).total_seconds()
    progress(f"bench peers: {len(results)} results, {len(failures)} failures in {elapsed / 60:.1f} minutes")
    doc = document()
    doc["complete"] = True
    table = format_table(results)
    if out is not None:
        save(doc)
        _plots(doc, out, failures, progress)
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(table)
        for f in failures:
            print(f"failed: {f}")
    return 1 if failures else 0
