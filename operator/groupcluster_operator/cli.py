"""``groupcluster operator``: run the kopf operator that manages GroupCluster resources.

By default it watches its own namespace only (what the Helm chart's namespaced RBAC allows); ``--namespace``
(repeatable) names others and ``--all-namespaces`` watches the whole cluster (the chart's ``clusterWide``
option grants that). Credentials: the pod's service account in a cluster, else ``--kubeconfig`` /
``$KUBECONFIG``. ``GROUPCLUSTER_MEMBER_IMAGE`` (or ``--member-image``) is the image of members whose
GroupCluster names none: the chart sets it to the operator's own image.

kopf runs with its cluster-wide scans off (namespaces and CRDs): a namespaced install may not list them, so
the operator checks at start that the GroupCluster CRD is served and exits with a message when it is not.
``--peering NAME`` (the chart sets it) lets several replicas run: one reconciles, the others stand by and take
over when it dies (:mod:`groupcluster_operator.peering`); without it the operator runs alone (kopf standalone).
On exit it removes its finalizer from the GroupClusters (:mod:`groupcluster_operator.release`);
``--hand-over DEPLOYMENT`` (the chart's pre-delete hook) stops that Deployment first, then does the same.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from typing import Any, cast

from groupcluster.core.errors import ConfigError


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--namespace",
        "-n",
        dest="namespaces",
        action="append",
        default=[],
        metavar="NS",
        help="watch GroupClusters in this namespace (repeatable; default: the operator's own namespace)",
    )
    where.add_argument("--all-namespaces", "-A", action="store_true", help="watch every namespace (cluster-wide)")
    parser.add_argument("--kubeconfig", help="kubeconfig to use outside a cluster (default $KUBECONFIG)")
    parser.add_argument(
        "--member-image",
        default=os.environ.get("GROUPCLUSTER_MEMBER_IMAGE", ""),
        help="image of members whose GroupCluster sets no spec.image (env GROUPCLUSTER_MEMBER_IMAGE)",
    )
    parser.add_argument(
        "--interval", type=_positive, default=2.0, metavar="SECONDS", help="reconcile every N seconds (default 2)"
    )
    parser.add_argument(
        "--peering",
        metavar="NAME",
        default=os.environ.get("GROUPCLUSTER_PEERING", ""),
        help="run as one of several replicas peering through kopf's peering object NAME: the oldest live replica "
        "reconciles, the others stand by (needs kopf's peering CRDs: crds/kopf-peering.yaml; env "
        "GROUPCLUSTER_PEERING). Default: run alone",
    )
    parser.add_argument(
        "--peering-label",
        type=_key_value,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a label on each peering object the operator makes when it is missing (repeatable; the Helm chart "
        "passes its release's marks so that Helm adopts an object its operator made first)",
    )
    parser.add_argument(
        "--peering-annotation",
        type=_key_value,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an annotation on each peering object the operator makes when it is missing (repeatable)",
    )
    parser.add_argument(
        "--liveness",
        metavar="URL",
        help="serve kopf's liveness probe here, e.g. http://0.0.0.0:8081/healthz",
    )
    parser.add_argument(
        "--hand-over",
        metavar="DEPLOYMENT",
        help="do not run: scale the operator Deployment DEPLOYMENT (in the operator's namespace) to 0, wait for its "
        "pods to exit, remove the operator's finalizer from the GroupClusters it watched, and exit (the Helm "
        "chart's pre-delete hook; the clusters keep running without an operator)",
    )


def _own_namespace(api_namespace: str | None) -> str:
    return os.environ.get("POD_NAMESPACE") or api_namespace or "default"


class QuietTimers(logging.Filter):
    """Drops kopf's "Timer 'reconcile' succeeded." at INFO: one line per GroupCluster every interval."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.INFO:
            return True
        text = record.getMessage()
        return not (text.startswith("Timer ") and text.endswith(" succeeded."))


class SecondSignal(logging.Filter):
    """Drops asyncio's ERROR for a second SIGTERM/SIGINT while kopf stops: kopf's signal handler sets a future
    that the first signal already set. The operator is stopping either way; nothing failed."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (
            isinstance(exc, asyncio.InvalidStateError)
            and record.getMessage().startswith("Exception in callback Future.set_result(<Signals.")
        )


class RetriedRequest(logging.Filter):
    """Logs kopf's "Request attempt #N failed; will retry" and "...; will re-authenticate" as WARNINGs: kopf
    repeats the request (with fresh credentials after a rotated token closed the session), so nothing has failed
    yet. The last attempt ("...; escalating") stays an ERROR."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.ERROR:
            text = record.getMessage()
            if text.startswith("Request attempt ") and ("; will retry: " in text or "; will re-authenticate: " in text):
                record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def quiet_logging() -> None:
    """At INFO the operator logs its steps, not the noise of the libraries under it."""
    # kopf's request retries log through the logger of whoever asked (its modules' loggers, kopf.objects).
    for name in ["kopf", *(n for n in logging.Logger.manager.loggerDict if n.startswith("kopf."))]:
        kopf_logger = logging.getLogger(name)
        if not any(isinstance(f, RetriedRequest) for f in kopf_logger.filters):
            kopf_logger.addFilter(RetriedRequest())
    if logging.getLogger().level > logging.INFO:
        # The operator's steps are its output: show them.
        logging.getLogger("groupcluster_operator").setLevel(logging.INFO)
    objects = logging.getLogger("kopf.objects")
    if not any(isinstance(f, QuietTimers) for f in objects.filters):
        objects.addFilter(QuietTimers())
    if not any(isinstance(f, SecondSignal) for f in logging.getLogger("asyncio").filters):
        logging.getLogger("asyncio").addFilter(SecondSignal())
    # kopf's liveness endpoint is an aiohttp server: its access log would log every probe.
    if logging.getLogger("aiohttp.access").getEffectiveLevel() < logging.WARNING:
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


