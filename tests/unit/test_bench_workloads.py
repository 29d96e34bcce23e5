"""The join, state-transfer and grid workloads of the peers suite: their pure parts.

What the scripts and the JGroups Lifecycle harness print is turned into figures here (parsing, medians, units,
errors that name the missing figure), the workloads' commands are built without running anything, and the
plots group the new results. No benchmark runs here: figures are measured by ``groupcluster bench``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from groupcluster.bench import figures, model
from groupcluster.bench.jgroups import CONFIGS, JavaPeer, harness_dir
from groupcluster.bench.lifecycle import JAVA_CONFIGS, LifecycleRunner, bench_dir
from groupcluster.bench.plots import FIGURES, panels
from groupcluster.bench.runner import Settings

W = model.WORKLOADS

# What the scripts print with --json (shapes copied from real runs, values invented).
JOIN_DOC = {
    "stack": "vsync",
    "transport": "tcp",
    "members_before": 3,
    "rounds": 3,
    "join_ms_median": 41.4,
    "join_ms_max": 325.5,
    "launch_to_view_ms_median": 3226.4,
    "join_ms": [41.35, 37.4, 325.48],
    "launch_to_view_ms": [2512.87, 3226.35, 6451.88],
}
STATE_DOC = {
    "size_bytes": 10_000_000,
    "transfer_s": 0.25,
    "join_and_transfer_s": 0.3,
    "mb_per_s": 40.0,
    "launch_to_state_ms": 1234.5,
}


def test_the_new_workloads_exist_with_their_units_and_peers() -> None:
    assert (W["join-4"].unit, W["join-4"].stack, W["join-4"].systems) == ("ms", "fifo", ("groupcluster", "jgroups-5"))
    assert W["join-flush-4"].stack == "vsync" and "jgroups-2.12" in W["join-flush-4"].systems
    assert (W["state-transfer-10MB"].unit, W["state-transfer-10MB"].size) == ("MB/s", 10_000_000)
    assert W["state-transfer-10MB"].systems == ("groupcluster", "jgroups-5")
    assert W["grid-rebalance-3to4"].unit == "MB/s" and W["grid-rebalance-3to4-entries"].unit == "entries/s"
    assert W["grid-rebalance-3to4-write-p99-during"].unit == "ms"
    for name in ("grid-ops-batch-put", "grid-ops-batch-get", "grid-ops-single-put", "grid-ops-single-get"):
        assert W[name].unit == "ops/s" and W[name].systems == ("groupcluster", "infinispan", "hazelcast")
    # Every JVM system of a lifecycle workload has a harness configuration, and it exists.
    for w in W.values():
        if w.kind in ("join", "state"):
            for system in w.systems[1:]:
                config = JAVA_CONFIGS[(w.kind, w.stack, system)]
                # JGroups 5 runs the jar's own tcp-new.xml (written per run); 2.12 a file of conf/.
                assert system == "jgroups-5" or (harness_dir() / "conf" / CONFIGS[(system, config)]).is_file()


def test_workloads_of_one_run_share_it() -> None:
    groups = {w.run_group for w in W.values() if w.name.startswith("grid-rebalance-")}
    assert groups == {"grid-rebalance"}
    assert {w.run_group for w in W.values() if w.name.startswith("grid-ops-")} == {"grid-ops"}
    assert W["join-4"].run_group == "join-4" and W["fifo-4x100B"].run_group == "fifo-4x100B"
    assert W["join-4-launch"].run_group == W["join-4-warm"].run_group == "join-4"
    assert W["join-flush-4"].run_group == "join-flush-4"


def test_quick_selection_includes_new_workloads_but_not_the_long_rebalance() -> None:
    quick = model.select(model.QUICK_WORKLOADS, W)
    assert {"join-4", "state-transfer-10MB", "grid-ops-batch-put", "grid-ops-batch-get"} <= set(quick)
    assert not any(n.startswith("grid-rebalance") for n in quick)
    assert "grid-ops-single-put" not in quick


def test_script_json_takes_the_object_printed_last() -> None:
    assert figures.script_json(json.dumps(JOIN_DOC), "s") == JOIN_DOC
    indented = "loading...\n" + json.dumps(STATE_DOC, indent=2) + "\n"
    assert figures.script_json(indented, "s") == STATE_DOC
    assert figures.script_json('{"a": 1}\nnoise\n{"b": 2}', "s") == {"b": 2}
    with pytest.raises(figures.FigureError, match="printed nothing"):
        figures.script_json("  \n", "join_latency.py")
    with pytest.raises(figures.FigureError, match="no JSON object"):
        figures.script_json("took 3 s", "join_latency.py")
    with pytest.raises(figures.FigureError, match="expected a JSON object"):
        figures.script_json("[1, 2]", "x.py")


def test_join_figures_are_medians_of_the_rounds() -> None:
    assert figures.join_ms(JOIN_DOC) == pytest.approx(41.35)
    java = [{"join_ms": 900.0, "stack_start_ms": 20}, {"join_ms": 300.0}, {"join_ms": 500.0}]
    assert figures.java_join_ms(java) == 500.0
    with pytest.raises(figures.FigureError, match="join_ms"):
        figures.join_ms({"join_ms_median": 4.0})
    with pytest.raises(figures.FigureError, match="not a number"):
        figures.join_ms({"join_ms": [1.0, "slow"]})
    with pytest.raises(figures.FigureError, match="no joiner"):
        figures.java_join_ms([])


def test_state_figures_are_megabytes_per_second_of_the_transfer() -> None:
    assert figures.state_mb_per_s(STATE_DOC, 10_000_000) == pytest.approx(40.0)
    java = {"state_bytes": 10_000_000, "state_ms": 500.0, "join_and_state_ms": 900.0}
    assert figures.java_state_mb_per_s(java, 10_000_000) == pytest.approx(20.0)
    with pytest.raises(figures.FigureError, match="expected 10000000"):
        figures.state_mb_per_s({**STATE_DOC, "size_bytes": 5}, 10_000_000)
    with pytest.raises(figures.FigureError, match="not positive"):
        figures.java_state_mb_per_s({**java, "state_ms": 0}, 10_000_000)
    with pytest.raises(figures.FigureError, match="'transfer_s'"):
        figures.state_mb_per_s({"size_bytes": 10_000_000}, 10_000_000)


def test_lifecycle_lines() -> None:
    assert figures.lifecycle_result('RESULT {"join_ms": 12.5}') == {"join_ms": 12.5}
    assert figures.lifecycle_result("READY") is None
    assert figures.view_line("VIEW 4") == 4 and figures.view_line("READY") is None
    with pytest.raises(figures.FigureError, match="bad RESULT"):
        figures.lifecycle_result("RESULT {join_ms: 1}")
    with pytest.raises(figures.FigureError, match="bad VIEW"):
        figures.view_line("VIEW four")


def test_notes_carry_the_details() -> None:
    assert "rounds 41, 37, 325 ms" in figures.note("groupcluster", W["join-flush-4"], [JOIN_DOC])
    java = [[{"join_ms": 900.0, "stack_start_ms": 20.0}, {"join_ms": 300.0, "stack_start_ms": 10.0}]]
    assert "connect to stack start 15 ms" in figures.note("jgroups-5", W["join-4"], java)


class FakeLifecycle(LifecycleRunner):
    """Records the script runs instead of starting them, and answers with canned output."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings, lambda _: None, self._no_java, lambda n: list(range(7000, 7000 + n)))
        self.calls: list[tuple[str, list[str]]] = []

    @staticmethod
    def _no_java(system: str) -> JavaPeer:
        raise AssertionError(f"no JVM in this test ({system})")

    def _script(self, name: str, args: list[str]) -> dict[str, Any]:
        self.calls.append((name, args))
        return {
            "join_latency.py": JOIN_DOC,
            "state_transfer.py": STATE_DOC,
        }[name]


