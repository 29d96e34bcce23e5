"""The kopf handlers: thin, they observe and execute; every decision is the planner's.

One timer per GroupCluster runs :func:`reconcile` every ``interval`` seconds (kopf never runs two at once for
one object): it makes sure the supporting objects exist, lists the member pods, asks every running member
for ``/v1/status``, hands all of it to :func:`groupcluster_operator.planner.plan`, executes the returned
actions, posts one Kubernetes event per step and writes the status. Deleting a GroupCluster needs little:
everything it created carries an owner reference, so the garbage collector removes it; :func:`on_delete` only
stops the member pods promptly (the data is discarded with the resource, there is nobody to hand it to).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import kopf

from . import builders
from .kubeapi import ApiError, KubeApi
from .model import CLUSTER_LABEL, GROUP, LEAVE_ANNOTATION, PLURAL, VERSION, ClusterSpec, SpecError
from .planner import CreatePod, DeletePod, MemberReport, Plan, PodState, RequestLeave, plan

log = logging.getLogger("groupcluster_operator")

STATUS_TIMEOUT = 3.0
# Supporting objects (account, role, service, budget) are checked this often, and whenever the spec changes.
ENSURE_EVERY = 30.0


@dataclass
class OperatorConfig:
    """Set by ``groupcluster operator`` before kopf starts (module-level: kopf handlers are module functions)."""

    interval: float = 2.0
    default_image: str = field(default_factory=lambda: os.environ.get("GROUPCLUSTER_MEMBER_IMAGE", ""))
    kubeconfig: str | None = None
    api: KubeApi | None = None
    http: aiohttp.ClientSession | None = None
    ensured: dict[str, tuple[float, str]] = field(default_factory=dict)  # uid -> (when, spec hash)


CONFIG = OperatorConfig()


def _api() -> KubeApi:
    if CONFIG.api is None:
        CONFIG.api = KubeApi.auto(CONFIG.kubeconfig)
    return CONFIG.api


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    # Our own annotation names, and no status.kopf field (our status schema is strict and would prune it).
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.persistence.finalizer = f"{GROUP}/operator"
    settings.posting.level = logging.INFO
    settings.watching.server_timeout = 300
    settings.networking.request_timeout = 30


@kopf.on.cleanup()
async def cleanup(**_: Any) -> None:
    if CONFIG.http is not None:
        await CONFIG.http.close()
        CONFIG.http = None
    if CONFIG.api is not None:
        await CONFIG.api.close()
        CONFIG.api = None


@kopf.on.login()
def login(**_: Any) -> Any:
    """The operator's identity for kopf's own calls: the same as :class:`KubeApi` uses."""
    return _api().connection_info()


async def _http() -> aiohttp.ClientSession:
    if CONFIG.http is None or CONFIG.http.closed:
        CONFIG.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=STATUS_TIMEOUT))
    return CONFIG.http


async def fetch_report(pod: PodState, port: int) -> MemberReport | None:
    """A member's ``/v1/status``, or None when it does not answer (starting, gone, hung)."""
    if not pod.ip or pod.phase != "Running":
        return None
    session = await _http()
    try:
        async with session.get(f"http://{_host(pod.ip)}:{port}/v1/status") as resp:
            if resp.status != 200:
                return None
            return MemberReport.from_status(await resp.json())
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
        return None


async def request_leave(pod: PodState, port: int) -> str | None:
    """POST /v1/leave; returns an error text, or None when the member accepted."""
    if not pod.ip:
        return "the pod has no IP"
    session = await _http()
    try:
        async with session.post(f"http://{_host(pod.ip)}:{port}/v1/leave") as resp:
            if resp.status == 202:
                return None
            return f"HTTP {resp.status}: {(await resp.text())[:200]}"
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        return f"{type(exc).__name__}: {exc}"


def _host(ip: str) -> str:
    return f"[{ip}]" if ":" in ip else ip


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def _ensure_supporting(api: KubeApi, spec: ClusterSpec, uid: str) -> None:
    when, done_hash = CONFIG.ensured.get(uid, (0.0, ""))
    loop = asyncio.get_running_loop()
    spec_hash = spec.pod_hash() + str(spec.num_owners)
    if done_hash == spec_hash and loop.time() - when < ENSURE_EVERY:
        return
    for manifest in builders.build_supporting_objects(spec, uid):
        if await api.ensure(manifest):
            log.info("%s/%s: created %s %s", spec.namespace, spec.name, manifest["kind"], manifest["metadata"]["name"])
    pdb = builders.build_pod_disruption_budget(spec, uid)
    current = await api.get(pdb)
    if current is not None and current.get("spec", {}).get("maxUnavailable") != pdb["spec"]["maxUnavailable"]:
        await api.merge_patch(pdb, {"spec": {"maxUnavailable": pdb["spec"]["maxUnavailable"]}})
    CONFIG.ensured[uid] = (loop.time(), spec_hash)


