"""The kopf handlers: thin, they observe and execute; every decision is the planner's.

One timer per GroupCluster runs :func:`reconcile` every ``interval`` seconds (kopf never runs two at once for
one object): it makes sure the supporting objects and the cluster Secret exist, lists the member pods, asks
every running member for ``/v1/status``, hands all of it to :func:`groupcluster_operator.planner.plan`,
executes the returned actions, posts one Kubernetes event per step and writes the status.

The cluster Secret (``spec.auth``, :mod:`groupcluster_operator.auth`) is created once with fresh random keys
and never written again; it is read back through the API (cached for :data:`AUTH_EVERY` seconds) for the
admin token the operator sends on ``POST /v1/leave`` and ``/v1/force-available``, and for the digest of its
keys that is part of the members' spec hash (an edited Secret rolls the members, who read it at start).

Deleting a GroupCluster needs little: everything it created (the Secret too) carries an owner reference, so
the garbage collector removes it; :func:`on_delete` only stops the member pods promptly (the data is
discarded with the resource, there is nobody to hand it to). kopf's finalizer (``groupcluster.io/operator``)
is what lets it run first; :func:`cleanup` removes that finalizer when the operator stops
(:mod:`groupcluster_operator.release`), so a GroupCluster never waits for an operator that is gone.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import secrets
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import kopf

from . import builders, peering
from .actions import CreatePod, DeletePod, Plan, RequestLeave
from .auth import RANDOM_BYTES, AuthMaterial, AuthSecretError, read_auth_secret
from .kubeapi import ApiError, KubeApi
from .model import CLUSTER_LABEL, GROUP, LEAVE_ANNOTATION, PLURAL, STOP_ANNOTATION, VERSION, ClusterSpec, SpecError
from .observations import MemberReport, PodState
from .planner import plan
from .release import FINALIZER, release_finalizers
from .status import invalid_status

log = logging.getLogger("groupcluster_operator")

STATUS_TIMEOUT = 3.0
# Supporting objects (account, role, service, budget) are checked this often, and whenever the spec changes.
ENSURE_EVERY = 30.0
# The cluster Secret is read again this often (a broken one on every reconciliation, to see a fix at once).
AUTH_EVERY = 30.0


@dataclass
class _AuthState:
    """What the operator last read from a cluster's Secret."""

    key: tuple[str, bool]  # (Secret name, kvToken): another Secret or other keys need a fresh read
    when: float
    material: AuthMaterial | None
    problem: str | None
    digest: str = ""  # of the last good read: pods keep their hash while a broken Secret is being fixed


@dataclass
class OperatorConfig:
    """Set by ``groupcluster operator`` before kopf starts (module-level: kopf handlers are module functions)."""

    interval: float = 2.0
    default_image: str = field(default_factory=lambda: os.environ.get("GROUPCLUSTER_MEMBER_IMAGE", ""))
    kubeconfig: str | None = None
    api: KubeApi | None = None
    http: aiohttp.ClientSession | None = None
    ensured: dict[str, tuple[float, str]] = field(default_factory=dict)  # uid -> (when, spec hash)
    auth: dict[str, _AuthState] = field(default_factory=dict)  # uid -> the Secret as last read
    # uid -> (resourceVersion the last step planned from, the status it wrote): see _previous_status
    written: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    namespaces: list[str] | None = None  # what the operator watches (None: every namespace)
    peering: str | None = None  # kopf's peering object of the replicas (None: the operator runs alone)
    active: bool = False  # this replica has reconciled since it started (with peering: it is the one at work)
    logins: int = 0  # kopf's calls of the login handler


CONFIG = OperatorConfig()


async def _api() -> KubeApi:
    if CONFIG.api is None:
        CONFIG.api = await KubeApi.auto(CONFIG.kubeconfig)
    return CONFIG.api


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    # Our own annotation names, and no status.kopf field (our status schema is strict and would prune it).
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.persistence.finalizer = FINALIZER
    settings.posting.level = logging.INFO
    settings.watching.server_timeout = 300
    settings.networking.request_timeout = 30
    # No cluster-wide scans of namespaces and CRDs: the operator watches the namespaces it was given (or all,
    # with one cluster-wide watch), and `groupcluster operator` checks the CRD before kopf starts. With the
    # scans on, a namespaced install (a Role, no ClusterRole) had kopf retry the forbidden cluster-wide lists for
    # about 50 s, logging an ERROR for each attempt, before it reconciled anything.
    settings.scanning.disabled = True
    # With --peering: how long a killed replica's keep-alive counts before a standby takes over.
    settings.peering.lifetime = peering.LIFETIME