def test_script_arguments_and_one_run_per_repeat_for_a_group() -> None:
    fake = FakeLifecycle(Settings(repeat=2, join_rounds=4))
    result = fake.measure("groupcluster", W["join-flush-4"])[0]
    name, args = fake.calls[-1]
    assert name == "join_latency.py" and len(fake.calls) == 2
    assert args[args.index("--members") + 1] == "3" and args[args.index("--rounds") + 1] == "4"
    assert args[args.index("--stack") + 1] == "vsync" and args[args.index("--transport") + 1] == "tcp"
    assert (result.workload, result.system, result.unit, result.samples) == (
        "join-flush-4",
        "groupcluster",
        "ms",
        [41.35, 41.35],
    )

    fake.calls.clear()
    result = fake.measure("groupcluster", W["state-transfer-10MB"])[0]
    name, args = fake.calls[0]
    launched = args.index("--launch-wall-ms")
    assert abs(int(args[launched + 1]) - time.time() * 1000) < 60_000  # the wall clock just before the launch
    del args[launched : launched + 2]
    assert (name, args) == (
        "state_transfer.py",
        ["--size-mb", "10", "--members", "1", "--transport", "tcp", "--repeat", "4"],
    )
    assert result.value == pytest.approx(40.0) and result.note == "join + transfer 300 ms"
    # The -launch figure reads the same run (one run per group), in ms.
    runs = len(fake.calls)
    launch = fake.measure("groupcluster", W["state-transfer-10MB-launch"])[0]
    assert len(fake.calls) == runs and (launch.unit, launch.samples) == ("ms", [1234.5] * runs)


