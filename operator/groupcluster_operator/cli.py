"""``groupcluster operator``: run the kopf operator that manages GroupCluster resources.

By default it watches its own namespace only (what the Helm chart's namespaced RBAC allows); ``--namespace``
(repeatable) names others and ``--all-namespaces`` watches the whole cluster (the chart's ``clusterWide``
option grants that). Credentials: the pod's service account in a cluster, else ``--kubeconfig`` /
``$KUBECONFIG``. ``GROUPCLUSTER_MEMBER_IMAGE`` (or ``--member-image``) is the image of members whose
GroupCluster names none: the chart sets it to the operator's own image.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from groupcluster.core.errors import ConfigError


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


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
        "--liveness",
        metavar="URL",
        help="serve kopf's liveness probe here, e.g. http://0.0.0.0:8081/healthz",
    )


def _own_namespace(api_namespace: str | None) -> str:
    return os.environ.get("POD_NAMESPACE") or api_namespace or "default"


def run(args: argparse.Namespace) -> int:
    import kopf

    from . import handlers
    from .kubeapi import KubeApi

    if logging.getLogger().level > logging.INFO:
        # The operator's steps are its output: show them (kopf's own INFO lines, one per timer run, are noise).
        logging.getLogger("groupcluster_operator").setLevel(logging.INFO)
    try:
        api = KubeApi.auto(args.kubeconfig)
    except ConfigError as exc:
        print(f"groupcluster operator: error: {exc}", file=sys.stderr)
        return 2
    handlers.CONFIG.api = api
    handlers.CONFIG.kubeconfig = args.kubeconfig
    handlers.CONFIG.interval = args.interval
    handlers.CONFIG.default_image = args.member_image
    handlers.register(args.interval)
    namespaces = [] if args.all_namespaces else (args.namespaces or [_own_namespace(api.namespace)])
    where = "all namespaces" if args.all_namespaces else ", ".join(namespaces)
    print(f"groupcluster operator: watching GroupClusters in {where} at {api.server}", flush=True)
    asyncio.run(
        kopf.operator(
            standalone=True,
            clusterwide=bool(args.all_namespaces),
            namespaces=namespaces,
            liveness_endpoint=args.liveness,
        )
    )
    return 0
