"""The pure scaling planner: every decision of the operator, without a cluster."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import pytest
from groupcluster_operator.actions import CreatePod, DeletePod, RequestLeave
from groupcluster_operator.failures import Failures, failure_backoff
from groupcluster_operator.membership import choose_leavers
from groupcluster_operator.model import ClusterSpec, SpecError
from groupcluster_operator.observations import MemberReport, PodState
from groupcluster_operator.planner import plan
from groupcluster_operator.status import invalid_status

VIEW = "10.0.0.10:7800#1|7"


def spec(replicas: int = 3, **extra: Any) -> ClusterSpec:
    body = {"metadata": {"name": "demo", "namespace": "ns"}, "spec": {"replicas": replicas, **extra}}
    return ClusterSpec.from_resource(body, default_image="groupcluster:test")


HASH = spec().pod_hash()


def addr(i: int) -> str:
    return f"10.0.0.{10 + i}:7800#{i + 1}"


def cluster(
    n: int, *, coordinator: int = 0, hashes: dict[int, str] | None = None, **report: Any
) -> tuple[list[PodState], dict[str, MemberReport | None]]:
    """n ready members in one view (pods demo-0..n-1), coordinator demo-<coordinator>."""
    pods = [
        PodState(
            name=f"demo-{i}",
            ordinal=i,
            phase="Running",
            ip=f"10.0.0.{10 + i}",
            ready=True,
            spec_hash=(hashes or {}).get(i, HASH),
        )
        for i in range(n)
    ]
    members = tuple(addr(i) for i in range(n))
    reports: dict[str, MemberReport | None] = {
        p.name: MemberReport(
            address=addr(i),
            view_id=VIEW,
            view_members=members,
            coordinator=addr(coordinator),
            segments_owned=256,
            **report,
        )
        for i, p in enumerate(pods)
    }
    return pods, reports


def test_an_empty_cluster_creates_its_first_member() -> None:
    step = plan(spec(3), [], {})
    assert step.actions == [CreatePod(0, "scaling up: 0 of 3 members", 1)]
    assert step.phase == "ScalingUp"
    assert step.status["replicas"] == 0 and step.status["selector"] == "groupcluster.io/cluster=demo"
    assert [e.reason for e in step.events] == ["MemberCreated"]


def test_members_are_added_one_at_a_time_each_ready_only_after_join_and_transfer() -> None:
    pods, reports = cluster(1)
    pods.append(PodState(name="demo-1", ordinal=1, phase="Running", ip="10.0.0.11", ready=False, spec_hash=HASH))
    # Joined, but its segments are still arriving: not ready, so no third pod yet.
    reports["demo-1"] = MemberReport(address=addr(1), view_id=VIEW, grid_ready=False, segments_to_fetch=40)
    step = plan(spec(3), pods, reports)
    assert step.actions == []
    assert "demo-1" in step.message and step.phase == "ScalingUp"
    pods[1] = PodState(name="demo-1", ordinal=1, phase="Running", ip="10.0.0.11", ready=True, spec_hash=HASH)
    pods2, reports2 = cluster(2)
    step = plan(spec(3), pods2, reports2)
    assert step.actions == [CreatePod(2, "scaling up: 2 of 3 members", 3)]


def test_every_member_after_the_first_is_join_only() -> None:
    """k members ready: the next pod starts with initial_cluster_size k+1, so it can only join their grid."""
    assert plan(spec(4), [], {}).actions == [CreatePod(0, "scaling up: 0 of 4 members", 1)]
    for k in (1, 2, 3):
        pods, reports = cluster(k)
        (create,) = plan(spec(4), pods, reports).actions
        assert isinstance(create, CreatePod) and (create.ordinal, create.initial_cluster_size) == (k, k + 1)
    # Scaling 0 -> N again starts from an empty grid: its first member gets 1 again.
    assert plan(spec(2), [], {}).actions[0] == CreatePod(0, "scaling up: 0 of 2 members", 1)
    # A replacement and a rolling update's surge member join the members ready then.
    pods, reports = cluster(5)
    pods[4] = PodState(name="demo-4", ordinal=4, phase="Failed", exit_code=1, spec_hash=HASH)
    reports.pop("demo-4")
    (_, create) = plan(spec(5), pods, reports).actions
    assert create == CreatePod(5, "replacing a member that died: 4 of 5 members", 5)
    pods, reports = cluster(2, hashes={0: "old", 1: "old"})
    assert plan(spec(2), pods, reports).actions == [CreatePod(2, "rolling update: 2 member(s) on an old spec", 3)]


def _lone(size: int, report: MemberReport | None) -> tuple[list[PodState], dict[str, MemberReport | None]]:
    pod = PodState(name="demo-3", ordinal=3, phase="Running", ip="10.0.0.13", spec_hash=HASH, initial_cluster_size=size)
    return [pod], {"demo-3": report}


def test_a_join_only_member_left_alone_without_a_topology_is_replaced_by_a_first_member() -> None:
    # demo-3 was created to join 3 members (size 4); they all died before it got the grid: it never can.
    alone = MemberReport(address=addr(3), view_id="x|1", view_members=(addr(3),), grid_ready=False, topology_id=None)
    pods, reports = _lone(4, alone)
    step = plan(spec(3), pods, reports)
    (delete,) = step.actions
    assert isinstance(delete, DeletePod) and (delete.pod, delete.grace_seconds) == ("demo-3", 5)
    assert "initial_cluster_size=4" in delete.reason
    (warn,) = step.events
    assert (warn.type, warn.reason) == ("Warning", "MemberStranded") and "a new first member" in warn.message
    # Once it is gone, the cluster starts afresh with a member that may start the grid.
    assert plan(spec(3), [], {}).actions == [CreatePod(0, "scaling up: 0 of 3 members", 1)]


@pytest.mark.parametrize(
    ("size", "report", "others"),
    [
        (1, MemberReport(address="a", grid_ready=False), 0),  # a first member: it starts the grid itself
        (4, None, 0),  # does not answer: it may hold the last copies, so never deleted blindly
        (4, MemberReport(address="a", grid_ready=False, topology_id=7), 0),  # joined: data arriving
        (4, MemberReport(address="a", grid_ready=False), 1),  # someone else is still there to join
    ],
)
def test_a_starting_member_that_may_still_get_a_grid_is_waited_for(
    size: int, report: MemberReport | None, others: int
) -> None:
    pods, reports = _lone(size, report)
    if others:
        more, more_reports = cluster(others)
        pods, reports = more + pods, {**more_reports, **reports}
    step = plan(spec(3), pods, reports)
    assert step.actions == [] and "demo-3" in step.message
    assert not [e for e in step.events if e.reason == "MemberStranded"]


def test_a_settled_cluster_does_nothing_and_reports_well_formed() -> None:
    pods, reports = cluster(3)
    step = plan(spec(3), pods, reports, now="2026-01-01T00:00:00Z")
    assert step.actions == [] and step.events == []
    assert step.phase == "Running"
    st = step.status
    assert st["replicas"] == 3 and st["readyReplicas"] == 3
    assert st["viewId"] == VIEW and st["coordinator"] == "demo-0"
    conds = {c["type"]: c["status"] for c in st["conditions"]}
    assert conds == {
        "Ready": "True",
        "WellFormed": "True",
        "Rebalancing": "False",
        "ScalingUp": "False",
        "ScalingDown": "False",
        "Degraded": "False",
        "Full": "False",
    }


def test_views_that_differ_are_not_well_formed_and_block_a_scale_down() -> None:
    pods, reports = cluster(3)
    reports["demo-2"] = MemberReport(address=addr(2), view_id="10.0.0.12:7800#3|1", view_members=(addr(2),))
    step = plan(spec(2), pods, reports)
    assert step.actions == []
    assert {c["type"]: c["status"] for c in step.status["conditions"]}["WellFormed"] == "False"
    assert step.status["viewId"] == ""


def test_scale_down_with_two_owners_asks_one_member_at_a_time_never_the_coordinator() -> None:
    pods, reports = cluster(5, coordinator=4)
    step = plan(spec(2), pods, reports)
    assert step.actions == [RequestLeave("demo-3", "scaling down to 2")]
    assert step.phase == "ScalingDown"
    assert [e.reason for e in step.events] == ["MemberLeaving"]


def test_scale_down_never_has_more_than_num_owners_minus_one_leaving() -> None:
    pods, reports = cluster(6)
    step = plan(spec(3, numOwners=3), pods, reports)
    assert [a.pod for a in step.actions if isinstance(a, RequestLeave)] == ["demo-5", "demo-4"]
    # While they leave, nobody else is asked, even though 3 more must go.
    leaving = [
        PodState(**{**p.__dict__, "leave_requested": True}) if p.name in ("demo-5", "demo-4") else p for p in pods
    ]
    for name in ("demo-5", "demo-4"):
        r = reports[name]
        assert r is not None
        reports[name] = MemberReport(**{**r.__dict__, "leaving": True})
    step = plan(spec(3, numOwners=3), leaving, reports)
    assert step.actions == []
    assert "demo-4" in step.message and "demo-5" in step.message


def test_no_leave_while_the_grid_rebalances() -> None:
    pods, reports = cluster(3, grid_phase="READ_OLD_WRITE_ALL")
    step = plan(spec(2), pods, reports)
    assert step.actions == []
    assert step.status["rebalance"]["inProgress"] is True
    assert {c["type"]: c["status"] for c in step.status["conditions"]}["Rebalancing"] == "True"


def test_a_lost_leave_request_is_sent_again() -> None:
    pods, reports = cluster(3)
    pods[2] = PodState(**{**pods[2].__dict__, "leave_requested": True})
    step = plan(spec(2), pods, reports)  # annotated, but the member says it is not leaving
    assert step.actions == [RequestLeave("demo-2", "a leave was asked for but the member is not leaving")]


def test_a_member_that_left_is_deleted_and_the_next_one_may_go() -> None:
    pods, reports = cluster(4, coordinator=0)
    left = PodState(name="demo-3", ordinal=3, phase="Succeeded", leave_requested=True, exit_code=0)
    pods[3] = left
    reports.pop("demo-3")
    members = tuple(addr(i) for i in range(3))
    for i in range(3):
        reports[f"demo-{i}"] = MemberReport(
            address=addr(i), view_id="v8", view_members=members, coordinator=addr(0), segments_owned=256
        )
    step = plan(spec(2), pods, reports)
    assert step.actions[0] == DeletePod("demo-3", "left the group after handing its data off")
    assert step.actions[1:] == [RequestLeave("demo-2", "scaling down to 2")]
    # One member asked to leave (the other action deletes the pod of the one that left): says so.
    assert step.message == "asking demo-2 to leave: 3 -> 2 members"
    assert [e.reason for e in step.events] == ["MemberLeft", "MemberLeaving"]


def test_a_dead_member_is_deleted_reported_and_replaced() -> None:
    pods, reports = cluster(3)
    pods[1] = PodState(name="demo-1", ordinal=1, phase="Failed", exit_code=137, reason="Error", spec_hash=HASH)
    reports["demo-1"] = None
    members = (addr(0), addr(2))
    for i in (0, 2):
        reports[f"demo-{i}"] = MemberReport(address=addr(i), view_id="v9", view_members=members, coordinator=addr(0))
    step = plan(spec(3), pods, reports)
    assert step.actions == [
        DeletePod("demo-1", "member exited unexpectedly: exit code 137 (Error)"),
        CreatePod(3, "replacing a member that died: 2 of 3 members", 3),
    ]
    warn = [e for e in step.events if e.type == "Warning"]
    assert len(warn) == 1 and warn[0].reason == "MemberDied" and "exit code 137" in warn[0].message


def test_a_pod_terminating_is_waited_for_before_its_replacement() -> None:
    pods, reports = cluster(3)
    pods[2] = PodState(**{**pods[2].__dict__, "deleting": True})
    step = plan(spec(3), pods, reports)
    assert step.actions == []
    assert "demo-2" in step.message


def test_rolling_update_adds_a_new_member_then_retires_old_ones_coordinator_last() -> None:
    new = spec(3, image="groupcluster:v2")
    old_hash = HASH
    pods, reports = cluster(3, hashes=dict.fromkeys(range(3), old_hash))
    step = plan(new, pods, reports)
    assert step.actions == [CreatePod(3, "rolling update: 3 member(s) on an old spec", 4)]
    assert step.phase == "Updating"
    # The surge member joined: one old member leaves, not the coordinator (demo-0).
    pods, reports = cluster(4, hashes={0: old_hash, 1: old_hash, 2: old_hash, 3: new.pod_hash()})
    step = plan(new, pods, reports)
    assert step.actions == [RequestLeave("demo-2", "runs an old spec (rolling update)")]
    assert step.phase == "Updating"
    # Only the coordinator is still old: it goes last, after a new member joined.
    pods, reports = cluster(4, hashes={0: old_hash, 1: new.pod_hash(), 2: new.pod_hash(), 3: new.pod_hash()})
    step = plan(new, pods, reports)
    assert step.actions == [RequestLeave("demo-0", "runs an old spec (rolling update)")]
    member_state = {m["pod"]: m["upToDate"] for m in step.status["members"]}
    assert member_state == {"demo-0": False, "demo-1": True, "demo-2": True, "demo-3": True}


def test_scale_to_zero_retires_members_then_stops_the_last() -> None:
    pods, reports = cluster(2)
    step = plan(spec(0), pods, reports)
    assert step.actions == [RequestLeave("demo-1", "scaling down to 0")]
    pods, reports = cluster(1)
    step = plan(spec(0), pods, reports)
    assert step.actions == [DeletePod("demo-0", "scaling to 0: the last member stops", grace_seconds=5)]
    step = plan(spec(0), [], {})
    assert step.actions == [] and step.phase == "Stopped"


def test_a_ready_member_that_does_not_answer_is_degraded() -> None:
    pods, reports = cluster(3)
    reports["demo-1"] = None
    step = plan(spec(3), pods, reports)
    assert step.phase == "Degraded"
    assert "demo-1 does not answer" in step.message
    assert {c["type"]: c["status"] for c in step.status["conditions"]}["Degraded"] == "True"


def store_report(i: int, store: dict[str, int]) -> MemberReport:
    """Member ``i`` of a 3-member view, parsed from a ``/v1/status`` answer whose ``grid.store`` is ``store``."""
    return MemberReport.from_status(
        {
            "address": addr(i),
            "joined": True,
            "view": {"id": [7, "10.0.0.10:7800#1"], "members": [addr(j) for j in range(3)]},
            "coordinator": addr(0),
            "grid": {"phase": "NO_REBALANCE", "ready": True, "store": store},
        }
    )


def test_a_member_at_its_max_entries_bound_makes_the_cluster_full() -> None:
    pods, reports = cluster(3, entries=90, max_entries=100)
    step = plan(spec(3), pods, reports)
    conds = {c["type"]: c for c in step.status["conditions"]}
    assert conds["Full"]["status"] == "False" and conds["Full"]["reason"] == "Room"
    assert [(m["entries"], m["maxEntries"]) for m in step.status["members"]] == [(90, 100)] * 3
    reports["demo-2"] = store_report(2, {"entries": 100, "max_entries": 100})
    step = plan(spec(3), pods, reports)
    full = {c["type"]: c for c in step.status["conditions"]}["Full"]
    assert full["status"] == "True" and full["reason"] == "AtMaxEntries"
    assert full["message"].startswith("demo-2 holds 100 of 100 entries: PUTs of new keys are refused")
    assert step.actions == []  # the operator reports it; scaling stays the user's decision
    # No bound: never full, however many entries.
    pods, reports = cluster(3, entries=10**6)
    assert {c["type"]: c["status"] for c in plan(spec(3), pods, reports).status["conditions"]}["Full"] == "False"


def test_a_member_near_its_max_bytes_bound_makes_the_cluster_full() -> None:
    pods, reports = cluster(3, nbytes=980, max_bytes=1000)
    step = plan(spec(3), pods, reports)
    assert {c["type"]: c["status"] for c in step.status["conditions"]}["Full"] == "False"  # 98%: room
    assert [(m["bytes"], m["maxBytes"]) for m in step.status["members"]] == [(980, 1000)] * 3
    reports["demo-1"] = store_report(1, {"bytes": 990, "max_bytes": 1000})
    full = {c["type"]: c for c in plan(spec(3), pods, reports).status["conditions"]}["Full"]
    assert full["status"] == "True" and full["message"].startswith("demo-1 holds 990 of 1000 bytes: PUTs")


def test_condition_transition_times_move_only_when_the_status_flips() -> None:
    pods, reports = cluster(3)
    first = plan(spec(3), pods, reports, now="T1").status["conditions"]
    again = plan(spec(3), pods, reports, previous_conditions=first, now="T2").status["conditions"]
    assert {c["lastTransitionTime"] for c in again} == {"T1"}
    flipped = plan(spec(2), pods, reports, previous_conditions=first, now="T3").status["conditions"]
    times = {c["type"]: c["lastTransitionTime"] for c in flipped}
    assert times["ScalingDown"] == "T3" and times["WellFormed"] == "T1"


def test_choose_leavers_order() -> None:
    pods = [PodState(name=f"p{i}", ordinal=i, spec_hash="new") for i in range(4)]
    pods[1] = PodState(name="p1", ordinal=1, spec_hash="old")
    assert [p.name for p in choose_leavers(pods, 2, "new", "p3")] == ["p1", "p2"]
    assert [p.name for p in choose_leavers(pods, 4, "new", "p3")][-1] == "p3"


def test_pod_state_and_member_report_are_read_from_api_objects() -> None:
    pod = {
        "metadata": {
            "name": "demo-4",
            "labels": {"groupcluster.io/ordinal": "4"},
            "annotations": {"groupcluster.io/spec-hash": "abc", "groupcluster.io/leave-requested": "now"},
            "deletionTimestamp": None,
        },
        "status": {
            "phase": "Failed",
            "podIP": "10.0.0.4",
            "conditions": [{"type": "Ready", "status": "False"}],
            "containerStatuses": [{"state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}],
        },
    }
    st = PodState.from_pod(pod)
    assert (st.name, st.ordinal, st.phase, st.ip, st.ready) == ("demo-4", 4, "Failed", "10.0.0.4", False)
    assert st.spec_hash == "abc" and st.leave_requested and st.finished
    assert (st.exit_code, st.reason) == (137, "OOMKilled")
    status = {
        "address": addr(0),
        "joined": True,
        "view": {"id": [7, addr(0)], "members": [addr(0), addr(1)]},
        "coordinator": addr(0),
        "grid": {
            "topology_id": 12,
            "phase": "READ_OLD_WRITE_ALL",
            "availability": "AVAILABLE",
            "segments_owned": 100,
            "rebalance": {"segments_to_fetch": 10, "segments_fetched": 4},
            "leaving": False,
            "ready": False,
        },
    }
    r = MemberReport.from_status(status)
    assert r.view_id == f"{addr(0)}|7" and r.view_members == (addr(0), addr(1))
    assert (r.grid_phase, r.segments_to_fetch, r.segments_fetched, r.topology_id) == ("READ_OLD_WRITE_ALL", 10, 4, 12)
    assert r.grid_ready is False


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"replicas": -1}, "spec.replicas"),
        ({"numOwners": 0}, "spec.numOwners"),
        ({"partitionHandling": "Sometimes"}, "spec.partitionHandling"),
        ({"memberPort": 8080}, "memberPort and spec.httpPort"),
        ({"stack": {"set": {"nodot": "1"}}}, "layer.key"),
        ({"stack": {"preset": "fast"}}, "spec.stack.preset"),
        # Scaling relies on flushed view changes: no preset or override may take the flush away.
        ({"stack": {"preset": "fifo"}}, "spec.stack.preset: 'fifo' is no longer offered"),
        ({"stack": {"set": {"gms.use_flush": "false"}}}, "spec.stack.set: gms.use_flush cannot be set"),
        ({"stack": {"set": {"flush.enable_reconciliation": "false"}}}, "flush.enable_reconciliation cannot be set"),
        # The operator sets it per pod (join-only members); a user's value would fight it.
        ({"grid": {"initial_cluster_size": "3"}}, "spec.grid.initial_cluster_size: set by the operator"),
    ],
)
def test_bad_specs_are_refused_naming_the_field(fields: dict[str, Any], message: str) -> None:
    body = {"metadata": {"name": "demo", "namespace": "ns"}, "spec": {"replicas": 3, **fields}}
    with pytest.raises(SpecError, match=re.escape(message)):
        ClusterSpec.from_resource(body, default_image="groupcluster:test")


def test_every_offered_preset_flushes_its_view_changes() -> None:
    from groupcluster.stacks import preset
    from groupcluster_operator.model import PRESETS

    for name in PRESETS:
        layers = preset(name)
        assert any(e["layer"] == "flush" for e in layers), name
        assert next(e for e in layers if e["layer"] == "gms").get("use_flush") is True, name
        body = {"metadata": {"name": "demo", "namespace": "ns"}, "spec": {"stack": {"preset": name}}}
        assert ClusterSpec.from_resource(body, default_image="groupcluster:test").preset == name


def test_an_image_is_required_from_the_spec_or_the_operator() -> None:
    body = {"metadata": {"name": "demo", "namespace": "ns"}, "spec": {}}
    with pytest.raises(SpecError, match=r"spec\.image"):
        ClusterSpec.from_resource(body)
    assert ClusterSpec.from_resource({**body, "spec": {"image": "x/groupcluster:1"}}).image == "x/groupcluster:1"


def test_the_pod_hash_ignores_replicas_but_not_the_image() -> None:
    assert spec(3).pod_hash() == spec(5).pod_hash()
    assert spec(3).pod_hash() != spec(3, image="groupcluster:v2").pod_hash()
    assert spec(3).pod_hash() != spec(3, stack={"set": {"fd.timeout": "5s"}}).pod_hash()


def conditions(step: Any) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in step.status["conditions"]}


def test_ready_condition_ready_column_and_a_short_view() -> None:
    pods, reports = cluster(3)
    step = plan(spec(3), pods, reports, now="2026-01-01T00:00:00Z")
    ready = conditions(step)["Ready"]
    assert (ready["status"], ready["reason"]) == ("True", "AllMembersReady")
    assert step.status["ready"] == "3/3"
    # The view's creator (10.0.0.10:7800#1) is demo-0's member: the column names the pod, the sequence, the size.
    assert step.status["view"] == "demo-0|7, 3 members" and step.status["viewId"] == VIEW
    # One member short: not Ready, the reason is the phase and the message says what happens.
    pods, reports = cluster(2)
    step = plan(spec(3), pods, reports)
    ready = conditions(step)["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "ScalingUp") and ready["message"] == step.message
    assert step.status["ready"] == "2/3"
    # Members that disagree: no view to show.
    pods, reports = cluster(3)
    reports["demo-2"] = MemberReport(address=addr(2), view_id="10.0.0.12:7800#3|1", view_members=(addr(2),))
    assert plan(spec(3), pods, reports).status["view"] == ""


def test_an_invalid_spec_makes_ready_false_and_keeps_the_other_conditions() -> None:
    pods, reports = cluster(3)
    before = plan(spec(3), pods, reports, now="2026-01-01T00:00:00Z").status["conditions"]
    st = invalid_status("spec.numOwners: 4 copies ...", before, "2026-01-01T00:01:00Z")
    assert st["phase"] == "Invalid"
    ready = st["conditions"][0]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "False", "InvalidSpec")
    assert ready["lastTransitionTime"] == "2026-01-01T00:01:00Z"
    assert [c["type"] for c in st["conditions"]] == [c["type"] for c in before]


SOLO = spec(1, numOwners=1)


def failed(name: str, ordinal: int, message: str = "", reason: str = "StartError", code: int = 128) -> PodState:
    """A member pod of SOLO (one member, one owner) whose container ended."""
    return PodState(
        name=name,
        ordinal=ordinal,
        phase="Failed",
        exit_code=code,
        reason=reason,
        message=message,
        spec_hash=SOLO.pod_hash(),
    )


def test_failure_backoff_doubles_from_the_second_exit_in_a_row() -> None:
    assert [failure_backoff(n) for n in range(1, 10)] == [0, 5, 10, 20, 40, 80, 160, 300, 300]


def test_members_that_keep_exiting_are_replaced_with_a_back_off_and_the_reason_in_the_status() -> None:
    msg = "Traceback (most recent call last):\n  ...\nValueError: bad image for groupcluster\n"
    # The first exit: replaced at once (a crash says nothing about the next member).
    step = plan(SOLO, [failed("demo-0", 0, msg)], {}, now="2026-01-01T00:00:00Z")
    assert step.actions == [
        DeletePod(
            "demo-0", "member exited unexpectedly: exit code 128 (StartError): ValueError: bad image for groupcluster"
        ),
        CreatePod(1, "replacing a member that died: 0 of 1 members", 1),
    ]
    (died,) = [e for e in step.events if e.reason == "MemberDied"]
    assert died.type == "Warning" and "ValueError: bad image" in died.message and "replacing it" in died.message
    st = step.status
    assert st["failures"]["count"] == 1 and st["failures"]["lastPod"] == "demo-0"
    assert st["failures"]["retryAfter"] == ""
    # The replacement exits too: the second in a row waits 5 s, and its pod stays (describe, logs) meanwhile.
    step = plan(SOLO, [failed("demo-1", 1, msg)], {}, previous_status=st, now="2026-01-01T00:00:02Z")
    assert step.actions == []
    assert step.phase == "Failing"
    assert step.message == (
        "2 member exits in a row, the last demo-1: exit code 128 (StartError): ValueError: bad image for groupcluster; "
        "next attempt in 5 s"
    )
    ready = conditions(step)["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "MemberFailing") and "ValueError" in ready["message"]
    assert [e.reason for e in step.events] == ["MemberDied"] and "2 exits in a row" in step.events[0].message
    st = step.status
    assert st["failures"]["retryAfter"] == "2026-01-01T00:00:07Z" and st["failures"]["failedPods"] == ["demo-1"]
    # Still waiting: the same failed pod is not counted again and no second event is posted.
    step = plan(SOLO, [failed("demo-1", 1, msg)], {}, previous_status=st, now="2026-01-01T00:00:05Z")
    assert step.actions == [] and step.events == [] and step.status["failures"]["count"] == 2
    assert step.message.endswith("next attempt in 2 s")
    # The back-off ended: the failed pod goes and a new member is tried (another ordinal: the old one still
    # terminates).
    step = plan(SOLO, [failed("demo-1", 1, msg)], {}, previous_status=st, now="2026-01-01T00:00:07Z")
    assert [type(a) for a in step.actions] == [DeletePod, CreatePod]
    assert step.actions[1] == CreatePod(0, "replacing a member that died: 0 of 1 members", 1)
    st = step.status
    # It exits as well: the third waits 10 s.
    step = plan(SOLO, [failed("demo-0", 0, msg)], {}, previous_status=st, now="2026-01-01T00:00:09Z")
    assert step.actions == [] and step.status["failures"]["count"] == 3
    assert step.status["failures"]["retryAfter"] == "2026-01-01T00:00:19Z"


def test_a_spec_change_or_a_ready_cluster_resets_the_failure_count() -> None:
    st = {
        "failures": {
            "count": 4,
            "lastPod": "demo-3",
            "lastReason": "exit code 1 (Error)",
            "lastTime": "2026-01-01T00:00:00Z",
            "failedPods": ["demo-3"],
            "specHash": SOLO.pod_hash(),
        }
    }
    pods = [failed("demo-3", 3)]
    # Same spec: waiting (20 s after the 4th).
    assert plan(SOLO, pods, {}, previous_status=st, now="2026-01-01T00:00:01Z").phase == "Failing"
    # The user changed the image: the failed pod (old spec) is replaced at once and the count starts afresh.
    fixed = spec(1, numOwners=1, image="groupcluster:v2")
    step = plan(fixed, pods, {}, previous_status=st, now="2026-01-01T00:00:01Z")
    assert [type(a) for a in step.actions] == [DeletePod, CreatePod]
    assert step.status["failures"]["count"] == 0 and step.status["failures"]["specHash"] == fixed.pod_hash()
    # A Ready cluster forgets earlier exits: the next one is replaced at once.
    pods2, reports = cluster(3)
    earlier = {"failures": {**st["failures"], "failedPods": [], "specHash": HASH}}
    assert Failures.from_status(earlier["failures"], HASH).count == 4
    step = plan(spec(3), pods2, reports, previous_status=earlier)
    assert step.phase == "Running" and step.status["failures"]["count"] == 0


def test_a_pod_that_cannot_start_makes_the_phase_failing_with_the_kubelet_reason() -> None:
    pods, reports = cluster(2)
    pull = PodState(
        name="demo-2",
        ordinal=2,
        phase="Pending",
        spec_hash=HASH,
        waiting_reason="ImagePullBackOff",
        waiting_message='Back-off pulling image "nosuch/image:1"',
    )
    step = plan(spec(3), [*pods, pull], reports, now="2026-01-01T00:00:00Z")
    assert step.actions == [] and step.phase == "Failing"
    assert step.message == 'demo-2 cannot start: ImagePullBackOff: Back-off pulling image "nosuch/image:1"'
    assert "to join" not in step.message
    ready = conditions(step)["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "MemberFailing")
    (ev,) = step.events
    assert (ev.type, ev.reason) == ("Warning", "MemberFailing") and "nosuch/image:1" in ev.message
    # Reported once: the next step (the kubelet now says ErrImagePull) posts no second event.
    again = PodState(**{**pull.__dict__, "waiting_reason": "ErrImagePull"})
    step = plan(spec(3), [*pods, again], reports, previous_status=step.status)
    assert step.events == [] and step.message.startswith("demo-2 cannot start: ErrImagePull")
    # A pod that is merely being created is not stuck.
    creating = PodState(**{**pull.__dict__, "waiting_reason": "ContainerCreating", "waiting_message": ""})
    step = plan(spec(3), [*pods, creating], reports)
    assert step.phase == "ScalingUp" and step.message == "waiting for demo-2 to join and receive its data"
    # The user fixed the image: the stuck pod (old spec) is deleted, so the fix is not stuck behind it.
    step = plan(spec(3, image="groupcluster:v2"), [*pods, pull], reports)
    assert DeletePod("demo-2", "it cannot start and runs an old spec; a member on the new spec replaces it", 5) in (
        step.actions
    )
    # The scheduler's word counts too.
    pending = PodState(
        name="demo-2", ordinal=2, spec_hash=HASH, unschedulable="0/3 nodes are available: Insufficient memory"
    )
    step = plan(spec(3), [*pods, pending], reports)
    assert step.message == "demo-2 cannot start: Unschedulable: 0/3 nodes are available: Insufficient memory"


def routing(owners: list[list[int]]) -> dict[str, Any]:
    return {"num_segments": len(owners), "owners": owners}


def test_a_degraded_grid_is_a_condition_an_event_and_the_message_with_the_segments_it_lost() -> None:
    pods, reports = cluster(2, availability="DEGRADED", num_segments=8, segments_unavailable=3)
    joiner = PodState(name="demo-2", ordinal=2, phase="Running", ip="10.0.0.12", spec_hash=HASH)
    reports["demo-2"] = MemberReport(address=addr(2), view_id=VIEW, grid_ready=False)
    step = plan(spec(3), [*pods, joiner], reports, now="2026-01-01T00:00:00Z")
    assert step.phase == "Degraded"
    assert step.message.startswith("the grid is degraded: 3 of 8 segments have no owner left")
    assert "reads and writes are refused (partitionHandling DenyReadWrites)" in step.message
    assert "to join" not in step.message
    degraded = conditions(step)["Degraded"]
    assert (degraded["status"], degraded["reason"]) == ("True", "GridDegraded") and "3 of 8" in degraded["message"]
    assert conditions(step)["Ready"]["reason"] == "Degraded"
    (ev,) = step.events
    assert (ev.type, ev.reason) == ("Warning", "GridDegraded") and "3 of 8 segments" in ev.message
    # Once per change: the same state again posts nothing, a different count posts again.
    assert plan(spec(3), [*pods, joiner], reports, previous_status=step.status).events == []
    pods, reports = cluster(2, availability="DEGRADED", num_segments=8, segments_unavailable=0)
    step2 = plan(spec(2), pods, reports, previous_status=step.status)
    assert [e.reason for e in step2.events if e.reason == "GridDegraded"] == ["GridDegraded"]
    assert "every segment still has an owner, but too many members left at once" in step2.message
    # AllowReads: the message says what is refused.
    assert (
        "writes are refused (partitionHandling AllowReads)"
        in plan(spec(2, partitionHandling="AllowReads"), pods, reports).message
    )


def test_member_report_counts_segments_without_a_live_owner_from_the_routing_table() -> None:
    body = {
        "address": addr(0),
        "joined": True,
        "view": {"id": [7, addr(0)], "members": [addr(0)]},
        "grid": {"availability": "DEGRADED", "ready": True},
        "routing": routing([[0], [], [0], []]),
    }
    r = MemberReport.from_status(body)
    assert (r.availability, r.num_segments, r.segments_unavailable) == ("DEGRADED", 4, 2)
    assert MemberReport.from_status({**body, "routing": None}).segments_unavailable == 0


def test_a_deleted_pod_is_waited_for_and_its_replacement_says_so() -> None:
    pods, reports = cluster(3)
    pods[1] = PodState(**{**pods[1].__dict__, "deleting": True})
    step = plan(spec(3), pods, reports)
    assert step.message == "waiting for demo-1 to stop (pod deleted; it hands its data off first)"
    assert [(e.reason, e.type) for e in step.events] == [("MemberDeleted", "Normal")]
    assert {m["pod"]: m["deleted"] for m in step.status["members"]}["demo-1"] is True
    assert plan(spec(3), pods, reports, previous_status=step.status).events == []  # once
    # Gone: the new member replaces it (not "scaling up").
    pods, reports = cluster(3)
    del pods[1], reports["demo-1"]
    step = plan(spec(3), pods, reports, previous_status=step.status)
    assert step.actions == [CreatePod(1, "replacing demo-1 (pod deleted): 2 of 3 members", 3)]


def test_pod_state_reads_the_termination_message_the_waiting_reason_and_the_scheduler() -> None:
    pod = {
        "metadata": {"name": "demo-1", "labels": {"groupcluster.io/ordinal": "1"}},
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {
                    "state": {
                        "terminated": {
                            "exitCode": 2,
                            "reason": "Error",
                            "message": "groupcluster member: error: --set fd.timeout: bad duration 'x'\n\n",
                        }
                    }
                }
            ],
        },
    }
    st = PodState.from_pod(pod)
    assert st.exit_text == "exit code 2 (Error): groupcluster member: error: --set fd.timeout: bad duration 'x'"
    long = PodState(name="p", ordinal=0, phase="Failed", exit_code=1, message="x" * 1000)
    assert len(long.exit_text) == 300 and long.exit_text.endswith("...")
    waiting = {
        "metadata": {"name": "demo-2"},
        "status": {
            "phase": "Pending",
            "containerStatuses": [{"state": {"waiting": {"reason": "ErrImagePull", "message": "not found"}}}],
        },
    }
    assert PodState.from_pod(waiting).stuck == "ErrImagePull: not found"
    unscheduled = {
        "metadata": {"name": "demo-2"},
        "status": {
            "phase": "Pending",
            "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/1 nodes"}
            ],
        },
    }
    assert PodState.from_pod(unscheduled).stuck == "Unschedulable: 0/1 nodes"


def test_only_pods_deleted_by_someone_else_count_as_deleted() -> None:
    pods, reports = cluster(3)
    # The operator's own deletions, annotated first: a dead member's pod, one it stopped itself.
    pods[1] = PodState(
        **{**pods[1].__dict__, "deleting": True, "phase": "Failed", "ready": False, "stopped_by_operator": True}
    )
    pods[2] = PodState(**{**pods[2].__dict__, "deleting": True, "stopped_by_operator": True})
    step = plan(spec(3), pods, reports)
    assert step.events == [] and not any(m["deleted"] for m in step.status["members"])
    assert step.message == "waiting for demo-1, demo-2 to leave"
    # Deleted by a user: once it left and its pod is Succeeded (still terminating), it is still "deleted".
    pods, reports = cluster(3)
    pods[2] = PodState(**{**pods[2].__dict__, "deleting": True})
    first = plan(spec(3), pods, reports)
    pods[2] = PodState(**{**pods[2].__dict__, "phase": "Succeeded", "ready": False})
    second = plan(spec(3), pods, reports, previous_status=first.status)
    assert {m["pod"]: m["deleted"] for m in second.status["members"]}["demo-2"] is True
    del pods[2], reports["demo-2"]
    third = plan(spec(3), pods, reports, previous_status=second.status)
    assert third.actions == [CreatePod(2, "replacing demo-2 (pod deleted): 2 of 3 members", 3)]
    # Deleted by a user and already Succeeded (it left on SIGTERM) when a step first sees it: deleted too.
    pods, reports = cluster(3)
    first = plan(spec(3), pods, reports)
    pods[2] = PodState(**{**pods[2].__dict__, "deleting": True, "phase": "Succeeded", "ready": False})
    second = plan(spec(3), pods, reports, previous_status=first.status)
    assert {m["pod"]: m["deleted"] for m in second.status["members"]}["demo-2"] is True
    assert [e.reason for e in second.events] == ["MemberDeleted"]


def _without(n: int, *gone: int) -> tuple[list[PodState], dict[str, MemberReport | None]]:
    """cluster(n) less the members ``gone`` (their pods deleted and gone)."""
    pods, reports = cluster(n)
    for i in gone:
        reports.pop(f"demo-{i}")
    return [p for p in pods if p.ordinal not in gone], reports


def _not_ready(pods: list[PodState], name: str) -> list[PodState]:
    """``name``'s readiness probe fails for a moment (say while the grid rebalances): rule 3 holds the step."""
    return [replace(p, ready=False) if p.name == name else p for p in pods]


