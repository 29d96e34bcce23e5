"""Pure builders: the Kubernetes objects of one GroupCluster, as dicts ready for the API server.

Nothing here talks to a cluster; every function takes the :class:`~groupcluster_operator.model.ClusterSpec`
(and the owner's uid for the owner reference) and returns a manifest, so what the operator creates is
unit-tested without one. Every object is owned by its GroupCluster (``ownerReferences``), so deleting the
GroupCluster lets the garbage collector remove everything.
"""

from __future__ import annotations

import copy
from typing import Any

from .auth import (
    ADMIN_TOKEN_KEY,
    CLUSTER_SECRET_KEY,
    KV_TOKEN_KEY,
    MIN_GENERATED_CHARS,
    required_keys,
)
from .model import (
    API_VERSION,
    AUTH_MODE_ANNOTATION,
    CLUSTER_LABEL,
    INITIAL_SIZE_ANNOTATION,
    INITIAL_SIZE_PARAM,
    KIND,
    MANAGED_BY,
    ORDINAL_LABEL,
    PARTITION_HANDLING,
    SPEC_HASH_ANNOTATION,
    ClusterSpec,
)

Manifest = dict[str, Any]

MEMBER_CONTAINER = "member"
# The cluster Secret's volume. Its directory reaches the member through $(GROUPCLUSTER_VOLUME_AUTH), set to the
# mount path: on a real kubelet that is where the files are; the local control plane's node agent (which does
# not honour mount paths) announces each volume's directory under exactly this name, so the same pod runs there.
AUTH_VOLUME = "auth"
AUTH_MOUNT_PATH = "/etc/groupcluster/auth"
AUTH_DIR_ENV = "GROUPCLUSTER_VOLUME_AUTH"
# The image's non-root user and group (Dockerfile): the Secret's files are made readable to that group only.
MEMBER_GID = 10001
AUTH_FILE_MODE = 0o440
# Seconds beyond the grid hand-off for the group leave itself and the process to exit.
EXIT_GRACE = 30


def labels(spec: ClusterSpec, component: str = "member") -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "groupcluster",
        "app.kubernetes.io/instance": spec.name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        CLUSTER_LABEL: spec.name,
    }


def selector_labels(spec: ClusterSpec) -> dict[str, str]:
    """What selects exactly this cluster's member pods (Service, PDB, discovery, status.selector)."""
    return {CLUSTER_LABEL: spec.name, "app.kubernetes.io/component": "member"}


