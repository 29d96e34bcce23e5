"""Hand the GroupClusters over when the operator goes away: no finalizer waits for an operator that is gone.

kopf puts its finalizer (:data:`FINALIZER`) on every GroupCluster it runs the reconciliation timer for, so that
the operator sees a deletion before the object disappears (it then stops the members at once). Only a running
operator removes it: without one, ``kubectl delete groupcluster`` would wait forever. The clusters themselves
need no operator to keep running (members, Service and budget are plain objects), so when the operator stops
it removes its finalizer from every GroupCluster it watched (:func:`release_finalizers`, from the kopf cleanup
handler). They run on unmanaged; deleting one then lets the garbage collector remove what it owns (the members
get their normal grace period); a new operator puts the finalizer back when it starts and carries on from
what the pods say.

``helm uninstall`` deletes the operator's Role together with its Deployment, so the operator's own cleanup
would be refused; the chart's pre-delete hook runs :func:`hand_over` first, with the Role still in place: it
scales the operator's Deployment to 0, waits until its pods are gone, and removes whatever finalizer is left
(an operator that was not running, or crashed, could not).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from .kubeapi import ApiError, KubeApi
from .model import GROUP

FINALIZER = f"{GROUP}/operator"


def removal_patch(finalizers: Sequence[str]) -> list[dict[str, object]] | None:
    """A JSON patch that removes :data:`FINALIZER` and nothing else, or None when it is not there.

    The ``test`` makes the server refuse it (422) if the list changed since it was read, so another
    controller's finalizer is never removed by accident.
    """
    if FINALIZER not in finalizers:
        return None
    i = list(finalizers).index(FINALIZER)
    return [
        {"op": "test", "path": f"/metadata/finalizers/{i}", "value": FINALIZER},
        {"op": "remove", "path": f"/metadata/finalizers/{i}"},
    ]


async def release_finalizers(api: KubeApi, namespaces: Sequence[str] | None) -> list[str]:
    """Remove the operator's finalizer from every GroupCluster in ``namespaces`` (None: all); the released.

    A GroupCluster whose finalizers changed meanwhile is read again (a few times); a missing CRD or
    namespace means nothing to release.
    """
    released: list[str] = []
    for namespace in [None] if namespaces is None else namespaces:
        for _ in range(3):
            try:
                items = await api.list_groupclusters(namespace)
            except ApiError as exc:
                if exc.status == 404:
                    break
                raise
            conflict = False
            for item in items:
                meta = item.get("metadata") or {}
                patch = removal_patch(meta.get("finalizers") or ())
                if patch is None:
                    continue
                try:
                    await api.json_patch_groupcluster(meta["namespace"], meta["name"], patch)
                except ApiError as exc:
                    if exc.status == 404:
                        continue
                    if exc.status == 422:
                        conflict = True
                        continue
                    raise
                released.append(f"{meta['namespace']}/{meta['name']}")
            if not conflict:
                break
    return released


# A timeout parameter (ASYNC109): running out is an answer (False), not the error asyncio.timeout() raises.
async def stop_deployment(api: KubeApi, namespace: str, name: str, timeout: float = 120.0) -> bool:  # noqa: ASYNC109
    """Scale the Deployment to 0 and wait until none of its pods is left; False if it is still running then.

    A missing Deployment counts as stopped.
    """
    try:
        deployment = await api.read_deployment(namespace, name)
        await api.scale_deployment(namespace, name, 0)
    except ApiError as exc:
        if exc.status == 404:
            return True
        raise
    labels = ((deployment.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        # Gone means gone: a terminating operator pod may still be in its cleanup.
        pods = await api.list_pods(namespace, selector)
        if not pods:
            return True
        if loop.time() > deadline:
            return False
        await asyncio.sleep(1.0)


async def hand_over(api: KubeApi, namespace: str, deployment: str, namespaces: Sequence[str] | None) -> int:
    """Helm's pre-delete hook: stop the operator, then release every GroupCluster it watched; an exit code."""
    try:
        stopped = await stop_deployment(api, namespace, deployment)
        if not stopped:
            print(
                f"groupcluster operator: Deployment {namespace}/{deployment} still has pods after 120 s; "
                "releasing the GroupClusters anyway",
                flush=True,
            )
        released = await release_finalizers(api, namespaces)
    except ApiError as exc:
        print(f"groupcluster operator: hand-over failed: {exc}", flush=True)
        return 1
    finally:
        await api.close()
    where = "every namespace" if namespaces is None else ", ".join(namespaces)
    print(
        f"groupcluster operator: stopped Deployment {namespace}/{deployment}; GroupClusters in {where} keep "
        f"running without an operator ({len(released)} finalizer(s) removed here"
        + (f": {', '.join(released)}" if released else "")
        + ")",
        flush=True,
    )
    return 0