def test_a_deleted_member_is_replaced_as_such_even_when_the_step_that_saw_it_go_was_held() -> None:
    pods, reports = cluster(5)
    pods[2] = replace(pods[2], deleting=True)
    steps = [plan(spec(5), pods, reports)]
    # demo-2 is gone, but demo-3 is not ready at that moment: the step waits and creates nothing.
    pods, reports = _without(5, 2)
    steps.append(plan(spec(5), _not_ready(pods, "demo-3"), reports, previous_status=steps[-1].status))
    assert steps[-1].actions == [] and "demo-3" in steps[-1].message
    assert steps[-1].status["pendingReplacements"] == ["demo-2"]
    # The next step replaces it, and says so (not "scaling up").
    steps.append(plan(spec(5), pods, reports, previous_status=steps[-1].status))
    assert steps[-1].actions == [CreatePod(2, "replacing demo-2 (pod deleted): 4 of 5 members", 5)]
    (created,) = [e for e in steps[-1].events if e.reason == "MemberCreated"]
    assert created.message == "creating member pod demo-2 (replacing demo-2 (pod deleted): 4 of 5 members)"
    # Created: nothing is pending any more, while its pod starts nor after.
    assert steps[-1].status["pendingReplacements"] == []
    starting = PodState(name="demo-2", ordinal=2, phase="Pending", spec_hash=HASH, initial_cluster_size=5)
    steps.append(plan(spec(5), [*pods, starting], reports, previous_status=steps[-1].status))
    assert steps[-1].actions == [] and steps[-1].status["pendingReplacements"] == []
    # One MemberDeleted event in all these steps, posted when the deletion was first seen.
    deleted = [(i, e.message) for i, step in enumerate(steps) for e in step.events if e.reason == "MemberDeleted"]
    assert [i for i, _ in deleted] == [0] and "a new member replaces it" in deleted[0][1]