def owner_reference(spec: ClusterSpec, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": spec.name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _metadata(spec: ClusterSpec, uid: str, name: str, component: str = "member") -> dict[str, Any]:
    return {
        "name": name,
        "namespace": spec.namespace,
        "labels": labels(spec, component),
        "ownerReferences": [owner_reference(spec, uid)],
    }


def pod_name(spec: ClusterSpec, ordinal: int) -> str:
    return f"{spec.name}-{ordinal}"


def service_account_name(spec: ClusterSpec) -> str:
    return f"{spec.name}-member"


def client_service_name(spec: ClusterSpec) -> str:
    """The Service clients connect to: the cluster's own name, as Infinispan names its client Service."""
    return spec.name


def headless_service_name(spec: ClusterSpec) -> str:
    """The headless Service of the members' DNS names (``NAME-0.NAME-members``); the cluster's own name is the
    client Service's, the one users type."""
    return f"{spec.name}-members"


def member_args(spec: ClusterSpec, *, initial_cluster_size: int) -> list[str]:
    """The member's command line (after the image's ``groupcluster`` entry point).

    ``initial_cluster_size`` is the planner's per-pod choice (:class:`~groupcluster_operator.actions.CreatePod`):
    1 for a cluster's first member, else one more than the members ready, so a member whose join fails cannot
    start a second, empty grid. ``spec.grid`` cannot set it (:meth:`ClusterSpec.from_resource` refuses it).
    """
    if initial_cluster_size < 1:
        raise ValueError(f"initial_cluster_size: expected at least 1, got {initial_cluster_size}")
    args = [
        "member",
        "--cluster",
        spec.cluster_name,
        "--bind",
        f"$(POD_IP):{spec.member_port}",
        "--transport",
        spec.transport,
        "--stack",
        spec.preset,
        "--grid",
        "--http",
        f"$(POD_IP):{spec.http_port}",
        "--grid-leave-timeout",
        str(spec.leave_timeout),
        "--kube-discovery",
        "--kube-selector",
        spec.selector,
    ]
    grid = {
        **spec.grid,
        "num_owners": str(spec.num_owners),
        "num_segments": str(spec.num_segments),
        "partition_handling": PARTITION_HANDLING[spec.partition_handling],
        INITIAL_SIZE_PARAM: str(initial_cluster_size),
    }
    for key in sorted(grid):
        args += ["--grid-set", f"{key}={grid[key]}"]
    for cache in spec.caches:
        args += ["--cache", cache.member_arg]
    for key in sorted(spec.stack_set):
        args += ["--set", f"{key}={spec.stack_set[key]}"]
    if spec.auth.enabled:
        where = f"$({AUTH_DIR_ENV})"
        args += ["--set", f"transport.auth_secret_file={where}/{CLUSTER_SECRET_KEY}"]
        if spec.auth.encrypt:
            args += ["--set", "transport.encrypt=true"]
        args += ["--admin-token-file", f"{where}/{ADMIN_TOKEN_KEY}"]
        if spec.auth.kv_token:
            args += ["--kv-token-file", f"{where}/{KV_TOKEN_KEY}"]
    return args


def _protocol(spec: ClusterSpec) -> str:
    return "UDP" if spec.transport == "udp" else "TCP"


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def build_member_pod(
    spec: ClusterSpec, uid: str, ordinal: int, spec_hash: str | None = None, *, initial_cluster_size: int
) -> Manifest:
    """One member pod: image, args, env, ports, /healthz and /readyz probes, labels, owner reference.

    ``restartPolicy: Never``: a member that exits (it left, or it crashed) is not restarted in place; the
    operator decides what replaces it, so a member never rejoins behind the planner's back.

    ``initial_cluster_size`` (see :func:`member_args`) goes on the command line and in an annotation for the
    planner, but not into the spec hash: it differs per pod by design, and must not make a pod outdated.
    """
    name = pod_name(spec, ordinal)
    meta = _metadata(spec, uid, name)
    meta["labels"][ORDINAL_LABEL] = str(ordinal)
    meta["annotations"] = {
        SPEC_HASH_ANNOTATION: spec_hash or spec.pod_hash(),
        AUTH_MODE_ANNOTATION: spec.auth.mode,
        INITIAL_SIZE_ANNOTATION: str(initial_cluster_size),
    }
    tmpl = spec.pod_template
    tmeta = tmpl.get("metadata") or {}
    tspec = tmpl.get("spec") or {}
    # Template labels never override ours: the selector and the planner depend on them.
    meta["labels"] = {**(tmeta.get("labels") or {}), **meta["labels"]}
    meta["annotations"] = {**(tmeta.get("annotations") or {}), **meta["annotations"]}
    env = [
        _field_env("POD_IP", "status.podIP"),
        _field_env("POD_NAME", "metadata.name"),
        _field_env("POD_NAMESPACE", "metadata.namespace"),
        *copy.deepcopy(tspec.get("env") or []),
    ]
    if spec.auth.enabled:
        # Before the template's env cannot matter: Kubernetes expands $(VAR) in args from the final env list.
        env.insert(3, {"name": AUTH_DIR_ENV, "value": AUTH_MOUNT_PATH})
    http_probe = {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 10, "failureThreshold": 3}
    container: dict[str, Any] = {
        "name": MEMBER_CONTAINER,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "args": member_args(spec, initial_cluster_size=initial_cluster_size),
        "env": env,
        # A member that exits with an error leaves the end of its log as the termination message: the operator
        # shows it in the GroupCluster's status (why the member failed, without kubectl logs).
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "ports": [
            {"name": "member", "containerPort": spec.member_port, "protocol": _protocol(spec)},
            {"name": "http", "containerPort": spec.http_port, "protocol": "TCP"},
        ],
        # Ready = joined through the group's flush and no state transfer pending for this member.
        "readinessProbe": {
            "httpGet": {"path": "/readyz", "port": "http"},
            "periodSeconds": 2,
            "timeoutSeconds": 2,
            "failureThreshold": 1,
        },
        "livenessProbe": http_probe,
        # Joining can take a while (discovery rounds, a merge); liveness starts counting once it answers.
        "startupProbe": {**http_probe, "periodSeconds": 2, "failureThreshold": 60},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    if spec.resources:
        container["resources"] = copy.deepcopy(spec.resources)
    if spec.auth.enabled:
        container["volumeMounts"] = [{"name": AUTH_VOLUME, "mountPath": AUTH_MOUNT_PATH, "readOnly": True}]
    pod_spec: dict[str, Any] = {
        "serviceAccountName": service_account_name(spec),
        "restartPolicy": "Never",
        "hostname": name,
        "subdomain": headless_service_name(spec),
        "terminationGracePeriodSeconds": tspec.get("terminationGracePeriodSeconds", spec.leave_timeout + EXIT_GRACE),
        "containers": [container],
    }
    for key in ("nodeSelector", "tolerations", "affinity", "topologySpreadConstraints", "priorityClassName"):
        if tspec.get(key):
            pod_spec[key] = copy.deepcopy(tspec[key])
    if tspec.get("securityContext"):
        pod_spec["securityContext"] = copy.deepcopy(tspec["securityContext"])
    if spec.auth.enabled:
        # Secret files belong to root; fsGroup gives them the member's group, and mode 0440 lets only that group
        # read them. A template's own fsGroup wins (then it is the template's job to match the user).
        pod_spec["securityContext"] = {"fsGroup": MEMBER_GID, **(pod_spec.get("securityContext") or {})}
        pod_spec["volumes"] = [
            {
                "name": AUTH_VOLUME,
                "secret": {
                    "secretName": spec.auth_secret_name,
                    "defaultMode": AUTH_FILE_MODE,
                    # Only what the member reads: an unused key (kv-token while kvToken is off) stays out.
                    "items": [{"key": k, "path": k} for k in required_keys(spec)],
                },
            }
        ]
    if spec.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in spec.image_pull_secrets]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod_spec}