def test_lifecycle_commands_of_the_jvms() -> None:
    conf = harness_dir() / "conf"
    peer = JavaPeer("jgroups-2.12", "c", "io.groupcluster.bench.Harness212", conf, "io.groupcluster.bench.Lifecycle212")
    cmd = peer.lifecycle_command("join-flush", "clu", [7000, 7001, 7002, 7003], 3, "join", ["--members", "4"], 3)
    main = cmd.index("io.groupcluster.bench.Lifecycle212")
    assert cmd[main + 1 :] == [str(conf / "jgroups212-flush.xml"), "clu", "join", "--members", "4"]
    assert "-Djgroups.bind_port=7003" in cmd and "-Djgroups.members=3" in cmd
    assert "pbcast.FLUSH" in (conf / "jgroups212-flush.xml").read_text()
    # JGroups 5 runs a file written from the jar's (a path), with the addresses the shipped files read.
    shipped = JavaPeer("jgroups-5", "c", "io.groupcluster.bench.Harness", conf, "io.groupcluster.bench.Lifecycle")
    written = Path("/tmp/jgroups-5-join.xml")
    cmd = shipped.lifecycle_command(written, "clu", [7000, 7001, 7002], 2, "join", ["--members", "3"], 2)
    main = cmd.index("io.groupcluster.bench.Lifecycle")
    assert cmd[main + 1 :] == [str(written), "clu", "join", "--members", "3"]
    assert "-Djgroups.bind_port=7002" in cmd and "-Djgroups.bind_addr=127.0.0.1" in cmd
    assert "-Djgroups.tcpping.initial_hosts=127.0.0.1[7000],127.0.0.1[7001],127.0.0.1[7002]" in cmd
    bare = JavaPeer("jgroups-5", "c", "io.groupcluster.bench.Harness", conf)
    with pytest.raises(Exception, match="no join/state harness"):
        bare.lifecycle_command("join", "clu", [1], 0, "member", [], 1)


def test_the_scripts_the_suite_runs_are_in_the_repository() -> None:
    for name in ("join_latency.py", "state_transfer.py"):
        assert (bench_dir() / name).is_file()
    for name in ("join_latency.py", "state_transfer.py"):
        assert "--json" in (bench_dir() / name).read_text()
    java = harness_dir() / "src" / "main" / "java" / "io" / "groupcluster" / "bench"
    assert (java / "Lifecycle.java").is_file() and (java / "LifecycleCore.java").is_file()
    assert Path(harness_dir() / "src-2.12" / "io" / "groupcluster" / "bench" / "Lifecycle212.java").is_file()


def test_ratios_and_table_for_the_new_units() -> None:
    results = [
        model.aggregate("state-transfer-10MB", "groupcluster", model.MB_UNIT, [40.0]),
        model.aggregate("state-transfer-10MB", "jgroups-5", model.MB_UNIT, [20.0]),
        model.aggregate("join-4", "groupcluster", model.LATENCY_UNIT, [50.0]),
        model.aggregate("join-4", "jgroups-5", model.LATENCY_UNIT, [500.0]),
        model.aggregate("grid-rebalance-3to4", "groupcluster", model.MB_UNIT, [4.36]),
    ]
    assert model.ratios(results) == {("state-transfer-10MB", "jgroups-5"): 2.0}  # ms: lower is better, no ratio
    lines = model.format_table(results).splitlines()
    assert lines[3].split()[2] == "20.00" and lines[3].endswith("2.00x")
    assert "4.36" in lines[6]  # MB/s keeps its decimals
    doc = json.loads(json.dumps(model.to_json(results, model.environment("d", None, 2), {})))
    assert model.validate_json(doc) == []