@kopf.on.cleanup()
async def cleanup(**_: Any) -> None:
    """On exit: hand the GroupClusters over (no finalizer left for a gone operator), close the clients.

    A standby replica that never reconciled leaves the finalizer alone: the replica at work still handles the
    GroupClusters' deletion, and a standby must not act on them, not even on its way out.
    """
    if CONFIG.peering and not CONFIG.active:
        log.info("standby replica of peering %r: leaving the GroupClusters to the replica at work", CONFIG.peering)
    elif CONFIG.api is not None:
        try:
            released = await release_finalizers(CONFIG.api, CONFIG.namespaces)
        except ApiError as exc:
            log.warning("could not remove the operator's finalizer from the GroupClusters on exit: %s", exc)
        else:
            if released:
                log.info("released %d GroupCluster(s) on exit: %s", len(released), ", ".join(released))
    if CONFIG.http is not None:
        await CONFIG.http.close()
        CONFIG.http = None
    if CONFIG.api is not None:
        await CONFIG.api.close()
        CONFIG.api = None


@kopf.on.login()
async def login(**_: Any) -> Any:
    """The operator's identity for kopf's own calls: the same as :class:`KubeApi` uses.

    kopf asks again when the credential expires (a bound token's minute, an exec credential's expiry) and
    after a 401, and gets the renewed one.
    """
    CONFIG.logins += 1
    return await (await _api()).connection_info(renew=CONFIG.logins > 1)


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


async def post_admin(pod: PodState, port: int, path: str, token: str | None) -> tuple[int, str]:
    """POST an admin endpoint of a member with the admin token; (HTTP status or 0 without an answer, text)."""
    if not pod.ip:
        return 0, "the pod has no IP"
    session = await _http()
    headers = {"Authorization": f"Bearer {token}"} if token else None
    try:
        async with session.post(f"http://{_host(pod.ip)}:{port}{path}", headers=headers) as resp:
            return resp.status, (await resp.text())[:200]
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        return 0, f"{type(exc).__name__}: {exc}"


async def request_leave(pod: PodState, port: int, token: str | None = None) -> tuple[int, str | None]:
    """POST /v1/leave; returns (status, error text), the error None when the member accepted (202)."""
    status, text = await post_admin(pod, port, "/v1/leave", token)
    if status == 202:
        return status, None
    return status, f"HTTP {status}: {text}" if status else text


async def request_force_available(pod: PodState, port: int, token: str | None = None) -> tuple[int, str]:
    """POST /v1/force-available to the coordinator's member (ends a degraded mode: see docs/operator.md)."""
    return await post_admin(pod, port, "/v1/force-available", token)


def _host(ip: str) -> str:
    return f"[{ip}]" if ":" in ip else ip


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def _ensure_supporting(api: KubeApi, spec: ClusterSpec, uid: str) -> None:
    when, done_hash = CONFIG.ensured.get(uid, (0.0, ""))
    loop = asyncio.get_running_loop()
    spec_hash = spec.pod_hash() + str(spec.max_unavailable)
    if done_hash == spec_hash and loop.time() - when < ENSURE_EVERY:
        return
    await _replace_old_headless_service(api, spec, uid)
    for manifest in builders.build_supporting_objects(spec, uid):
        if await api.ensure(manifest):
            log.info("%s/%s: created %s %s", spec.namespace, spec.name, manifest["kind"], manifest["metadata"]["name"])
    pdb = builders.build_pod_disruption_budget(spec, uid)
    current = await api.get(pdb)
    if current is not None and current.get("spec", {}).get("maxUnavailable") != pdb["spec"]["maxUnavailable"]:
        await api.merge_patch(pdb, {"spec": {"maxUnavailable": pdb["spec"]["maxUnavailable"]}})
    CONFIG.ensured[uid] = (loop.time(), spec_hash)


async def _replace_old_headless_service(api: KubeApi, spec: ClusterSpec, uid: str) -> None:
    """Delete this cluster's headless Service that still holds the cluster's name (older operators named it so):
    that name is now the client Service's, and a Service cannot stop being headless in place."""
    client = builders.build_client_service(spec, uid)
    current = await api.get(client)
    if current is None or (current.get("spec") or {}).get("clusterIP") != "None":
        return
    if not any(ref.get("uid") == uid for ref in (current.get("metadata") or {}).get("ownerReferences") or ()):
        return  # not ours: ensure() leaves it alone
    await api.delete(client)
    log.info(
        "%s/%s: replaced the headless Service %s by the client Service of that name (headless now: %s)",
        spec.namespace,
        spec.name,
        spec.name,
        builders.headless_service_name(spec),
    )


def _secret_ref(spec: ClusterSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": spec.auth_secret_name, "namespace": spec.namespace},
    }