# How long the start-up check waits for the API server to serve a GroupCluster list (a CRD installed moments
# ago: its storage answers 429 "storage is (re)initializing" for a few seconds, which kopf would log as ERRORs).
SERVED_WAIT = 60.0


async def crd_problem(api: Any, namespaces: list[str] | None = None, wait: float = SERVED_WAIT) -> str | None:
    """Why the operator cannot serve GroupClusters, or None once it can list them where it watches.

    The CRD must be served (kopf reads it once at start: its CRD scans are off), and GroupClusters listable in
    each watched namespace (``None``: cluster-wide). Answers that only mean "not yet" are waited out.
    """
    from .kubeapi import ApiError
    from .model import GROUP, PLURAL, VERSION

    try:
        served = await api.served_resources()
    except ApiError as exc:
        if exc.status != 404:
            return f"cannot read the API server's discovery of {GROUP}/{VERSION}: {exc}"
        served = []
    if PLURAL not in served:
        return (
            f"the API server does not serve {PLURAL}.{GROUP}/{VERSION}: install the CRD first "
            "(`kubectl apply -f crds/`, or the Helm chart), then start the operator"
        )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    for namespace in [None] if namespaces is None else namespaces:
        while True:
            try:
                await api.list_groupclusters(namespace, limit=1)
                break
            except ApiError as exc:
                where = "cluster-wide" if namespace is None else f"in namespace {namespace}"
                if exc.status in (401, 403):
                    return f"cannot list {PLURAL} {where} (check the operator's RBAC): {exc}"
                if exc.status not in (0, 429) and exc.status < 500:
                    return f"cannot list {PLURAL} {where}: {exc}"
                if loop.time() > deadline:
                    return f"the API server does not serve {PLURAL} {where} yet after {wait:.0f} s: {exc}"
            await asyncio.sleep(1.0)
    return None


def run(args: argparse.Namespace) -> int:
    import kopf

    from . import handlers
    from .kubeapi import ApiError, KubeApi
    from .peering import LIFETIME, announce, peering_problem, replica_identity, start_priority
    from .release import hand_over

    quiet_logging()
    # Taken before anything slow: the replica started first must rank first.
    priority = start_priority()

    async def main() -> int:
        # One event loop for everything: the client's connections belong to the loop that opened them.
        try:
            api = await KubeApi.auto(args.kubeconfig)
        except ConfigError as exc:
            print(f"groupcluster operator: error: {exc}", file=sys.stderr)
            return 2
        namespaces = [] if args.all_namespaces else (args.namespaces or [_own_namespace(api.namespace)])
        where = "all namespaces" if args.all_namespaces else ", ".join(namespaces)
        if args.hand_over:
            own = _own_namespace(api.namespace)
            return await hand_over(api, own, args.hand_over, None if args.all_namespaces else namespaces)
        handlers.CONFIG.api = api
        handlers.CONFIG.kubeconfig = args.kubeconfig
        handlers.CONFIG.interval = args.interval
        handlers.CONFIG.default_image = args.member_image
        handlers.CONFIG.namespaces = None if args.all_namespaces else namespaces
        handlers.CONFIG.peering = args.peering or None
        handlers.register(args.interval)
        watched = None if args.all_namespaces else namespaces
        identity = replica_identity()
        try:
            problem = await crd_problem(api, watched)
            if problem is None and args.peering:
                metadata = {"labels": dict(args.peering_label), "annotations": dict(args.peering_annotation)}
                problem = await peering_problem(api, args.peering, watched, metadata)
            if problem is None and args.peering:
                await announce(api, args.peering, watched, identity, priority)
        except ConfigError as exc:
            problem = str(exc)
        except ApiError as exc:
            problem = f"--peering {args.peering}: cannot write this replica's keep-alive: {exc}"
        if problem:
            await api.close()
            print(f"groupcluster operator: error: {problem}", file=sys.stderr)
            return 2
        print(f"groupcluster operator: watching GroupClusters in {where} at {api.server}", flush=True)
        if not args.peering:
            await kopf.operator(
                standalone=True,
                clusterwide=bool(args.all_namespaces),
                namespaces=namespaces,
                liveness_endpoint=args.liveness,
            )
            return 0
        print(
            f"groupcluster operator: peering {args.peering!r} as {identity} (priority {priority}): reconciling only "
            f"while no older replica lives, else standing by (a dead one is replaced within {LIFETIME} s)",
            flush=True,
        )
        await kopf.operator(
            standalone=False,
            peering_name=args.peering,
            priority=priority,
            identity=cast(Any, identity),  # kopf's Identity: a NewType of str that kopf does not export
            clusterwide=bool(args.all_namespaces),
            namespaces=namespaces,
            liveness_endpoint=args.liveness,
        )
        return 0

    return asyncio.run(main())
