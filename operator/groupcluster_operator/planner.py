"""The pure scaling planner: from the spec, the pods and what the members report, the next step.

:func:`plan` is called on every reconciliation (a kopf timer) with what the handler observed (the pods and
the members' reports, read by :mod:`groupcluster_operator.observations`); it returns a
:class:`~groupcluster_operator.actions.Plan`: the actions to execute now (create a pod, ask a member to leave,
delete a pod), or none (wait), the status to write and the events to post. It keeps no state: everything it
needs to remember lives on the pods as annotations (a leave was asked for, which spec a pod runs) or in the
status the last step wrote (the failures, the pods deleted by someone else and not replaced yet), so an
operator restart picks up where the last one stopped.

This module holds the rules; :mod:`~groupcluster_operator.membership` what a step sees of the members,
:mod:`~groupcluster_operator.failures` the pacing of exits in a row, :mod:`~groupcluster_operator.status` the
status a step writes.

The rules, in the order they are checked:

1. A member pod that finished (it left, or its process died) is deleted; one that died unexpectedly is
   reported as a Warning event, and the steps below replace it. Unexpected exits in a row are counted (the
   status' ``failures``, reset once the cluster is Ready or the spec changes): the first is replaced at
   once, later ones after a back-off (:func:`failure_backoff`), and meanwhile the failed pod is kept, so its
   state and log can be read, and no new pod is created (phase ``Failing``).
2. While any member is leaving (a leave was asked for) or any pod is terminating, nothing else starts: the
   leave must finish first (its data handed off). A leaving member that says it is not leaving (the request
   was lost) is asked again.
3. While a pod is starting (not ready: not joined yet, or its state transfer not finished), wait. A new
   member counts as ready only then, so pods are added one at a time. A starting pod that cannot start (its
   image cannot be pulled, it cannot be scheduled, ...) makes the phase ``Failing`` with the reason; if it
   runs an old spec (the user fixed the image, say) it is deleted, so the fix is not stuck behind it. One
   exception: a join-only member (see below) that is the only pod left and reports no grid topology can never
   start: it is deleted, and rule 4 then creates a cluster's first member in its place.
4. Fewer members than wanted: create one (the lowest free ordinal). A member pod someone else deleted stays in
   the status' ``pendingReplacements`` until a pod is created for it (or fewer pods are missing than are
   listed): the step that first sees it gone may be held by a rule above, and its replacement still says whom
   it replaces.
5. More members than wanted: once the group is well formed and no rebalance runs, ask up to
   ``max(1, numOwners-1)`` members to leave, preferring members on an old spec, then members that are not the
   coordinator, then the highest ordinal; the coordinator leaves last. A pod is deleted only after its member
   left (the process exits once its segments have new owners). Scaling to 0 stops the last member at once:
   nobody is left to take its segments.
6. As many as wanted but some run an old spec (image or settings changed): once the group is stable, add one
   member on the new spec; rule 5 then asks one old member to leave. Members roll one at a time, the
   coordinator last, and the cluster never has fewer members than wanted.

Every pod created while k members are ready (k >= 1) is **join-only**: its member starts with the grid's
``initial_cluster_size`` at k+1, so it cannot start a grid of its own when its join fails (a discovery race, a
network blip) and it forms a group alone: that would need k+1 members none of which holds a topology, i.e. the
whole old cluster gone. Without it, that member would start a second, empty grid and turn Ready, and at a later
merge writes acknowledged on one grid could be lost to older writes of the other (simulation seed 513). The
first pod of a cluster with no ready member gets 1. The value is per pod, not part of the spec hash.

Two guards override the rules above (the cluster is reported Degraded, with a Warning event, until fixed):

* The cluster Secret is missing or unusable (the handler passes ``auth_problem``): no pod is created or
  replaced and no member is asked to leave (that needs the Secret's admin token); finished pods are still
  deleted.
* A member would be created whose frame authentication (``spec.auth``: off, HMAC, encrypted) differs from
  the running members': the two could not read each other's frames, so the new member would form a group of
  its own. No pod is created; leaves still proceed, so scaling to 0 and back applies the change.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .actions import CreatePod, DeletePod, Event, Plan, RequestLeave
from .failures import Failures
from .membership import (
    Observed,
    choose_leavers,
    free_ordinal,
    initial_cluster_size_for,
    member_ready,
    observe,
    stranded_joiner,
)
from .model import ClusterSpec
from .observations import MemberReport, PodState
from .status import build_status, grid_degraded_text


@dataclass
class _Step:
    """What one planning step observed and is building, shared by the rules below (each fills ``out``)."""

    spec: ClusterSpec
    spec_hash: str
    pods: Sequence[PodState]
    reports: Mapping[str, MemberReport | None]
    now: str
    prev: dict[str, Mapping[str, Any]]  # the previous conditions by type
    obs: Observed
    fail: Failures
    was_deleted: set[str]
    deleted_by_others: set[str]
    vanished: list[str]
    # Members deleted by someone else whose replacement is still due, oldest first (the status'
    # ``pendingReplacements``): the step that sees a pod vanish may be held by another rule, and the rule that
    # adds the member must still say whom it replaces.
    pending: list[str]
    out: Plan = field(default_factory=Plan)
    ready: list[PodState] = field(default_factory=list)
    starting: list[PodState] = field(default_factory=list)
    outdated: list[PodState] = field(default_factory=list)
    waiting_join: list[PodState] = field(default_factory=list)
    replacing: str | None = None  # the pending replacement this step's CreatePod is for

    @property
    def desired(self) -> int:
        return self.spec.replicas

    @property
    def n(self) -> int:
        return len(self.obs.active)


def plan(
    spec: ClusterSpec,
    pods: Sequence[PodState],
    reports: Mapping[str, MemberReport | None],
    *,
    spec_hash: str | None = None,
    previous_conditions: Sequence[Mapping[str, Any]] = (),
    previous_status: Mapping[str, Any] | None = None,
    now: str = "",
    auth_problem: str | None = None,
) -> Plan:
    """The next step for one GroupCluster (see the module docstring for the rules and the guards).

    ``previous_status`` is the status the last step wrote (its conditions, unless ``previous_conditions`` are
    given, its failure count, its members, its pending replacements); ``now`` is the time as ``YYYY-MM-DDTHH:MM:SSZ``.
    """
    s = _begin(spec, pods, reports, spec_hash, previous_conditions, previous_status, now)
    # 1. finished pods: delete (and say why they finished); unexpected exits in a row are paced.
    _finished_pods(s)
    _members_seen(s)
    _report_vanished(s)
    # 2. leaves and terminations in progress: let them finish.
    if s.obs.leaving or s.obs.terminating:
        _leaves_in_progress(s)
    # 3. starting pods: one join at a time (a stranded join-only member is replaced by a first member).
    elif stranded := stranded_joiner(s.obs, reports):
        _replace_stranded(s, stranded)
    elif s.starting:
        _starting_pods(s)
    # 4. too few members: add one.
    elif s.n < s.desired:
        _add_member(s)
    # 5. too many members: graceful leaves, bounded by numOwners-1, once the grid is settled.
    elif s.n > s.desired:
        _retire_members(s)
    # 6. the right number but an old spec: surge one new member (rule 5 then retires an old one).
    elif s.outdated and s.desired > 0:
        _surge_for_new_spec(s)
    else:
        _steady(s)
    _back_off(s)
    degraded, reason = _degraded(s, auth_problem)
    out = s.out
    if out.phase == "Running":
        s.fail = Failures(spec_hash=s.spec_hash)  # Ready again: the next exit is replaced at once
    # Pods this step asks to leave or deletes count as leaving from now on: gone at the next step, they are not
    # someone else's deletion.
    sent_off = {a.pod for a in out.actions if isinstance(a, RequestLeave | DeletePod)}
    pending = _still_pending(s)
    out.status = build_status(
        spec,
        s.spec_hash,
        pods,
        reports,
        s.obs,
        s.ready,
        out,
        s.prev,
        now,
        degraded,
        reason,
        s.fail,
        s.deleted_by_others,
        sent_off,
        pending,
    )
    return out


def _begin(
    spec: ClusterSpec,
    pods: Sequence[PodState],
    reports: Mapping[str, MemberReport | None],
    spec_hash: str | None,
    previous_conditions: Sequence[Mapping[str, Any]],
    previous_status: Mapping[str, Any] | None,
    now: str,
) -> _Step:
    """What the step starts from: the observations, the previous status' conditions, failures and members."""
    spec_hash = spec_hash or spec.pod_hash()
    previous = previous_status or {}
    if not previous_conditions:
        previous_conditions = previous.get("conditions") or ()
    prev = {str(c.get("type")): c for c in previous_conditions if isinstance(c, Mapping)}
    obs = observe(pods, reports)
    fail = Failures.from_status(previous.get("failures"), spec_hash)
    names = {p.name for p in pods}
    # Pods deleted by someone else (kubectl delete pod, a drain): neither a leave the operator asked for nor a
    # deletion of its own (the operator annotates every pod it deletes, finished ones too). Its phase says
    # nothing: a deleted member that hands its data off and leaves is Succeeded, possibly before any step saw
    # it running and terminating.
    last_members = {str(m.get("pod")): m for m in previous.get("members") or () if isinstance(m, Mapping)}
    was_deleted = {name for name, m in last_members.items() if m.get("deleted")}
    deleted_by_others = {p.name for p in obs.terminating if not p.leave_requested and not p.stopped_by_operator}
    # Members of the last step that are gone though the operator neither asked them to leave nor deleted them
    # (the status marks those as leaving): deleted by someone else, seen terminating or not (a member that
    # leaves quickly on SIGTERM can be gone before the next step).
    vanished = sorted(
        name for name, m in last_members.items() if name not in names and (m.get("deleted") or not m.get("leaving"))
    )
    # Remembered until a pod replaces them: a pod of the same name exists again only once the operator made it.
    remembered = [str(n) for n in previous.get("pendingReplacements") or () if isinstance(n, str)]
    pending = [n for n in dict.fromkeys([*remembered, *vanished]) if n not in names]
    return _Step(
        spec=spec,
        spec_hash=spec_hash,
        pods=pods,
        reports=reports,
        now=now,
        prev=prev,
        obs=obs,
        fail=fail,
        was_deleted=was_deleted,
        deleted_by_others=deleted_by_others,
        vanished=vanished,
        pending=pending,
    )


