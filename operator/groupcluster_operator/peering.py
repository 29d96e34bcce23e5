"""Two or more operator replicas, one at work: kopf's peering, the oldest live replica reconciling.

Every replica started with ``--peering NAME`` keeps itself alive in kopf's peering object ``NAME``
(a ``KopfPeering`` in each watched namespace, or one ``ClusterKopfPeering`` for ``--all-namespaces``) every few
seconds, with a priority. kopf pauses an operator (no watches, no timers: nothing reconciled) while a live peer
has a higher priority, and resumes it once that peer's keep-alive is older than its lifetime, or at once when
that peer exits and removes itself. kopf freezes *every* operator when two share a priority, so each replica's
priority is derived from its start time: the oldest replica has the highest, a restarted replica stands by
behind the one at work instead of taking over from it.

Before kopf starts, each replica writes its keep-alive itself (:func:`announce`, in kopf's format) and waits a
moment: kopf resumes a replica whose first look at the peering object shows no live peer of higher priority,
so two replicas started together must each see the other's entry by then, or both would act until the
younger one saw the older one's first keep-alive.
"""

from __future__ import annotations

import asyncio
import datetime
import getpass
import os
import socket
import time
from collections.abc import Mapping
from typing import Any

from .kubeapi import ApiError, KubeApi

GROUP = "kopf.dev"
VERSION = "v1"
# Seconds a replica's keep-alive counts: a replica killed outright is replaced by a standby after at most this
# long (kopf renews every lifetime minus 5-10 s, so a live one never lapses).
LIFETIME = 15
# Seconds between a replica's own first keep-alive and kopf's start: far more than one write takes to be seen.
ANNOUNCE_WAIT = 1.0


def start_priority(now_ns: int | None = None) -> int:
    """kopf's priority for a replica starting now: earlier starts rank higher (microseconds, so two replicas
    started together still differ; kopf would freeze both on a tie)."""
    return -((time.time_ns() if now_ns is None else now_ns) // 1000)


def peering_manifests(
    name: str, namespaces: list[str] | None, metadata: Mapping[str, Mapping[str, str]] | None = None
) -> list[dict[str, Any]]:
    """The peering objects the replicas keep-alive in: one per watched namespace, or one cluster-wide.

    ``metadata`` (``labels`` and ``annotations``) goes on each object the operator makes: the Helm chart passes
    its release's ownership marks, so that an install whose operator pod started before Helm created the
    chart's own peering object adopts the one the operator made instead of failing with "already exists".
    """
    api_version = f"{GROUP}/{VERSION}"
    extra = {key: dict(value) for key, value in (metadata or {}).items() if value}
    if namespaces is None:
        return [{"apiVersion": api_version, "kind": "ClusterKopfPeering", "metadata": {"name": name, **extra}}]
    return [
        {"apiVersion": api_version, "kind": "KopfPeering", "metadata": {"name": name, "namespace": ns, **extra}}
        for ns in namespaces
    ]


async def peering_problem(
    api: KubeApi, name: str, namespaces: list[str] | None, metadata: Mapping[str, Mapping[str, str]] | None = None
) -> str | None:
    """Why the replicas cannot peer (the CRD missing, no right to its objects), or None once each peering object
    exists (made here when missing: a replica paused on a missing one would wait forever)."""
    plural = "clusterkopfpeerings" if namespaces is None else "kopfpeerings"
    try:
        served = await api.served_resources(GROUP, VERSION)
    except ApiError as exc:
        if exc.status != 404:
            return f"cannot read the API server's discovery of {GROUP}/{VERSION}: {exc}"
        served = []
    if plural not in served:
        return (
            f"--peering {name}: the API server does not serve {plural}.{GROUP}: install kopf's peering CRDs "
            "(`kubectl apply -f crds/kopf-peering.yaml`, or the Helm chart), or run one operator without --peering"
        )
    for manifest in peering_manifests(name, namespaces, metadata):
        try:
            await api.ensure(manifest)
        except ApiError as exc:
            where = manifest["metadata"].get("namespace")
            return f"--peering {name}: cannot read or create {manifest['kind']} {name}" + (
                f" in namespace {where}: {exc}" if where else f": {exc}"
            )
    return None


def replica_identity() -> str:
    """The replica's key in the peering object: its pod's name in a cluster, else user@host/pid."""
    return os.environ.get("POD_NAME") or f"{getpass.getuser()}@{socket.gethostname()}/{os.getpid()}"


async def announce(
    api: KubeApi, name: str, namespaces: list[str] | None, identity: str, priority: int, wait: float = ANNOUNCE_WAIT
) -> None:
    """Write this replica's keep-alive into each peering object as kopf does, then wait ``wait`` seconds."""
    lastseen = datetime.datetime.now(datetime.UTC).isoformat()
    entry = {"priority": priority, "lifetime": LIFETIME, "lastseen": lastseen}
    for manifest in peering_manifests(name, namespaces):
        await api.merge_patch(manifest, {"status": {identity: entry}})
    await asyncio.sleep(wait)