async def _ensure_auth(api: KubeApi, spec: ClusterSpec, uid: str, keyed_members: int) -> _AuthState | None:
    """The cluster Secret, created when missing (never overwritten), read and checked; None without spec.auth.

    ``keyed_members``: running members that read a Secret. While there are any, a missing Secret is not
    recreated: new keys would start members that cannot talk to them (a split), so it is reported instead.
    """
    if not spec.auth.enabled:
        CONFIG.auth.pop(uid, None)
        return None
    loop = asyncio.get_running_loop()
    key = (spec.auth_secret_name, spec.auth.kv_token)
    state = CONFIG.auth.get(uid)
    if state is not None and state.key == key and state.problem is None and loop.time() - state.when < AUTH_EVERY:
        return state
    digest = state.digest if state is not None and state.key[0] == key[0] else ""
    name = f"{spec.namespace}/{spec.auth_secret_name}"
    try:
        obj = await api.get(_secret_ref(spec))
        if obj is None and not spec.auth.existing_secret and keyed_members:
            raise AuthSecretError(
                f"Secret {name} is gone while {keyed_members} member(s) run with its keys: new keys would split "
                "the cluster, so the operator does not make one; recreate it with the same keys (the members hold "
                "them in their mounted files), or delete the member pods to start afresh (their data is lost)"
            )
        if obj is None and not spec.auth.existing_secret:
            manifest = builders.build_auth_secret(
                spec,
                uid,
                cluster_secret=secrets.token_urlsafe(RANDOM_BYTES),
                admin_token=secrets.token_urlsafe(RANDOM_BYTES),
                kv_token=secrets.token_urlsafe(RANDOM_BYTES),
            )
            try:
                obj = await api.create(manifest)
                log.info("%s/%s: created Secret %s (cluster key and tokens)", spec.namespace, spec.name, name)
            except ApiError as exc:
                if exc.status != 409:
                    raise
                # Created meanwhile (an operator restart racing this one): use that one, never ours.
                obj = await api.get(_secret_ref(spec))
        material = read_auth_secret(spec, obj)
    except AuthSecretError as exc:
        state = _AuthState(key, loop.time(), None, str(exc), digest)
    except ApiError as exc:
        state = _AuthState(key, loop.time(), None, f"Secret {name} cannot be read or created ({exc})", digest)
    else:
        state = _AuthState(key, loop.time(), material, None, material.digest)
    CONFIG.auth[uid] = state
    return state


