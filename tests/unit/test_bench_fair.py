"""The pure rules of the fair peers suite: round order, statistics, CPU from /proc, JGroups configs, MPerf output.

Nothing here measures speed; these are the parts whose mistakes would silently bias every figure.
"""

from __future__ import annotations

import argparse

import pytest
from groupcluster.bench import fair, model
from groupcluster.bench.workers import HEADER, Accounting, make_increment, make_payload

# -- rounds ---------------------------------------------------------------------------------------------------


def test_interleave_runs_warmups_first_and_takes_turns_per_round() -> None:
    order = fair.interleave(["a", "b", "c"], warmup=2, rounds=3)
    assert [s for _, s, _ in order] == ["a", "b", "c"] * 5
    assert [k for k, _, _ in order] == [1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4, 5, 5, 5]
    assert [m for k, _, m in order if k <= 2] == [False] * 6
    assert all(m for k, _, m in order if k > 2)


def test_interleave_rejects_no_measured_round() -> None:
    with pytest.raises(ValueError, match="need warmup >= 0 and rounds >= 1"):
        fair.interleave(["a"], warmup=1, rounds=0)
    assert fair.interleave(["a"], warmup=0, rounds=1) == [(1, "a", True)]


def test_summarize_gives_median_spread_and_quartiles() -> None:
    s = fair.summarize([5.0, 1.0, 3.0, 2.0, 4.0])
    assert s == {"n": 5, "median": 3.0, "min": 1.0, "max": 5.0, "q1": 2.0, "q3": 4.0}
    one = fair.summarize([7])
    assert one["median"] == one["min"] == one["max"] == one["q1"] == one["q3"] == 7.0
    with pytest.raises(ValueError, match="no samples"):
        fair.summarize([])


# -- CPU --------------------------------------------------------------------------------------------------------
def _stat(pid: int, comm: str, utime: int, stime: int) -> str:
    # Fields 3..13, then utime (14) and stime (15), then the rest (cutime, cstime, ...).
    head = ["S", "1", "1", "1", "0", "-1", "4194560", "100", "0", "0", "0"]
    tail = ["7", "8", "20", "0", "30", "0", "12345"]
    return f"{pid} ({comm}) " + " ".join([*head, str(utime), str(stime), *tail]) + "\n"


def test_proc_stat_is_parsed_past_a_command_name_with_spaces_and_parentheses() -> None:
    assert fair.parse_proc_stat(_stat(42, "java", 1234, 56)) == (1234, 56)
    assert fair.parse_proc_stat(_stat(43, "a) b (c", 10, 20)) == (10, 20)


def test_cpu_is_user_plus_system_of_every_process_per_delivered_message() -> None:
    before = fair.cpu_seconds([_stat(1, "python3", 100, 50), _stat(2, "java", 200, 0)], 100)
    after = fair.cpu_seconds([_stat(1, "python3", 300, 150), _stat(2, "java", 500, 100)], 100)
    assert before == pytest.approx(3.5)
    assert after == pytest.approx(10.5)
    # 7 s of CPU over 3.5 million deliveries: 2 us each.
    assert fair.cpu_per_message_us(before, after, 3_500_000) == pytest.approx(2.0)
    assert fair.cpu_per_message_us(before, after, 0) is None


def test_cpu_of_a_live_process_reads_this_process() -> None:
    from groupcluster.bench.rounds import MemberSet

    ms = MemberSet("self", [])
    ms.procs = []  # no members: zero
    assert ms.cpu() == 0.0
    with open("/proc/self/stat") as f:
        utime, stime = fair.parse_proc_stat(f.read())
    assert utime + stime >= 0


# -- JGroups configurations ---------------------------------------------------------------------------------
STOCK = """<config xmlns="urn:org:jgroups">
    <TCP bind_addr="${jgroups.bind_addr:site_local}"
         bind_port="${jgroups.bind_port:7800}"/>
    <pbcast.GMS print_local_addr="true" join_timeout="2s"/>
    <MFC max_credits="10M"/>
    <FRAG2 frag_size="60K"  />
    <pbcast.STATE_TRANSFER/>
</config>
"""


def test_stock_config_is_used_verbatim_unless_a_change_is_stated() -> None:
    assert fair.jgroups_config(STOCK) == STOCK
    assert fair.config_diff(STOCK, STOCK, "tcp.xml") == ""