def _finished_pods(s: _Step) -> None:
    """Rule 1: delete the finished pods, one Warning per unexpected exit, the replacement paced by the back-off."""
    out, fail, spec_hash, now, desired = s.out, s.fail, s.spec_hash, s.now, s.desired
    finished = []
    for p in s.obs.finished:
        finished.append(p.name)
        if p.leave_requested and p.phase == "Succeeded":
            out.actions.append(DeletePod(p.name, "left the group after handing its data off"))
            out.events.append(Event("Normal", "MemberLeft", f"member {p.name} left the group; deleting its pod"))
            continue
        what = p.exit_text
        new = p.name not in fail.seen
        # An exit on an old spec says nothing about the current one: it is replaced at once, not counted.
        current = p.spec_hash == spec_hash
        if new and current:
            fail.count += 1
            fail.last_pod, fail.last_reason, fail.last_time = p.name, what, now
        # No back-off where nothing replaces it (replicas 0): the failed pod just goes.
        wait = fail.wait_seconds(now) if current and desired else 0
        if new:
            times = f"; {fail.count} exits in a row" if current and fail.count > 1 else ""
            when = f"replacing it in {wait} s (back-off)" if wait else "replacing it"
            out.events.append(
                Event("Warning", "MemberDied", f"member {p.name} exited unexpectedly ({what}){times}; {when}")
            )
        if not wait:
            out.actions.append(DeletePod(p.name, f"member exited unexpectedly: {what}"))
        # Else the failed pod stays until the back-off ends: `kubectl describe` and `kubectl logs` still work.
    fail.seen = tuple(finished)


