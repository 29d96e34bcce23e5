"""The pure part of the grid peers: configurations, the harness's lines, what moved, and the figures."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import asdict

import pytest
from groupcluster.bench import fair, model
from groupcluster.bench import gridpeers as gp
from groupcluster.bench.gridpeers_run import GridPeerFailed, GridPeerRunner, harness_dir
from groupcluster.bench.model import WORKLOADS as W
from groupcluster.bench.runner import Settings

ISPN = "{urn:infinispan:config:15.0}"
HZ = "{http://www.hazelcast.com/schema/config}"


def test_infinispan_config_replaces_only_discovery_and_sets_the_cache() -> None:
    root = ET.fromstring(gp.infinispan_xml("c1", "m0", [7800, 7801, 7802]))
    stack = root.find(f"{ISPN}jgroups/{ISPN}stack")
    assert stack is not None and stack.get("extends") == "tcp"  # Infinispan's default TCP stack
    (ping,) = list(stack)
    assert ping.tag.endswith("TCPPING") and ping.get("stack.position") == "MPING"
    assert ping.get("initial_hosts") == "127.0.0.1[7800],127.0.0.1[7801],127.0.0.1[7802]"
    transport = root.find(f"{ISPN}cache-container/{ISPN}transport")
    assert transport is not None and (transport.get("stack"), transport.get("node-name")) == ("bench-tcp", "m0")
    cache = root.find(f"{ISPN}cache-container/{ISPN}distributed-cache")
    assert cache is not None
    assert (cache.get("mode"), cache.get("owners"), cache.get("segments")) == ("SYNC", "2", "256")
    assert cache.find(f"{ISPN}state-transfer") is None  # default settings


def test_infinispan_tuned_row_sets_the_chunk_size_only() -> None:
    default = gp.infinispan_xml("c1", "m0", [7800])
    tuned = gp.infinispan_xml("c1", "m0", [7800], tuned=True)
    state = ET.fromstring(tuned).find(f"{ISPN}cache-container/{ISPN}distributed-cache/{ISPN}state-transfer")
    assert state is not None and state.get("chunk-size") == str(gp.INFINISPAN_TUNED_CHUNK)
    assert tuned.replace(f'\n      <state-transfer chunk-size="{gp.INFINISPAN_TUNED_CHUNK}"/>', "") == default
    assert "-Djgroups.bind.port=7801" in gp.infinispan_properties(7801)


def test_hazelcast_config_joins_by_tcp_ip_on_loopback_with_one_backup() -> None:
    root = ET.fromstring(gp.hazelcast_xml("c<1>", 5701, [5701, 5702]))
    assert root.findtext(f"{HZ}cluster-name") == "c<1>"  # escaped in the text, read back whole
    net = root.find(f"{HZ}network")
    assert net is not None and net.findtext(f"{HZ}port") == "5701"
    assert net.find(f"{HZ}join/{HZ}multicast").get("enabled") == "false"  # type: ignore[union-attr]
    members = [m.text for m in net.iter(f"{HZ}member")]
    assert members == ["127.0.0.1:5701", "127.0.0.1:5702"]
    assert root.findtext(f"{HZ}map/{HZ}backup-count") == "1"
    props = {p.get("name"): p.text for p in root.iter(f"{HZ}property")}
    assert props == {"hazelcast.phone.home.enabled": "false"}
    tuned = {p.get("name"): p.text for p in ET.fromstring(gp.hazelcast_xml("c", 1, [1], True)).iter(f"{HZ}property")}
    assert tuned["hazelcast.partition.max.parallel.migrations"] == str(gp.HAZELCAST_TUNED_PARALLEL)


def test_harness_lines_parse_and_bad_ones_fail_loudly() -> None:
    assert gp.parse_view("VIEW 1700000000123 4") == (1700000000.123, 4)
    assert gp.parse_view("READY") is None
    assert gp.parse_state("STATE 1700000000500 4 128 1") == gp.StateLine(1700000000.5, 4, 128, True)
    assert gp.parse_state("STATE 1700000000500 4 0 0") == gp.StateLine(1700000000.5, 4, 0, False)
    with pytest.raises(gp.HarnessError):
        gp.parse_state("STATE 1 2 3")
    assert gp.parse_list("OWNED [1,5,9]", "OWNED") == [1, 5, 9]
    with pytest.raises(gp.HarnessError, match="expected SEGCOUNTS"):
        gp.parse_list("OWNED [1]", "SEGCOUNTS")
    done = gp.parse_done('DONE {"start":1000.0,"end":3000.0,"ops":500,"errors":0,"p50_ms":1.5,"p99_ms":9}')
    assert done["ops"] == 500 and done["p99_ms"] == 9.0
    with pytest.raises(gp.HarnessError, match="p50_ms"):
        gp.parse_done('DONE {"start":1,"end":2,"ops":3,"errors":0,"p99_ms":1}')


def test_entries_moved_counts_segments_gained_not_promotions_or_losses() -> None:
    counts = [10, 20, 30, 40]
    before = {"a": [0, 1, 2], "b": [1, 2, 3], "c": [0, 3]}
    # d (the joiner) gains 0 and 1; a keeps 0 and gains 3; b loses 1 and 2; c keeps 0 and 3, gains nothing.
    after = {"a": [0, 3], "b": [3], "c": [0, 3], "d": [0, 1]}
    assert gp.entries_moved(before, after, counts) == 10 + 20 + 40


def _states(*rows: tuple[float, int, int, bool]) -> list[gp.StateLine]:
    return [gp.StateLine(*r) for r in rows]


def test_end_of_rebalance_is_the_last_members_final_state() -> None:
    states = {
        "m0": _states((10.0, 3, 170, True), (20.5, 4, 130, False), (22.0, 4, 128, True)),
        "m1": _states((10.0, 3, 170, True), (23.5, 4, 128, True)),
        "m2": _states((10.0, 3, 170, True), (21.0, 4, 128, True)),
        "m3": _states((20.4, 4, 0, True), (23.0, 4, 128, True)),
    }
    assert gp.end_of_rebalance(states, 4, since=20.4) == 23.5
    # The joiner holding nothing yet (Hazelcast before its first migration) is not the end.
    early = {**states, "m3": _states((20.4, 4, 0, True))}
    assert gp.end_of_rebalance(early, 4, since=20.4) is None
    moving = {**states, "m1": _states((23.5, 4, 128, False))}
    assert gp.end_of_rebalance(moving, 4, since=20.4) is None
    assert gp.end_of_rebalance({k: v for k, v in states.items() if k != "m3"}, 4, since=20.4) is None
    # A member whose state did not change since the join counts from the join.
    quiet = {"m0": _states((5.0, 3, 256, True)), "m1": _states((5.0, 3, 256, True)), "m2": _states((5, 3, 256, True))}
    assert gp.end_of_rebalance(quiet, 3, since=9.0) == 9.0


def test_rebalance_figures_split_idle_and_during_writes() -> None:
    samples = [(100.0 + i * 0.01, 1.0 + (i % 100) / 10, True) for i in range(300)]  # idle: 100.00-102.99
    samples += [(110.0 + i * 0.01, 50.0 + i, True) for i in range(100)]  # during the move, 110.00-110.99
    samples += [(111.5, 999.0, False)]  # failed: not in any percentile
    run = gp.RebalanceRun(
        "x", 1000, 100, t_joined=110.0, t_done=112.0, entries=1000, nbytes=2_000_000.0, cpu_members=0.5,
        samples=samples, idle_from=100.0, idle_to=105.0,
    )  # fmt: skip
    f = run.figures()
    assert f["mb_per_s"] == pytest.approx(1.0) and f["entries_per_s"] == pytest.approx(500)
    assert f["idle_p99_ms"] == pytest.approx(10.9) and f["writes_idle"] == 300
    assert f["during_p99_ms"] == 149.0 and f["writes_during"] == 100 and f["writes_failed"] == 1
    assert f["cpu_ms_per_mb"] == pytest.approx(250.0)


def test_ops_step_figures_span_all_clients() -> None:
    clients = [
        {"start": 1000.0, "end": 3000.0, "ops": 500, "errors": 0, "p50_ms": 1.0, "p99_ms": 5.0},
        {"start": 1500.0, "end": 3500.0, "ops": 500, "errors": 0, "p50_ms": 2.0, "p99_ms": 7.0},
        {"start": 1200.0, "end": 2000.0, "ops": 500, "errors": 1, "p50_ms": 3.0, "p99_ms": 9.0},
    ]
    f = gp.OpsStep(clients, cpu_members=0.015, cpu_clients=0.0).figures()
    assert f["ops_per_s"] == pytest.approx(1500 / 2.5)
    assert (f["p50_ms"], f["p99_ms"], f["errors"]) == (2.0, 7.0, 1)
    assert f["cpu_us_per_op"] == pytest.approx(10.0)
    with pytest.raises(gp.HarnessError):
        gp.OpsStep([], 0.0, 0.0).figures()


def test_results_carry_median_quartiles_and_cpu() -> None:
    s = gp.grid_result("grid-ops-single-put", "infinispan", "ops/s", [30.0, 10.0, 20.0, 50.0]).spread
    assert s is not None
    assert (s["median"], s["min"], s["max"], s["n"]) == (25.0, 10.0, 50.0, 4)
    assert s["q1"] == pytest.approx(17.5) and s["q3"] == pytest.approx(35.0)
    r = gp.grid_result("grid-rebalance-3to4", "hazelcast", "MB/s", [3.0, 1.0, 2.0], [400, 300, 500], "ms CPU/MB")
    doc = json.loads(json.dumps(asdict(r)))
    assert (doc["value"], doc["cpu"], doc["cpu_unit"], doc["samples"]) == (2.0, 400, "ms CPU/MB", [3.0, 1.0, 2.0])
    assert doc["spread"]["min"] == 1.0 and doc["spread"]["max"] == 3.0 and doc["cpu_samples"] == [400, 300, 500]
    assert model.validate_json({"results": [doc]}) == []
    with pytest.raises(gp.HarnessError):
        gp.grid_result("grid-rebalance-3to4", "hazelcast", "MB/s", [])


def test_by_workload_and_the_table_carry_the_grid_rows_cpu() -> None:
    r = gp.grid_result("grid-rebalance-3to4", "infinispan", "MB/s", [3.0, 1.0, 2.0], [400, 300, 500], "ms CPU/MB")
    m = model.aggregate("fifo-4x100B", "groupcluster", model.THROUGHPUT_UNIT, [1.0])
    m.cpu_us_per_message = 2.5
    doc = fair.by_workload([r, m])
    grid = doc["grid-rebalance-3to4"]["infinispan"]
    assert (grid["median"], grid["cpu"], grid["cpu_unit"], grid["spread"]["max"]) == (2.0, 400, "ms CPU/MB", 3.0)
    assert doc["fifo-4x100B"]["groupcluster"]["cpu"] is None
    lines = model.format_table([r, m]).splitlines()
    assert "400.0 ms/MB" in lines[2] and "2.50 us/msg" in lines[3]


def test_grid_workloads_run_every_system_and_share_a_run_per_group() -> None:
    grid = {n: w for n, w in W.items() if n.startswith("grid-")}
    assert set(grid) == {
        "grid-rebalance-3to4",
        "grid-rebalance-3to4-entries",
        "grid-rebalance-3to4-write-p99-idle",
        "grid-rebalance-3to4-write-p99-during",
        "grid-ops-single-put",
        "grid-ops-single-get",
        "grid-ops-batch-put",
        "grid-ops-batch-get",
    }
    for w in grid.values():
        assert w.kind == model.GRID_PEER_KIND and w.kind in model.LIFECYCLE_KINDS
        assert {"groupcluster", "infinispan", "hazelcast"} <= set(w.systems)
        assert w.run_group == ("grid-ops" if w.name.startswith("grid-ops-") else "grid-rebalance")
    # The tuned rows are about bulk transfer: the rebalance only.
    assert "hazelcast-tuned" in W["grid-rebalance-3to4"].systems
    assert "infinispan-tuned" not in W["grid-ops-batch-put"].systems
    assert W["grid-rebalance-3to4"].size == 1_000_000
    assert set(model.select(model.QUICK_WORKLOADS, W)) >= {"grid-ops-batch-put", "grid-ops-batch-get"}
    assert all(gp.system_note(s) for s in W["grid-rebalance-3to4"].systems)


def test_runner_takes_the_quick_size_and_the_chosen_systems() -> None:
    import argparse

    from groupcluster.bench import cli

    r = GridPeerRunner(Settings(), lambda _: None, lambda n: list(range(n)))
    assert r.entries(W["grid-rebalance-3to4"]) == 1_000_000
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    quick = GridPeerRunner(cli._settings(parser.parse_args(["--quick"])), lambda _: None, lambda n: list(range(n)))
    assert quick.entries(W["grid-rebalance-3to4"]) == 50_000
    ran: list[tuple[str, list[str]]] = []
    chosen = GridPeerRunner(Settings(systems=("groupcluster", "hazelcast")), lambda _: None, lambda n: [])
    chosen._run_group = lambda group, w, systems: ran.append((group, systems))  # type: ignore[method-assign]
    with pytest.raises(GridPeerFailed, match="no run of groupcluster"):
        chosen.measure("groupcluster", W["grid-ops-batch-put"])
    assert ran == [("grid-ops", ["groupcluster", "hazelcast"])]
    # The harness sources are in the repository, next to the JGroups peer.
    assert (harness_dir() / "pom.xml").is_file()
    assert (harness_dir() / "src/main/java/io/groupcluster/bench/grid/GridPeer.java").is_file()


def test_every_system_has_its_own_plot_colour() -> None:
    from groupcluster.bench.plots import COLOURS

    assert set(model.SYSTEMS) <= set(COLOURS)
    assert len({COLOURS[s] for s in model.SYSTEMS}) == len(model.SYSTEMS)