def build_auth_secret(spec: ClusterSpec, uid: str, *, cluster_secret: str, admin_token: str, kv_token: str) -> Manifest:
    """The operator-owned Secret ``<name>-auth``, with the random material the caller drew.

    ``kv-token`` is always written, also while ``spec.auth.kvToken`` is false: turning that on later then only
    rolls the members, while a Secret without the key would have to be edited by hand (the operator never
    changes a Secret it finds, so that its keys cannot be rotated behind the members' back).
    """
    if spec.auth.existing_secret:
        raise ValueError(f"spec.auth.existingSecret is {spec.auth.existing_secret!r}: the user manages that Secret")
    for what, value in (("cluster_secret", cluster_secret), ("admin_token", admin_token), ("kv_token", kv_token)):
        # One line, one word: a newline would make the cluster secret two keys, a space breaks a bearer token.
        if len(value) < MIN_GENERATED_CHARS or any(c.isspace() for c in value):
            raise ValueError(f"{what}: expected one word of at least {MIN_GENERATED_CHARS} random characters")
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": spec.auth_secret_name,
            "namespace": spec.namespace,
            "labels": labels(spec, "auth"),
            "ownerReferences": [owner_reference(spec, uid)],
        },
        # The member reads the cluster secret as lines of text: end it with a newline like any text file.
        "stringData": {
            CLUSTER_SECRET_KEY: cluster_secret + "\n",
            ADMIN_TOKEN_KEY: admin_token,
            KV_TOKEN_KEY: kv_token,
        },
    }


def build_headless_service(spec: ClusterSpec, uid: str) -> Manifest:
    """A headless Service: stable DNS names per member (``NAME-0.NAME-members``), including members not ready."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(spec, uid, headless_service_name(spec)),
        "spec": {
            "clusterIP": "None",
            # Joiners are not ready until they joined: they must be resolvable before that.
            "publishNotReadyAddresses": True,
            "selector": selector_labels(spec),
            "ports": [
                {"name": "http", "port": spec.http_port, "targetPort": "http", "protocol": "TCP"},
                {
                    "name": "member",
                    "port": spec.member_port,
                    "targetPort": "member",
                    "protocol": _protocol(spec),
                },
            ],
        },
    }


def build_client_service(spec: ClusterSpec, uid: str) -> Manifest:
    """The Service clients reach the grid through (``NAME``): the members' HTTP API, ready members only.

    No ``publishNotReadyAddresses``: a member that is still joining or fetching its state is not ready (its
    ``/readyz``), so its endpoint is marked not ready and gets no client traffic; the headless Service keeps
    publishing it for the members' own DNS names.
    """
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(spec, uid, client_service_name(spec), "client"),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(spec),
            "ports": [{"name": "http", "port": spec.http_port, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def build_pod_disruption_budget(spec: ClusterSpec, uid: str) -> Manifest:
    """Voluntary disruptions (drains) may take at most numOwners-1 members at once (and never the last one).

    Evicted members still leave gracefully (SIGTERM hands their segments off first); the budget keeps drains
    from taking every owner of a segment at once. See :attr:`ClusterSpec.max_unavailable` for 1 owner.
    """
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(spec, uid, spec.name),
        "spec": {"maxUnavailable": spec.max_unavailable, "selector": {"matchLabels": selector_labels(spec)}},
    }


def build_member_service_account(spec: ClusterSpec, uid: str) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _metadata(spec, uid, service_account_name(spec)),
        "automountServiceAccountToken": True,
    }


def build_member_role(spec: ClusterSpec, uid: str) -> Manifest:
    """Least privilege for discovery: list the pods of this namespace, nothing else."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _metadata(spec, uid, service_account_name(spec)),
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}],
    }


def build_member_role_binding(spec: ClusterSpec, uid: str) -> Manifest:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _metadata(spec, uid, service_account_name(spec)),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": service_account_name(spec)},
        "subjects": [{"kind": "ServiceAccount", "name": service_account_name(spec), "namespace": spec.namespace}],
    }


def build_supporting_objects(spec: ClusterSpec, uid: str) -> list[Manifest]:
    """Everything but the pods, in creation order (the account and its rights before any member needs them)."""
    return [
        build_member_service_account(spec, uid),
        build_member_role(spec, uid),
        build_member_role_binding(spec, uid),
        build_headless_service(spec, uid),
        build_client_service(spec, uid),
        build_pod_disruption_budget(spec, uid),
    ]