def _members_seen(s: _Step) -> None:
    """The active members by state: ready, starting (not ready yet), on an old spec."""
    s.ready = [p for p in s.obs.active if member_ready(p, s.reports)]
    s.starting = [p for p in s.obs.active if not member_ready(p, s.reports)]
    s.outdated = [p for p in s.obs.active if p.spec_hash != s.spec_hash]


def _report_vanished(s: _Step) -> None:
    """One event per member pod someone else deleted that is gone since the last step."""
    # As many of the pending replacements as pods are missing are made, the oldest first.
    due = s.pending[: max(0, s.desired - s.n)]
    for name in s.vanished:
        if name not in s.was_deleted:
            replaced = "a new member replaces it" if name in due else "it is not replaced"
            s.out.events.append(
                Event("Normal", "MemberDeleted", f"member pod {name} was deleted (not by the operator); {replaced}")
            )


def _leaves_in_progress(s: _Step) -> None:
    """Rule 2: wait for the leaves and terminations; ask again a leaving member that says it is not leaving."""
    obs, out, reports, n, desired = s.obs, s.out, s.reports, s.n, s.desired
    for p in obs.leaving:
        r = reports.get(p.name)
        if r is not None and r.joined and not r.leaving:
            out.actions.append(RequestLeave(p.name, "a leave was asked for but the member is not leaving"))
    deleted = [p for p in obs.terminating if p.name in s.deleted_by_others]
    going = [p.name for p in obs.leaving + obs.terminating if p not in deleted]
    waits = [f"{', '.join(going)} to leave"] if going else []
    if deleted:
        waits.append(f"{', '.join(p.name for p in deleted)} to stop (pod deleted; it hands its data off first)")
    for p in deleted:
        if p.name not in s.was_deleted:
            out.events.append(
                Event(
                    "Normal",
                    "MemberDeleted",
                    f"member pod {p.name} is being deleted: its member hands its data off and leaves; "
                    + ("a new member replaces it" if n < desired else "it is not replaced"),
                )
            )
    out.message = "waiting for " + " and ".join(waits)
    out.phase = "ScalingDown" if n >= desired or obs.leaving else "ScalingUp"