def test_a_member_gone_unseen_while_a_leave_runs_is_replaced_as_deleted_after_it() -> None:
    # demo-1 is being deleted (rule 2 waits for it); demo-3 goes between two steps without ever being seen
    # terminating. Both are replaced by name, one pod at a time, each event posted once.
    pods, reports = cluster(5)
    steps = [plan(spec(5), pods, reports)]
    pods, reports = _without(5, 3)
    pods[1] = replace(pods[1], deleting=True)
    steps.append(plan(spec(5), pods, reports, previous_status=steps[-1].status))
    assert steps[-1].actions == [] and steps[-1].message.startswith("waiting for demo-1 to stop")
    assert steps[-1].status["pendingReplacements"] == ["demo-3"]
    pods, reports = _without(5, 1, 3)
    steps.append(plan(spec(5), pods, reports, previous_status=steps[-1].status))
    # The lowest free ordinal is demo-1's: that pod replaces demo-1; demo-3 waits for the next one.
    assert steps[-1].actions == [CreatePod(1, "replacing demo-1 (pod deleted): 3 of 5 members", 4)]
    assert steps[-1].status["pendingReplacements"] == ["demo-3"]
    joining = PodState(name="demo-1", ordinal=1, phase="Running", ip="10.0.0.11", spec_hash=HASH)
    steps.append(plan(spec(5), [*pods, joining], reports, previous_status=steps[-1].status))
    assert steps[-1].actions == [] and steps[-1].status["pendingReplacements"] == ["demo-3"]
    pods, reports = _without(5, 3)
    steps.append(plan(spec(5), pods, reports, previous_status=steps[-1].status))
    assert steps[-1].actions == [CreatePod(3, "replacing demo-3 (pod deleted): 4 of 5 members", 5)]
    assert steps[-1].status["pendingReplacements"] == []
    deleted = sorted(
        (e.message.split()[2], i) for i, step in enumerate(steps) for e in step.events if e.reason == "MemberDeleted"
    )
    assert deleted == [("demo-1", 1), ("demo-3", 1)]


