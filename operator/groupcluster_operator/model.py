"""The GroupCluster spec as the operator reads it: defaults (the CRD's), checks, and the hash of what pods run.

The API server already applies the CRD's defaults and validation; :meth:`ClusterSpec.from_resource` applies
them again so the pure code behaves the same on a resource that bypassed them (tests, an older CRD), and
raises :class:`SpecError` naming the field when a value is unusable.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

GROUP = "groupcluster.io"
VERSION = "v1alpha1"
PLURAL = "groupclusters"
KIND = "GroupCluster"
API_VERSION = f"{GROUP}/{VERSION}"

# Labels every member pod carries; the selector (status.selector, discovery, Service, PDB) uses CLUSTER_LABEL.
CLUSTER_LABEL = "groupcluster.io/cluster"
ORDINAL_LABEL = "groupcluster.io/ordinal"
SPEC_HASH_ANNOTATION = "groupcluster.io/spec-hash"
LEAVE_ANNOTATION = "groupcluster.io/leave-requested"
MANAGED_BY = "groupcluster-operator"

PARTITION_HANDLING = {
    "DenyReadWrites": "deny_read_writes",
    "AllowReads": "allow_reads",
    "AllowReadWrites": "allow_read_writes",
}
PRESETS = ("fifo", "vsync", "total-order")
TRANSPORTS = ("udp", "tcp")
PULL_POLICIES = ("Always", "IfNotPresent", "Never")


class SpecError(ValueError):
    """A GroupCluster spec value the operator cannot use; the message names the field."""


def _int(spec: Mapping[str, Any], key: str, default: int, low: int, high: int) -> int:
    value = spec.get(key, default)
    if type(value) is not int or not low <= value <= high:
        raise SpecError(f"spec.{key}: expected an integer in [{low}, {high}], got {value!r}")
    return value


def _choice(
    spec: Mapping[str, Any],
    key: str,
    default: str,
    allowed: tuple[str, ...] | Mapping[str, str],
    where: str = "spec",
) -> str:
    value = spec.get(key, default)
    if value not in allowed:
        raise SpecError(f"{where}.{key}: {value!r} is not one of {', '.join(allowed)}")
    return value  # type: ignore[no-any-return]


def _str_map(spec: Mapping[str, Any], key: str, where: str = "spec") -> dict[str, str]:
    value = spec.get(key) or {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise SpecError(f"{where}.{key}: expected a map of strings")
    return {k: str(v) for k, v in value.items()}


@dataclass(frozen=True)
class ClusterSpec:
    """One GroupCluster's desired state (spec fields, defaults applied)."""

    name: str
    namespace: str
    replicas: int = 3
    image: str = ""
    image_pull_policy: str = "IfNotPresent"
    image_pull_secrets: tuple[str, ...] = ()
    resources: dict[str, Any] = field(default_factory=dict)
    num_owners: int = 2
    num_segments: int = 256
    partition_handling: str = "DenyReadWrites"
    preset: str = "vsync"
    transport: str = "udp"
    stack_set: dict[str, str] = field(default_factory=dict)
    grid: dict[str, str] = field(default_factory=dict)
    member_port: int = 7800
    http_port: int = 8080
    leave_timeout: int = 120
    pod_template: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_resource(cls, body: Mapping[str, Any], default_image: str = "") -> ClusterSpec:
        meta = body.get("metadata") or {}
        spec = body.get("spec") or {}
        if not isinstance(spec, Mapping):
            raise SpecError("spec: expected an object")
        name, namespace = meta.get("name"), meta.get("namespace")
        if not name or not namespace:
            raise SpecError("metadata: a GroupCluster needs a name and a namespace")
        image = spec.get("image") or default_image
        if not isinstance(image, str) or not image:
            raise SpecError("spec.image: not set, and the operator has no default image (GROUPCLUSTER_MEMBER_IMAGE)")
        stack = spec.get("stack") or {}
        if not isinstance(stack, Mapping):
            raise SpecError("spec.stack: expected an object")
        secrets = spec.get("imagePullSecrets") or []
        template = spec.get("podTemplate") or {}
        resources = spec.get("resources") or {}
        if not isinstance(template, Mapping) or not isinstance(resources, Mapping):
            raise SpecError("spec.podTemplate and spec.resources: expected objects")
        out = cls(
            name=str(name),
            namespace=str(namespace),
            replicas=_int(spec, "replicas", 3, 0, 1000),
            image=image,
            image_pull_policy=_choice(spec, "imagePullPolicy", "IfNotPresent", PULL_POLICIES),
            image_pull_secrets=tuple(str(s.get("name")) for s in secrets if isinstance(s, Mapping) and s.get("name")),
            resources=dict(resources),
            num_owners=_int(spec, "numOwners", 2, 1, 16),
            num_segments=_int(spec, "numSegments", 256, 1, 65536),
            partition_handling=_choice(spec, "partitionHandling", "DenyReadWrites", PARTITION_HANDLING),
            preset=_choice(stack, "preset", "vsync", PRESETS, "spec.stack"),
            transport=_choice(stack, "transport", "udp", TRANSPORTS, "spec.stack"),
            stack_set=_str_map(stack, "set", "spec.stack"),
            grid=_str_map(spec, "grid"),
            member_port=_int(spec, "memberPort", 7800, 1, 65535),
            http_port=_int(spec, "httpPort", 8080, 1, 65535),
            leave_timeout=_int(spec, "leaveTimeoutSeconds", 120, 1, 3600),
            pod_template=dict(template),
        )
        if out.member_port == out.http_port:
            raise SpecError(f"spec.memberPort and spec.httpPort: both are {out.http_port}; they must differ")
        for key in out.stack_set:
            layer, dot, param = key.partition(".")
            if not dot or not layer or not param:
                raise SpecError(f"spec.stack.set: key {key!r} should look like layer.key (e.g. fd.timeout)")
        return out

    @property
    def cluster_name(self) -> str:
        """The group's name on the wire: namespaced, so two namespaces' clusters never merge."""
        return f"{self.namespace}.{self.name}"

    @property
    def selector(self) -> str:
        return f"{CLUSTER_LABEL}={self.name}"

    @property
    def max_leaving(self) -> int:
        """Members that may be leaving at once: numOwners-1 copies can go before a segment loses its last one.

        With numOwners=1 one member still has to be able to leave: its graceful leave hands its segments off
        before it goes, so the limit only protects against a crash in the middle of several hand-offs.
        """
        return max(1, self.num_owners - 1)

    def pod_hash(self) -> str:
        """Hash of everything a member pod runs (not replicas): a change rolls the members one at a time."""
        relevant = asdict(self)
        for key in ("replicas", "name", "namespace"):
            relevant.pop(key)
        text = json.dumps(relevant, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]