def _replace_stranded(s: _Step, stranded: PodState) -> None:
    """Rule 3's exception: delete the stranded join-only member, so rule 4 creates a first member."""
    out, desired = s.out, s.desired
    why = (
        f"it was created to join a running grid (initial_cluster_size={stranded.initial_cluster_size}) but "
        "no other member is left, so it can never start one"
    )
    if desired:
        why += "; a new first member replaces it (the grid starts empty: every member that held it is gone)"
    # It holds no data (no topology): there is nothing to hand off, so no long grace period.
    out.actions.append(DeletePod(stranded.name, f"stranded join-only member: {why}", grace_seconds=5))
    out.events.append(Event("Warning", "MemberStranded", f"deleting member pod {stranded.name}: {why}"))
    out.phase = "ScalingUp" if desired else "ScalingDown"
    out.message = f"deleting the stranded join-only member {stranded.name}"


def _starting_pods(s: _Step) -> None:
    """Rule 3: wait for the starting pods; report those that cannot start, delete those on an old spec."""
    out, starting = s.out, s.starting
    stuck = [p for p in starting if p.stuck]
    out.phase = "ScalingUp" if s.n <= s.desired else "ScalingDown"
    if stuck:
        out.phase = "Failing"
        out.message = "; ".join(f"{p.name} cannot start: {p.stuck}" for p in stuck)
        ready_before = s.prev.get("Ready") or {}
        reported = str(ready_before.get("message") or "") if ready_before.get("reason") == "MemberFailing" else ""
        for p in stuck:
            if p.spec_hash != s.spec_hash:
                # It never joined (nothing to hand off), and it waits for the spec the user just changed.
                why = "it cannot start and runs an old spec; a member on the new spec replaces it"
                out.actions.append(DeletePod(p.name, why, grace_seconds=5))
                out.events.append(Event("Normal", "MemberReplaced", f"deleting member pod {p.name}: {why}"))
            elif f"{p.name} cannot start:" not in reported:
                out.events.append(Event("Warning", "MemberFailing", f"member pod {p.name} cannot start: {p.stuck}"))
    else:
        s.waiting_join = starting
        out.message = f"waiting for {', '.join(p.name for p in starting)} to join and receive its data"