async def _execute(api: KubeApi, spec: ClusterSpec, uid: str, step: Plan, pods: dict[str, PodState]) -> list[str]:
    """Carry out the plan's actions; returns what failed (as event messages)."""
    failed = []
    for action in step.actions:
        try:
            if isinstance(action, CreatePod):
                await api.create(builders.build_member_pod(spec, uid, action.ordinal))
            elif isinstance(action, DeletePod):
                await api.delete_pod(spec.namespace, action.pod, action.grace_seconds)
            elif isinstance(action, RequestLeave):
                pod = pods[action.pod]
                # The annotation first: it is what says "leaving" to the planner, across operator restarts.
                ref = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod.name, "namespace": spec.namespace}}
                await api.merge_patch(ref, {"metadata": {"annotations": {LEAVE_ANNOTATION: _now()}}})
                error = await request_leave(pod, spec.http_port)
                if error is not None:
                    failed.append(f"asking {pod.name} to leave failed ({error}); will ask again")
        except ApiError as exc:
            failed.append(f"{type(action).__name__} {getattr(action, 'pod', '')}: {exc}")
    return failed


def _changed(status: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
    """Only the status fields that differ (a timer every few seconds should not rewrite an unchanged status)."""
    return {k: v for k, v in status.items() if current.get(k) != v}


async def reconcile(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
    api = _api()
    meta = body.get("metadata") or {}
    uid = str(meta.get("uid"))
    current_status = dict(body.get("status") or {})
    if meta.get("deletionTimestamp"):
        return  # being deleted: on_delete stops the members; creating one now would only delay that
    try:
        spec = ClusterSpec.from_resource(body, CONFIG.default_image)
    except SpecError as exc:
        if current_status.get("message") != str(exc):
            kopf.warn(body, reason="InvalidSpec", message=str(exc))
        patch.status["phase"] = "Invalid"
        patch.status["message"] = str(exc)
        return
    await _ensure_supporting(api, spec, uid)
    raw_pods = await api.list_pods(spec.namespace, spec.selector)
    # Only pods this GroupCluster owns: a pod that merely carries the label is not ours to delete.
    owned = [
        p
        for p in raw_pods
        if any(ref.get("uid") == uid for ref in (p.get("metadata") or {}).get("ownerReferences") or ())
    ]
    pods = [PodState.from_pod(p) for p in owned]
    results = await asyncio.gather(*(fetch_report(p, spec.http_port) for p in pods))
    reports = {p.name: r for p, r in zip(pods, results, strict=True)}
    step = plan(spec, pods, reports, previous_conditions=current_status.get("conditions") or (), now=_now())
    failed = await _execute(api, spec, uid, step, {p.name: p for p in pods})
    for ev in step.events:
        kopf.event(body, type=ev.type, reason=ev.reason, message=ev.message)
        level = logging.WARNING if ev.type == "Warning" else logging.INFO
        log.log(level, "%s/%s: %s: %s", spec.namespace, spec.name, ev.reason, ev.message)
    for msg in failed:
        kopf.warn(body, reason="StepFailed", message=msg)
        log.warning("%s/%s: %s", spec.namespace, spec.name, msg)
    status = dict(step.status)
    status["observedGeneration"] = meta.get("generation")
    for key, value in _changed(status, current_status).items():
        patch.status[key] = value


# Deleting a GroupCluster discards its (in-memory) data: members are stopped at once rather than each waiting
# out a hand-off to peers that are stopping too.
DELETE_GRACE_SECONDS = 5


async def on_delete(body: kopf.Body, **_: Any) -> None:
    """Stop the member pods promptly; the garbage collector removes the rest (owner references)."""
    meta = body.get("metadata") or {}
    name, namespace, uid = meta.get("name"), meta.get("namespace"), meta.get("uid")
    api = _api()
    pods = await api.list_pods(str(namespace), f"{CLUSTER_LABEL}={name}")
    owned = [p for p in pods if any(r.get("uid") == uid for r in p["metadata"].get("ownerReferences") or ())]
    for pod in owned:
        await api.delete_pod(str(namespace), pod["metadata"]["name"], DELETE_GRACE_SECONDS)
    CONFIG.ensured.pop(str(uid), None)
    log.info("%s/%s: deleted; stopped %d member pod(s)", namespace, name, len(owned))


def register(interval: float) -> None:
    """Register the reconciliation timer (at start-up, once the interval is known)."""
    kopf.timer(GROUP, VERSION, PLURAL, interval=interval, initial_delay=0.0, id="reconcile")(reconcile)
    kopf.on.delete(GROUP, VERSION, PLURAL, id="stop-members")(on_delete)