def _pod_ref(spec: ClusterSpec, name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": spec.namespace}}


def _annotate(key: str) -> dict[str, Any]:
    return {"metadata": {"annotations": {key: _now()}}}


async def _execute(
    api: KubeApi, spec: ClusterSpec, uid: str, step: Plan, pods: dict[str, PodState], spec_hash: str, token: str | None
) -> list[str]:
    """Carry out the plan's actions; returns what failed (as event messages)."""
    failed = []
    for action in step.actions:
        try:
            if isinstance(action, CreatePod):
                pod_manifest = builders.build_member_pod(
                    spec, uid, action.ordinal, spec_hash, initial_cluster_size=action.initial_cluster_size
                )
                await api.create(pod_manifest)
            elif isinstance(action, DeletePod):
                pod = pods[action.pod]
                if not pod.leave_requested:
                    # Says "the operator stopped it" to the planner (not someone else's deletion to replace),
                    # also for a pod that already finished: one seen terminating and finished at once could
                    # otherwise be either ours or someone else's.
                    try:
                        await api.merge_patch(_pod_ref(spec, pod.name), _annotate(STOP_ANNOTATION))
                    except ApiError as exc:
                        if exc.status != 404:
                            raise
                await api.delete_pod(spec.namespace, action.pod, action.grace_seconds)
            elif isinstance(action, RequestLeave):
                pod = pods[action.pod]
                # The annotation first: it is what says "leaving" to the planner, across operator restarts.
                await api.merge_patch(_pod_ref(spec, pod.name), _annotate(LEAVE_ANNOTATION))
                status, error = await request_leave(pod, spec.http_port, token)
                if status == 401:
                    # The member holds another admin token (the Secret was edited after it started; it runs an
                    # old spec hash and is rolling out anyway). Deleting its pod sends SIGTERM, which hands the
                    # data off and leaves exactly like POST /v1/leave; the pod's grace period covers that.
                    CONFIG.auth.pop(uid, None)
                    await api.delete_pod(spec.namespace, pod.name)
                    failed.append(
                        f"{pod.name} refused the admin token (HTTP 401): stopping it through its pod instead "
                        "(SIGTERM hands its data off the same way)"
                    )
                elif error is not None:
                    failed.append(f"asking {pod.name} to leave failed ({error}); will ask again")
        except ApiError as exc:
            failed.append(f"{type(action).__name__} {getattr(action, 'pod', '')}: {exc}")
    return failed


def _previous_status(uid: str, resource_version: str, current: dict[str, Any]) -> dict[str, Any]:
    """The status the last step left: the body's, or, while the body is still the one that step planned from
    (the watch has not delivered the status it wrote yet: same resourceVersion), the status that step wrote.

    The planner reads what it decided last time from there (e.g. which vanished pod was deleted by someone else):
    planning twice from the same old status would forget a step's observation.
    """
    last = CONFIG.written.get(uid)
    if last is not None and last[0] == resource_version:
        return {**current, **last[1]}
    return current


def _changed(status: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
    """Only the status fields that differ (a timer every few seconds should not rewrite an unchanged status)."""
    return {k: v for k, v in status.items() if current.get(k) != v}


def _at_work() -> None:
    """Note (and with peering, log once) that this replica acts: kopf runs handlers only in the replica at work."""
    if not CONFIG.active:
        CONFIG.active = True
        if CONFIG.peering:
            log.info("active replica of peering %r: reconciling", CONFIG.peering)


async def reconcile(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
    api = await _api()
    _at_work()
    meta = body.get("metadata") or {}
    uid = str(meta.get("uid"))
    current_status = dict(body.get("status") or {})
    planned_from = str(meta.get("resourceVersion"))  # kopf may refresh the body while this step runs
    if meta.get("deletionTimestamp"):
        return  # being deleted: on_delete stops the members; creating one now would only delay that
    try:
        spec = ClusterSpec.from_resource(body, CONFIG.default_image)
    except SpecError as exc:
        if current_status.get("message") != str(exc):
            kopf.warn(body, reason="InvalidSpec", message=str(exc))
            log.warning("%s/%s: InvalidSpec: %s", meta.get("namespace"), meta.get("name"), exc)
        invalid = invalid_status(str(exc), current_status.get("conditions") or (), _now())
        invalid["observedGeneration"] = meta.get("generation")
        for key, value in _changed(invalid, current_status).items():
            patch.status[key] = value
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
    keyed = sum(1 for p in pods if p.auth_mode not in (None, "off") and not p.finished)
    auth = await _ensure_auth(api, spec, uid, keyed)
    material = auth.material if auth is not None else None
    spec_hash = spec.pod_hash(auth.digest if auth is not None else "")
    results = await asyncio.gather(*(fetch_report(p, spec.http_port) for p in pods))
    reports = {p.name: r for p, r in zip(pods, results, strict=True)}
    step = plan(
        spec,
        pods,
        reports,
        spec_hash=spec_hash,
        previous_status=_previous_status(uid, planned_from, current_status),
        now=_now(),
        auth_problem=auth.problem if auth is not None else None,
    )
    token = material.admin_token if material is not None else None
    failed = await _execute(api, spec, uid, step, {p.name: p for p in pods}, spec_hash, token)
    for ev in step.events:
        kopf.event(body, type=ev.type, reason=ev.reason, message=ev.message)
        level = logging.WARNING if ev.type == "Warning" else logging.INFO
        log.log(level, "%s/%s: %s: %s", spec.namespace, spec.name, ev.reason, ev.message)
    for msg in failed:
        kopf.warn(body, reason="StepFailed", message=msg)
        log.warning("%s/%s: %s", spec.namespace, spec.name, msg)
    status = dict(step.status)
    status["observedGeneration"] = meta.get("generation")
    status["clientService"] = builders.client_service_name(spec)
    for key, value in _changed(status, current_status).items():
        patch.status[key] = value
    CONFIG.written[uid] = (planned_from, status)


# Deleting a GroupCluster discards its (in-memory) data: members are stopped at once rather than each waiting
# out a hand-off to peers that are stopping too.
DELETE_GRACE_SECONDS = 5


async def on_delete(body: kopf.Body, **_: Any) -> None:
    """Stop the member pods promptly; the garbage collector removes the rest (owner references)."""
    _at_work()
    meta = body.get("metadata") or {}
    name, namespace, uid = meta.get("name"), meta.get("namespace"), meta.get("uid")
    api = await _api()
    pods = await api.list_pods(str(namespace), f"{CLUSTER_LABEL}={name}")
    owned = [p for p in pods if any(r.get("uid") == uid for r in p["metadata"].get("ownerReferences") or ())]
    for pod in owned:
        await api.delete_pod(str(namespace), pod["metadata"]["name"], DELETE_GRACE_SECONDS)
    CONFIG.ensured.pop(str(uid), None)
    CONFIG.auth.pop(str(uid), None)
    CONFIG.written.pop(str(uid), None)
    log.info("%s/%s: deleted; stopped %d member pod(s)", namespace, name, len(owned))


def register(interval: float) -> None:
    """Register the reconciliation timer (at start-up, once the interval is known)."""
    kopf.timer(GROUP, VERSION, PLURAL, interval=interval, initial_delay=0.0, id="reconcile")(reconcile)
    kopf.on.delete(GROUP, VERSION, PLURAL, id="stop-members")(on_delete)
