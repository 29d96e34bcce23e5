"""The pure parts of ``groupcluster bench --suite peers``: selection, aggregation, JSON schema, table, framing.

No benchmark runs here (figures are measured by the command, never asserted in tests).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from groupcluster.bench import model
from groupcluster.bench.jgroups import CONFIGS, JavaPeer, harness_dir
from groupcluster.bench.runner import Runner, Settings, free_ports
from groupcluster.bench.workers import decode_frame, encode_frame, make_payload, parse_args
from groupcluster.cli import main


def report(rank: int, delivered: int, last: float, send_start: float | None = 0.0, **kw: float) -> model.RunReport:
    return model.RunReport(rank=rank, delivered=delivered, first=0.1, last=last, send_start=send_start, **kw)


def test_required_workloads_and_systems_exist() -> None:
    for name in ("fifo-4x100B", "total-order-4x100B", "fifo-4x1KB", "fifo-1of4x100B", "replicated-counter-3"):
        assert name in model.WORKLOADS
    w = model.WORKLOADS["total-order-4x100B"]
    assert (w.members, w.senders, w.size, w.order) == (4, 4, 100, "total-order")
    assert model.WORKLOADS["fifo-1of4x1KB"].senders == 1
    for w in model.WORKLOADS.values():
        assert w.systems and all(s in model.SYSTEMS for s in w.systems)
        if w.kind == "latency":
            assert w.peak_of in model.WORKLOADS


def test_select_globs_and_latency_brings_its_peak() -> None:
    names = list(model.WORKLOADS)
    assert model.select(["fifo-4x100B"], names) == ["fifo-4x100B"]
    assert model.select(["total-order-*x1KB"], names) == ["total-order-4x1KB", "total-order-1of4x1KB"]
    assert model.select(["nothing"], names) == []
    assert model.with_peaks(["fifo-4x100B-latency"]) == ["fifo-4x100B", "fifo-4x100B-latency"]
    assert model.with_peaks(["fifo-4x100B", "fifo-4x100B-latency"]) == ["fifo-4x100B", "fifo-4x100B-latency"]


def test_parse_result_line() -> None:
    line = 'RESULT {"rank": 2, "delivered": 10, "first": 1.5, "last": 2.5, "send_start": null, "p50_us": 120.0}'
    r = model.parse_result_line(line)
    assert r is not None
    assert (r.rank, r.delivered, r.first, r.last, r.send_start, r.p50_us) == (2, 10, 1.5, 2.5, None, 120.0)
    assert model.parse_result_line("member joined") is None


def test_throughput_counts_from_the_first_send_anywhere() -> None:
    # Member 1 started sending late; everyone's rate is measured from member 0's first send at t=10.
    reports = [
        report(0, 1000, last=11.0, send_start=10.0),
        report(1, 1000, last=12.0, send_start=10.5),
        report(2, 1000, last=14.0, send_start=None),
    ]
    assert model.throughput(reports) == pytest.approx(500.0)  # median of 1000, 500, 250
    with pytest.raises(ValueError, match="no member reported a send start"):
        model.throughput([report(0, 10, last=1.0, send_start=None)])


def test_latency_is_the_median_of_member_percentiles() -> None:
    reports = [report(i, 10, last=1.0, p50_us=1000.0 * (i + 1), p99_us=5000.0 * (i + 1)) for i in range(3)]
    assert model.latency(reports) == (2.0, 10.0)
    with pytest.raises(ValueError, match="no member reported latency samples"):
        model.latency([report(0, 10, last=1.0)])


def test_aggregate_ratios_table_and_json() -> None:
    unit = model.THROUGHPUT_UNIT
    results = [
        model.aggregate("fifo-4x100B", "groupcluster", unit, [90_000, 110_000, 100_000]),
        model.aggregate("fifo-4x100B", "jgroups-5", unit, [50_000]),
        model.aggregate("fifo-4x100B", "raw-asyncio", unit, [400_000, 380_000, 420_000]),
        model.aggregate("fifo-4x100B-latency-p50", "groupcluster", model.LATENCY_UNIT, [1.5, 2.5, 2.0]),
        model.aggregate("fifo-4x100B-latency-p50", "jgroups-5", model.LATENCY_UNIT, [3.0]),
    ]
    assert results[0].value == 100_000 and results[0].samples == [90_000, 110_000, 100_000]
    ratios = model.ratios(results)
    assert ratios == {("fifo-4x100B", "jgroups-5"): 2.0, ("fifo-4x100B", "raw-asyncio"): 0.25}

    table = model.format_table(results)
    lines = table.splitlines()
    assert lines[0].split()[:4] == ["workload", "system", "median", "unit"]
    assert set(lines[1]) <= {"-", " "}
    assert "100,000" in lines[2] and "3 (90,000 - 110,000)" in lines[2]
    assert lines[3].endswith("2.00x") and lines[4].endswith("0.25x")
    assert "2.00" in lines[5] and not lines[5].endswith("x")  # latency: no throughput ratio

    doc = model.to_json(results, model.environment("2026-11-23", (1.0, 2.0, 3.0), 2), {"repeat": 3})
    doc = json.loads(json.dumps(doc))  # what --json prints
    assert model.validate_json(doc) == []
    assert {"workload", "system", "value", "unit"} <= set(doc["results"][0])
    assert doc["environment"]["cores"] == 2
    assert {"workload": "fifo-4x100B", "system": "raw-asyncio", "groupcluster_over_system": 0.25} in doc["ratios"]


def test_validate_json_names_the_problems() -> None:
    assert model.validate_json({}) == ["'results' is not a list"]
    bad = {"results": [{"workload": "w", "system": "redis", "value": "fast", "unit": "x"}, 3]}
    problems = model.validate_json(bad)
    assert any("value" in p for p in problems)
    assert any("redis" in p for p in problems)
    assert any("results[1]" in p for p in problems)
    with pytest.raises(ValueError, match="w/groupcluster: no samples"):
        model.aggregate("w", "groupcluster", "ms", [])


def test_raw_frames_round_trip_and_payload_layout() -> None:
    payloads = [make_payload(3, i, 100) for i in range(5)] + [b""]
    frame = encode_frame(payloads)
    length, count = int.from_bytes(frame[:4], "big"), int.from_bytes(frame[4:8], "big")
    assert (length, count) == (len(frame) - 8, 6)
    assert decode_frame(frame[8:], count) == payloads
    assert len(payloads[0]) == 100 and int.from_bytes(payloads[4][8:12], "big") == 3
    assert int.from_bytes(payloads[4][12:16], "big") == 4


def test_worker_arguments_default_to_everyone_sending() -> None:
    args = parse_args(["raw", "--rank", "1", "--ports", "1,2,3", "--size", "4"])
    assert (args.members, args.senders, args.size) == (3, 3, 16)


def test_commands_and_message_counts_without_running_anything() -> None:
    runner = Runner(Settings(messages=1000, counter_ops=50, raw_factor=4), progress=lambda _: None)
    w = model.WORKLOADS["fifo-1of4x100B"]
    assert runner.count_for("groupcluster", w) == 4000  # the lone sender sends what four would
    assert runner.count_for("raw-asyncio", w) == 16000
    assert runner.count_for("pysyncobj", model.WORKLOADS["replicated-counter-3"]) == 50
    cmds = runner.commands("raw-asyncio-relay", model.WORKLOADS["total-order-4x100B"], 10, 0.0, [1, 2, 3, 4], "c")
    assert len(cmds) == 4 and "--relay" in cmds[0] and cmds[3][cmds[3].index("--rank") + 1] == "3"
    cmds = runner.commands("groupcluster", model.WORKLOADS["total-order-4x1KB"], 10, 5.0, [1, 2, 3, 4], "c")
    assert cmds[0][cmds[0].index("--stack") + 1] == "total-order" and "--rate" in cmds[0]
    # The JGroups harness sends from several threads (Core.java --threads), as MPerf and applications do.
    runner._java["jgroups-2.12"] = JavaPeer(
        "jgroups-2.12", "c", "io.groupcluster.bench.Harness212", harness_dir() / "conf"
    )
    cmds = runner.commands("jgroups-2.12", model.WORKLOADS["fifo-4x100B"], 10, 0.0, [1, 2, 3, 4], "c")
    assert cmds[2][cmds[2].index("--threads") + 1] == str(Settings().jgroups_threads) == "8"


def test_java_peer_command_and_configs() -> None:
    conf = harness_dir() / "conf"
    for name in CONFIGS.values():
        text = (conf / name).read_text()
        assert "${jgroups.bind_port}" in text and "127.0.0.1" in text
        assert ("SEQUENCER" in text) == ("sequencer" in name)
    peer = JavaPeer("jgroups-2.12", "a.jar:b.jar", "io.groupcluster.bench.Harness212", conf)
    cmd = peer.command("total-order", "clu", [7000, 7001], 1, ["--count", "5"])
    assert cmd[0] == "java" and "-Djgroups.bind_port=7001" in cmd
    assert "-Djgroups.initial_hosts=127.0.0.1[7000],127.0.0.1[7001]" in cmd
    assert cmd[cmd.index("io.groupcluster.bench.Harness212") + 1] == str(conf / "jgroups212-sequencer.xml")
    assert cmd[-4:] == ["--rank", "1", "--count", "5"]


def test_free_ports_are_distinct() -> None:
    ports = free_ports(4)
    assert len(set(ports)) == 4 and all(p + 100 not in ports for p in ports)


def test_cli_lists_workloads(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--list"]) == 0
    out = capsys.readouterr().out
    assert "fifo-4x100B " in out and "replicated-counter-3" in out and "jgroups-2.12" in out


def test_cli_rejects_unknown_workloads() -> None:
    with pytest.raises(SystemExit, match="no workload matches"):
        main(["bench", "--suite", "peers", "--workloads", "nope"])


def test_harness_sources_are_in_the_repository() -> None:
    root = harness_dir()
    assert (root / "pom.xml").is_file()
    assert "<jgroups.version>5." in (root / "pom.xml").read_text()
    assert Path(root / "src-2.12" / "io" / "groupcluster" / "bench" / "Harness212.java").is_file()


def _written(tmp: Path, settings: dict[str, object], workloads: list[str]) -> Path:
    results = [
        model.Result(w, "groupcluster", 1000.0 + i, "msgs/s per member", [1000.0]) for i, w in enumerate(workloads)
    ]
    doc = model.to_json(results, model.environment("2026-01-01 00:00 UTC", None, 2), settings)
    path = tmp / "results.json"
    path.write_text(json.dumps(doc))
    return path


def test_resume_keeps_the_finished_workloads_of_the_same_settings_only(tmp_path: Path) -> None:
    from groupcluster.bench.cli import _resumed

    settings: dict[str, object] = {"repeat": 5, "warmup_rounds": 2, "messages_per_sender": 200000}
    path = _written(tmp_path, settings, ["fifo-4x100B", "fifo-1of4x100B"])
    kept, invocations = _resumed(path, dict(settings))
    assert [r.workload for r in kept] == ["fifo-4x100B", "fifo-1of4x100B"] and kept[0].value == 1000.0
    assert invocations == [{"started": "2026-01-01 00:00 UTC", "workloads": ["fifo-1of4x100B", "fifo-4x100B"]}]
    # Rows measured with other settings are not comparable: refused, naming the setting.
    with pytest.raises(SystemExit, match="messages_per_sender 200000 there, 20000 here"):
        _resumed(path, {**settings, "messages_per_sender": 20000})
    assert _resumed(tmp_path / "absent.json", dict(settings)) == ([], [])
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(SystemExit, match="cannot read"):
        _resumed(tmp_path / "bad.json", dict(settings))


def test_resume_needs_an_out_directory() -> None:
    with pytest.raises(SystemExit, match="--resume needs --out"):
        main(["bench", "--suite", "peers", "--workloads", "fifo-4x100B", "--resume"])