def test_plots_put_each_new_workload_in_one_figure() -> None:
    results = [
        {"workload": n, "system": "groupcluster", "value": 1.0, "unit": W[n].unit}
        for n in W
        if W[n].kind in model.LIFECYCLE_KINDS
    ]
    results += [
        {"workload": "fifo-4x100B-latency-p50", "system": "groupcluster", "value": 1.0, "unit": "ms"},
        {"workload": "fifo-4x100B", "system": "groupcluster", "value": 1.0, "unit": model.THROUGHPUT_UNIT},
    ]
    placed: dict[str, list[str]] = {}
    for fig in FIGURES:
        for unit, rs in panels(results, fig):
            assert all(r["unit"] == unit for r in rs)
            for r in rs:
                placed.setdefault(r["workload"], []).append(fig.filename)
    assert all(len(files) == 1 for files in placed.values()), placed
    assert placed["join-4"] == ["join.png"] and placed["fifo-4x100B-latency-p50"] == ["latency.png"]
    assert [u for u, _ in panels(results, FIGURES[5])] == ["MB/s", "entries/s", "ms"]  # grid-rebalance.png
    assert len(placed) == len(results)


def test_join_launch_and_warm_figures_keep_launched_and_warm_joins_apart() -> None:
    doc = {**JOIN_DOC, "warm_join_ms": [120.0, 30.0, 50.0, 40.0]}
    assert figures.join_launch_ms(doc) == pytest.approx(3226.35)
    assert figures.join_warm_ms(doc) == pytest.approx(40.0)  # the first, cold in its process, left out
    with pytest.raises(figures.FigureError):
        figures.join_warm_ms({**JOIN_DOC, "warm_join_ms": [12.0]})
    java = [
        {"join_ms": 900.0, "launch_to_view_ms": 1500},
        {"join_ms": 300.0, "launch_to_view_ms": 1300},
        {"join_ms": 700.0, "warm": True, "iteration": 1},
        {"join_ms": 20.0, "warm": True, "iteration": 2},
        {"join_ms": 40.0, "warm": True, "iteration": 3},
    ]
    assert figures.java_join_ms(java) == 600.0  # the warm joins are not launched joins
    assert figures.java_join_launch_ms(java) == 1400.0
    assert figures.java_join_warm_ms(java) == 30.0


def test_state_warm_figures_leave_the_first_fetch_out() -> None:
    doc = {"size_bytes": 10_000_000, "transfer_s": 1.0, "transfer_s_all": [1.0, 0.5, 0.25, 0.2]}
    assert figures.state_mb_per_s(doc, 10_000_000) == pytest.approx(10.0)
    assert figures.state_warm_mb_per_s(doc, 10_000_000) == pytest.approx(40.0)
    with pytest.raises(figures.FigureError):
        figures.state_warm_mb_per_s({**doc, "transfer_s_all": [1.0]}, 10_000_000)
    first = {"state_bytes": 10_000_000, "state_ms": 1000.0}
    java = {**first, "warm": [{"state_bytes": 10_000_000, "state_ms": ms} for ms in (500.0, 250.0, 100.0)]}
    assert figures.java_state_mb_per_s(java, 10_000_000) == pytest.approx(10.0)
    assert figures.java_state_warm_mb_per_s(java, 10_000_000) == pytest.approx(40.0)


def test_the_large_states_run_only_when_named() -> None:
    optional = model.select(model.OPTIONAL_WORKLOADS, W)
    assert set(optional) == {
        "state-transfer-100MB",
        "state-transfer-100MB-launch",
        "state-transfer-100MB-warm",
        "state-transfer-1GB",
        "state-transfer-1GB-launch",
        "state-transfer-1GB-warm",
    }
    assert W["state-transfer-1GB"].size == 1_000_000_000
    assert W["state-transfer-10MB-warm"].run_group == "state-transfer-10MB"