def _add_member(s: _Step) -> None:
    """Rule 4: create one member, at the lowest free ordinal."""
    obs, out, n, desired = s.obs, s.out, s.n, s.desired
    ordinal = free_ordinal(s.pods)
    name = f"{s.spec.name}-{ordinal}"
    reason = f"scaling up: {n} of {desired} members"
    if obs.finished and any(not (p.leave_requested and p.phase == "Succeeded") for p in obs.finished):
        reason = f"replacing a member that died: {n} of {desired} members"
    elif s.pending:
        # One pod replaces one deleted member: the one of its own name if there is one (the lowest free
        # ordinal often is the deleted pod's), else the oldest; the others stay pending for the next steps.
        s.replacing = name if name in s.pending else s.pending[0]
        reason = f"replacing {s.replacing} (pod deleted): {n} of {desired} members"
    out.actions.append(CreatePod(ordinal, reason, initial_cluster_size_for(s.ready)))
    out.events.append(Event("Normal", "MemberCreated", f"creating member pod {name} ({reason})"))
    out.phase, out.message = "ScalingUp", reason


def _still_pending(s: _Step) -> list[str]:
    """The pending replacements the next step inherits (after the back-off and the guards dropped actions).

    The one this step creates a pod for is done; and no more stay than pods are still missing (a scale-down,
    or members created meanwhile for another reason, leave nothing to replace).
    """
    created = any(isinstance(a, CreatePod) for a in s.out.actions)
    left = [n for n in s.pending if not (created and n == s.replacing)]
    return left[: max(0, s.desired - s.n - (1 if created else 0))]


def _retire_members(s: _Step) -> None:
    """Rule 5: ask up to ``max_leaving`` members to leave once the group is settled (stop the last one)."""
    obs, out, n, desired, spec_hash = s.obs, s.out, s.n, s.desired, s.spec_hash
    rolling = bool(s.outdated) and n == desired + 1
    out.phase = "Updating" if rolling else "ScalingDown"
    if desired == 0 and n == 1:
        # The last member has nobody to hand its segments to: a graceful leave could only wait out its
        # timeout. Scaling to 0 discards the (in-memory) data by definition; stop the pod promptly.
        (last,) = obs.active
        out.actions.append(DeletePod(last.name, "scaling to 0: the last member stops", grace_seconds=5))
        out.events.append(Event("Normal", "MemberStopped", f"stopping the last member {last.name} (scaling to 0)"))
        out.message = "scaling to 0: stopping the last member"
    elif not obs.well_formed or obs.rebalancing:
        out.message = "waiting for the group to agree on one view and the rebalance to finish before a leave"
    else:
        count = min(n - desired, s.spec.max_leaving)
        leavers = choose_leavers(obs.active, count, spec_hash, obs.coordinator_pod)
        for p in leavers:
            why = "runs an old spec (rolling update)" if p.spec_hash != spec_hash else f"scaling down to {desired}"
            out.actions.append(RequestLeave(p.name, why))
            out.events.append(Event("Normal", "MemberLeaving", f"asking member {p.name} to leave gracefully: {why}"))
        out.message = f"asking {', '.join(p.name for p in leavers)} to leave: {n} -> {desired} members"


def _surge_for_new_spec(s: _Step) -> None:
    """Rule 6: once the group is stable, add one member on the new spec."""
    out = s.out
    out.phase = "Updating"
    if not s.obs.well_formed or s.obs.rebalancing:
        out.message = "rolling update: waiting for the group to settle before the next member"
    else:
        ordinal = free_ordinal(s.pods)
        reason = f"rolling update: {len(s.outdated)} member(s) on an old spec"
        out.actions.append(CreatePod(ordinal, reason, initial_cluster_size_for(s.ready)))
        out.events.append(Event("Normal", "MemberCreated", f"creating member pod {s.spec.name}-{ordinal} ({reason})"))
        out.message = reason