def test_a_pending_replacement_is_dropped_when_replicas_drop_and_kept_while_a_guard_blocks_it() -> None:
    pods, reports = cluster(5)
    first = plan(spec(5), pods, reports)
    pods, reports = _without(5, 2)
    held = plan(spec(5), _not_ready(pods, "demo-3"), reports, previous_status=first.status)
    assert held.status["pendingReplacements"] == ["demo-2"]
    # The Secret is unusable: no pod is created, so the replacement is still due afterwards.
    blocked = plan(spec(5), pods, reports, previous_status=held.status, auth_problem="the Secret lacks a key")
    assert blocked.actions == [] and blocked.status["pendingReplacements"] == ["demo-2"]
    step = plan(spec(5), pods, reports, previous_status=blocked.status)
    assert step.actions == [CreatePod(2, "replacing demo-2 (pod deleted): 4 of 5 members", 5)]
    # Scaled down to the members left: nothing replaces demo-2, and nothing remembers it.
    fewer = plan(spec(4), pods, reports, previous_status=held.status)
    assert fewer.actions == [] and fewer.status["pendingReplacements"] == []
    # Scaled up again later, the new member is a scale-up, not demo-2's replacement.
    again = plan(spec(5), pods, reports, previous_status=fewer.status)
    assert again.actions == [CreatePod(2, "scaling up: 4 of 5 members", 5)]
    # Two deleted, one still wanted: one stays pending.
    pods, reports = _without(5, 1, 2)
    two = plan(spec(4), _not_ready(pods, "demo-3"), reports, previous_status=first.status)
    assert two.status["pendingReplacements"] == ["demo-1"]
    assert [e.message for e in two.events if e.reason == "MemberDeleted"] == [
        "member pod demo-1 was deleted (not by the operator); a new member replaces it",
        "member pod demo-2 was deleted (not by the operator); it is not replaced",
    ]


def test_a_member_pod_gone_between_two_steps_was_deleted_unless_the_operator_removed_it() -> None:
    pods, reports = cluster(3)
    first = plan(spec(3), pods, reports)
    # demo-1 was deleted and left on SIGTERM before any step saw it terminating.
    del pods[1], reports["demo-1"]
    step = plan(spec(3), pods, reports, previous_status=first.status)
    assert step.actions == [CreatePod(1, "replacing demo-1 (pod deleted): 2 of 3 members", 3)]
    (ev,) = [e for e in step.events if e.reason == "MemberDeleted"]
    assert ev.message == "member pod demo-1 was deleted (not by the operator); a new member replaces it"
    # A member the operator asked to leave is marked leaving in the status of that very step: gone later, it
    # is no deletion.
    pods, reports = cluster(3, coordinator=0)
    asked = plan(spec(2), pods, reports)
    assert asked.actions == [RequestLeave("demo-2", "scaling down to 2")]
    assert {m["pod"]: m["leaving"] for m in asked.status["members"]}["demo-2"] is True
    del pods[2], reports["demo-2"]
    step = plan(spec(2), pods, reports, previous_status=asked.status)
    assert [e.reason for e in step.events] == [] and not step.actions