def test_sequencer_goes_just_before_frag2_as_in_the_jars_sequencer_xml() -> None:
    used = fair.jgroups_config(STOCK, sequencer=True)
    lines = used.splitlines()
    i = next(n for n, line in enumerate(lines) if "<FRAG2" in line)
    assert lines[i - 1] == "    <SEQUENCER/>"
    assert lines[i - 2].strip().startswith("<MFC")
    diff = fair.config_diff(STOCK, used, "tcp.xml")
    changed = [line for line in diff.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    assert changed == ["+    <SEQUENCER/>"]


def test_bundler_capacity_is_the_only_change_of_the_tuned_row() -> None:
    used = fair.jgroups_config(STOCK, bundler_capacity=262144)
    assert '<TCP bundler.capacity="262144" bind_addr=' in used
    assert used.replace(' bundler.capacity="262144"', "") == STOCK
    with pytest.raises(ValueError, match="no FRAG2 line to insert SEQUENCER below"):
        fair.jgroups_config("<config/>", sequencer=True)


def test_addresses_come_as_the_properties_the_shipped_files_read() -> None:
    props = fair.address_properties([7801, 7802, 7803], 1)
    assert props == {
        "jgroups.bind_addr": "127.0.0.1",
        "jgroups.bind_port": "7802",
        "jgroups.tcpping.initial_hosts": "127.0.0.1[7801],127.0.0.1[7802],127.0.0.1[7803]",
        "jgroups.tcp.port_range": "0",
    }
    # Only properties that the shipped file reads are set: the stock text names the two TCP ones.
    assert "${jgroups.bind_addr:" in STOCK and "${jgroups.bind_port:" in STOCK


# -- MPerf --------------------------------------------------------------------------------------------------
MPERF_OUT = """
Results:

view: [m0|3] (4) [m0, m1, m2, m3] (local address=m0)
m1: 2,400,000 msgs, 228.88MB received, time=20,004 ms, msgs/sec=119,976.00, throughput=11.44MB

===============================================================================
 Average/node:    2,400,000 msgs, 228.88MB received, time=20,010 ms, msgs/sec=119,940.03, throughput=11.44MB
 Average/cluster: 9,600,000 msgs, 915.53MB received, time=20,010 ms, msgs/sec=479,760.12, throughput=45.75MB
================================================================================
"""


def test_mperf_summary_gives_per_member_rate_and_all_deliveries() -> None:
    assert fair.parse_mperf(MPERF_OUT) == (119940.03, 9_600_000)
    assert fair.parse_mperf("Received no results") is None


# -- the JSON summary ---------------------------------------------------------------------------------------
def test_by_workload_reports_median_spread_and_cpu_of_every_system() -> None:
    r = model.aggregate("fifo-4x100B", "groupcluster", model.THROUGHPUT_UNIT, [1.0, 3.0, 2.0])
    r.spread = fair.summarize(r.samples)
    r.cpu_us_per_message = 2.5
    r.load_before = [1.0, 1.1, 1.2]
    j = model.aggregate("fifo-4x100B", "jgroups-5", model.THROUGHPUT_UNIT, [4.0])
    doc = fair.by_workload([r, j])
    ours = doc["fifo-4x100B"]["groupcluster"]
    assert ours["median"] == 2.0 and ours["spread"]["min"] == 1.0 and ours["spread"]["max"] == 3.0
    assert ours["cpu_us_per_message"] == 2.5
    assert doc["fifo-4x100B"]["jgroups-5"]["spread"]["median"] == 4.0


# -- the worker's round accounting ----------------------------------------------------------------------------
def _args(**kw: object) -> argparse.Namespace:
    base = {"senders": 2, "count": 3, "rate": 0.0, "rank": 0, "window": 0}
    base.update(kw)
    return argparse.Namespace(**base)


def test_rounds_count_cumulatively_so_early_messages_count_for_the_next_round() -> None:
    acc = Accounting(_args())
    acc.start_round(1)
    acc.deliver([make_payload(1, i, 100) for i in range(6)])
    assert acc.done.is_set() and acc.result(1)["delivered"] == 6
    # Two messages of round 2 arrive before this member reads "round 2": they still count for round 2.
    acc.deliver([make_payload(1, i, 100) for i in range(2)])
    acc.start_round(2)
    assert not acc.done.is_set()
    acc.deliver([make_payload(1, i, 100) for i in range(3)])
    assert not acc.done.is_set()
    acc.deliver([make_payload(1, 5, 100)])
    assert acc.done.is_set()
    assert acc.touched_bytes == 12 * 100


def test_every_delivered_message_is_touched() -> None:
    acc = Accounting(_args(senders=1, count=2))
    acc.start_round(1)
    acc.deliver([b"\x00" * 15 + b"\x05", b"\x00" * 19 + b"\x03"])
    assert acc.touched_bytes == 36 and acc.check == 5 ^ 3


def test_counter_applies_every_increment_and_keeps_its_window() -> None:
    acc = Accounting(_args(senders=3, count=2, rank=1, window=2))
    acc.inflight = 2  # two of ours sent
    acc.start_round(1)
    msgs = [make_increment(r, i, 16) for r in range(3) for i in range(2)]
    assert len(msgs[0]) == HEADER.size + 1
    acc.deliver(msgs[:3])  # ranks 0, 0, 1: one of ours back
    assert acc.value == 3 and acc.inflight == 1 and acc.room.is_set()
    acc.deliver(msgs[3:])
    assert acc.value == 6 and acc.inflight == 0 and acc.done.is_set()
    assert acc.result(1)["value"] == 6


# -- the CLI's JSON ---------------------------------------------------------------------------------------------
def test_cli_json_has_every_systems_median_spread_and_cpu(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from groupcluster.bench import cli
    from groupcluster.bench import runner as runner_module

    asked: list[tuple[str, list[str]]] = []

    class FakeRunner:
        def __init__(self, settings: object, progress: object) -> None:
            self.settings = settings
            self.config_diffs = {"jgroups-5/fifo": {"file": "tcp-new.xml", "diff": "", "system_properties": "..."}}

        def measure_interleaved(self, w: model.Workload, systems: list[str]) -> tuple[list[model.Result], list[str]]:
            asked.append((w.name, systems))
            out = []
            for i, system in enumerate(systems):
                r = model.aggregate(w.name, system, w.unit, [10.0 + i, 30.0 + i, 20.0 + i])
                r.spread = fair.summarize(r.samples)
                r.cpu_us_per_message = 1.5 + i
                out.append(r)
            return out, []

    monkeypatch.setattr(runner_module, "Runner", FakeRunner)
    monkeypatch.setattr(cli.signal, "signal", lambda *_: None)  # leave pytest's own SIGTERM handling alone
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--workloads", "fifo-4x100B", "--systems", "groupcluster,jgroups-5*", "--json"])
    assert cli.run(args) == 0
    assert asked == [
        ("fifo-4x100B", ["groupcluster", "jgroups-5", "jgroups-5-tcp", "jgroups-5-tcp-capacity", "jgroups-5-mperf"])
    ]
    doc = json.loads(capsys.readouterr().out)
    assert model.validate_json(doc) == []
    fifo = doc["by_workload"]["fifo-4x100B"]
    assert set(fifo) == {"groupcluster", "jgroups-5", "jgroups-5-tcp", "jgroups-5-tcp-capacity", "jgroups-5-mperf"}
    assert fifo["jgroups-5"]["median"] == 21.0 and fifo["jgroups-5"]["spread"]["min"] == 11.0
    assert fifo["jgroups-5"]["cpu_us_per_message"] == 2.5
    assert doc["settings"]["warmup_rounds"] == 2 and doc["settings"]["messages_per_sender"] == 200_000
    assert doc["settings"]["jgroups_configs"]["jgroups-5/fifo"]["file"] == "tcp-new.xml"
    entry = next(r for r in doc["results"] if r["system"] == "groupcluster")
    assert entry["spread"]["max"] == 30.0 and entry["cpu_us_per_message"] == 1.5


def test_quick_is_short_but_still_warms_up_and_interleaves() -> None:
    from groupcluster.bench import cli

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    s = cli._settings(parser.parse_args(["--quick"]))
    assert s.warmup >= 1 and s.repeat >= 2 and s.messages < 200_000
    s = cli._settings(parser.parse_args(["--warmup", "0", "--repeat", "7"]))
    assert (s.warmup, s.repeat) == (0, 7)