def _steady(s: _Step) -> None:
    """Nothing to do: the phase says what the cluster is (stopped, rebalancing, split, or running)."""
    obs, out = s.obs, s.out
    if s.desired == 0 and not [p for p in s.pods if not p.finished]:
        out.phase, out.message = "Stopped", "no members (replicas 0)"
    elif obs.rebalancing:
        out.phase, out.message = "Rebalancing", "the grid is moving segments"
    elif not obs.well_formed:
        out.phase, out.message = "Degraded", "the members do not agree on one view"
    else:
        out.phase, out.message = "Running", f"{s.n} member(s) in view {obs.view_id}"


def _back_off(s: _Step) -> None:
    """Rule 1's pacing: while the back-off runs, the step creates no pod."""
    # The back-off after exits in a row: no new pod until it ends (the failed pods stay until then too).
    out, fail = s.out, s.fail
    wait = fail.wait_seconds(s.now)
    if wait and any(isinstance(a, CreatePod) for a in out.actions):
        out.actions = [a for a in out.actions if not isinstance(a, CreatePod)]
        out.events = [e for e in out.events if e.reason != "MemberCreated"]
        out.phase = "Failing"
        out.message = (
            f"{fail.count} member exits in a row, the last {fail.last_pod}: {fail.last_reason}; "
            f"next attempt in {wait} s"
        )


def _degraded(s: _Step, auth_problem: str | None) -> tuple[list[str], str]:
    """Apply the guards and the degraded grid to the phase and events; returns the Degraded reasons and reason."""
    spec, obs, out = s.spec, s.obs, s.out
    blocked = _guards(spec, obs, out, auth_problem)
    degraded = blocked + obs.degraded_reasons
    grid_text = grid_degraded_text(spec, obs.grid_degraded) if obs.grid_degraded is not None else ""
    if grid_text:
        degraded.append(grid_text)
        if s.waiting_join:
            # Not "waiting to join": a joiner gets no data from a degraded grid; the reason above says why.
            out.message = ""
    if degraded:
        out.phase = "Degraded"
        out.message = "; ".join(degraded) + (f"; {out.message}" if out.message else "")
    reason = "MembersUnavailable"
    if auth_problem:
        reason = "AuthSecretInvalid"
    elif blocked:
        reason = "AuthSettingsDiffer"
    elif grid_text:
        reason = "GridDegraded"
    before = s.prev.get("Degraded") or {}
    if blocked:
        # One Warning per new problem, not one per reconciliation (every few seconds).
        if before.get("status") != "True" or before.get("message") != "; ".join(degraded):
            out.events.append(Event("Warning", reason, "; ".join(blocked)))
    elif grid_text and (before.get("reason") != "GridDegraded" or grid_text not in str(before.get("message") or "")):
        out.events.append(Event("Warning", "GridDegraded", grid_text))
    return degraded, reason


def _guards(spec: ClusterSpec, obs: Observed, out: Plan, auth_problem: str | None) -> list[str]:
    """Drop the actions the guards forbid (module docstring); returns why, for the Degraded condition."""
    blocked: list[str] = []
    forbidden: tuple[type, ...] = ()
    if auth_problem:
        blocked.append(auth_problem + "; no member is created, replaced or asked to leave until it is fixed")
        forbidden = (CreatePod, RequestLeave)
    running = sorted({p.auth_mode for p in obs.active + obs.leaving if p.auth_mode is not None} - {spec.auth.mode})
    if running and any(isinstance(a, CreatePod) for a in out.actions):
        blocked.append(
            f"spec.auth asks for frame authentication {spec.auth.mode!r} but members run {', '.join(running)}: "
            "members that differ cannot read each other's frames, so no member is added; revert spec.auth, or "
            "scale to 0 and back up to apply it (the in-memory data is discarded)"
        )
        forbidden = (*forbidden, CreatePod)
    if forbidden:
        out.actions = [a for a in out.actions if not isinstance(a, forbidden)]
        # Their events announced steps that will not happen now (each reason goes with one kind of action).
        gone = {"MemberCreated"} | ({"MemberLeaving"} if RequestLeave in forbidden else set())
        out.events = [e for e in out.events if e.reason not in gone]
    return blocked
