"""The GroupCluster spec as the operator reads it: defaults (the CRD's), checks, and the hash of what pods run.

The API server already applies the CRD's defaults and validation; :meth:`ClusterSpec.from_resource` applies
them again so the pure code behaves the same on a resource that bypassed them (tests, an older CRD), and
raises :class:`SpecError` naming the field when a value is unusable.
"""

from __future__ import annotations

import hashlib
import json
import re
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
# Set on a live member pod just before the operator deletes it (a stranded joiner, the last member at scale 0, a
# pod that cannot start): a pod deleted without it or a leave request was deleted by someone else.
STOP_ANNOTATION = "groupcluster.io/stopped-by-operator"
# How a pod's member authenticates frames (off | mac | aead): members that differ cannot form one group, so the
# planner never mixes them (see planner rule 0).
AUTH_MODE_ANNOTATION = "groupcluster.io/auth-mode"
# The grid's initial_cluster_size the pod's member was started with (the planner's choice when it created the
# pod: 1 for a cluster's first member, else one more than the members ready then). Not part of the spec hash:
# it differs from pod to pod by design, and a pod is never rolled for it.
INITIAL_SIZE_ANNOTATION = "groupcluster.io/initial-cluster-size"
MANAGED_BY = "groupcluster-operator"

PARTITION_HANDLING = {
    "DenyReadWrites": "deny_read_writes",
    "AllowReads": "allow_reads",
    "AllowReadWrites": "allow_read_writes",
}
# Only presets that flush every view change: the operator's scaling (joins, graceful leaves) relies on it, and
# the grid's guarantees are verified on flushed views. fifo stays for embedded channels and `groupcluster member`.
PRESETS = ("vsync", "total-order")
# spec.stack.set keys that would let views change without a flush (or a flush without reconciliation).
FLUSH_PARAMS = ("gms.use_flush", "flush.enable_reconciliation")
TRANSPORTS = ("udp", "tcp")
PULL_POLICIES = ("Always", "IfNotPresent", "Never")


AUTH_MODES = ("off", "mac", "aead")
# Layer parameters that spec.auth manages: a spec.stack.set entry for them would fight the operator's own.
AUTH_MANAGED_PARAMS = ("transport.auth_secret_file", "transport.auth_secret_env", "transport.encrypt")
# The grid parameter the operator sets per pod (docs/operator.md, "Join-only members"). A user's value cannot
# work either way: above 1 the first member waits forever for peers the operator adds only once it is ready;
# at 1 later members could start a second, empty grid when their join fails. So spec.grid may not set it.
INITIAL_SIZE_PARAM = "initial_cluster_size"
# A Kubernetes object name (RFC 1123 subdomain), which a Secret's name must be.
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class SpecError(ValueError):
    """A GroupCluster spec value the operator cannot use; the message names the field."""


def _int(spec: Mapping[str, Any], key: str, default: int, low: int, high: int, where: str = "spec") -> int:
    value = spec.get(key, default)
    if type(value) is not int or not low <= value <= high:
        raise SpecError(f"{where}.{key}: expected an integer in [{low}, {high}], got {value!r}")
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


def _preset(stack: Mapping[str, Any]) -> str:
    value = stack.get("preset", "vsync")
    if value == "fifo":
        raise SpecError(
            "spec.stack.preset: 'fifo' is no longer offered for a GroupCluster (its views change without a flush, "
            "which scaling and the grid rely on); use vsync (the default) or total-order"
        )
    return _choice(stack, "preset", "vsync", PRESETS, "spec.stack")


def _str_map(spec: Mapping[str, Any], key: str, where: str = "spec") -> dict[str, str]:
    value = spec.get(key) or {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise SpecError(f"{where}.{key}: expected a map of strings")
    return {k: str(v) for k, v in value.items()}


def _bool(spec: Mapping[str, Any], key: str, default: bool, where: str) -> bool:
    value = spec.get(key, default)
    if type(value) is not bool:
        raise SpecError(f"{where}.{key}: expected true or false, got {value!r}")
    return value


@dataclass(frozen=True)
class AuthSpec:
    """``spec.auth``: frame authentication with the cluster Secret, optional encryption and API tokens."""

    enabled: bool = True
    encrypt: bool = False
    kv_token: bool = False
    existing_secret: str = ""  # empty: the operator creates and owns ``<name>-auth``

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> AuthSpec:
        raw = spec.get("auth")
        if raw is None:
            raw = {}
        if not isinstance(raw, Mapping):
            raise SpecError(f"spec.auth: expected an object, got {raw!r}")
        unknown = sorted(set(raw) - {"enabled", "encrypt", "kvToken", "existingSecret"})
        if unknown:
            known = "enabled, encrypt, kvToken, existingSecret"
            raise SpecError(f"spec.auth: unknown field(s) {', '.join(unknown)} (known: {known})")
        existing = raw.get("existingSecret") or ""
        if not isinstance(existing, str) or (existing and (len(existing) > 253 or not _DNS_SUBDOMAIN.match(existing))):
            raise SpecError(f"spec.auth.existingSecret: {existing!r} is not a valid Secret name (lower-case RFC 1123)")
        out = cls(
            enabled=_bool(raw, "enabled", True, "spec.auth"),
            encrypt=_bool(raw, "encrypt", False, "spec.auth"),
            kv_token=_bool(raw, "kvToken", False, "spec.auth"),
            existing_secret=existing,
        )
        if not out.enabled and (out.encrypt or out.kv_token or out.existing_secret):
            raise SpecError(
                "spec.auth: encrypt, kvToken and existingSecret need enabled: true (without the Secret there is no "
                "key to encrypt with and no token to check)"
            )
        return out

    @property
    def mode(self) -> str:
        """What the members run: ``off`` (no frame authentication), ``mac`` (HMAC) or ``aead`` (encrypted)."""
        if not self.enabled:
            return "off"
        return "aead" if self.encrypt else "mac"


CACHE_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,47}")
CACHE_MODES = ("distributed", "replicated", "invalidation")
CACHE_PARAM_KEY = re.compile(r"[a-z_]{1,64}")
# Parameters a cache's params may not set: the fields above set them, or the member refuses them for named
# caches (persistence), or the operator sets them per pod (initial_cluster_size, taken from the default cache).
CACHE_MANAGED_PARAMS = frozenset(
    {"mode", "num_segments", "num_owners", "persistence", "persistence_path", "initial_cluster_size"}
)


@dataclass(frozen=True)
class CacheDef:
    """One entry of ``spec.caches``: a named cache every member declares (``--cache``, docs/grid.md)."""

    name: str
    mode: str = "distributed"
    num_segments: int | None = None
    num_owners: int | None = None
    params: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_item(cls, item: Any, where: str) -> CacheDef:
        if not isinstance(item, Mapping):
            raise SpecError(f"{where}: expected an object with a name")
        unknown = set(item) - {"name", "mode", "numSegments", "numOwners", "params"}
        if unknown:
            raise SpecError(f"{where}: unknown field(s) {', '.join(sorted(map(str, unknown)))}")
        name = item.get("name")
        if not isinstance(name, str) or not CACHE_NAME.fullmatch(name) or name == "default":
            raise SpecError(
                f"{where}.name: {name!r} must be 1 to 48 characters of a-z, 0-9, '_' and '-' (not 'default', the "
                "grid's own cache)"
            )
        where = f"{where} ({name})"
        mode = _choice(item, "mode", "distributed", CACHE_MODES, where)
        segments = _int(item, "numSegments", 1, 1, 65536, where) if "numSegments" in item else None
        owners = _int(item, "numOwners", 1, 1, 16, where) if "numOwners" in item else None
        if owners is not None and mode != "distributed":
            raise SpecError(f"{where}.numOwners: only for distributed caches (a {mode} cache has no owner count)")
        if segments is not None and mode == "invalidation":
            raise SpecError(f"{where}.numSegments: an invalidation cache has no segments")
        params = _str_map(item, "params", where)
        for key, value in params.items():
            if not CACHE_PARAM_KEY.fullmatch(key) or key in CACHE_MANAGED_PARAMS:
                raise SpecError(
                    f"{where}.params: key {key!r} is not a cache parameter the spec may set "
                    f"(not one of {', '.join(sorted(CACHE_MANAGED_PARAMS))}; lower case and '_')"
                )
            if not value or any(c in value for c in ",=") or any(c.isspace() for c in value):
                raise SpecError(f"{where}.params.{key}: {value!r} must be one word without ',' or '='")
        return cls(name, mode, segments, owners, tuple(sorted(params.items())))

    @property
    def member_arg(self) -> str:
        """The member's ``--cache`` value."""
        items = [("mode", self.mode)]
        if self.num_segments is not None:
            items.append(("num_segments", str(self.num_segments)))
        if self.num_owners is not None:
            items.append(("num_owners", str(self.num_owners)))
        items += list(self.params)
        return f"{self.name}:" + ",".join(f"{k}={v}" for k, v in items)


def _caches(spec: Mapping[str, Any]) -> tuple[CacheDef, ...]:
    value = spec.get("caches") or []
    if not isinstance(value, list):
        raise SpecError("spec.caches: expected a list of caches")
    out = tuple(CacheDef.from_item(item, f"spec.caches[{i}]") for i, item in enumerate(value))
    seen: set[str] = set()
    for c in out:
        if c.name in seen:
            raise SpecError(f"spec.caches: {c.name!r} is listed twice")
        seen.add(c.name)
    return out


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
    auth: AuthSpec = field(default_factory=AuthSpec)
    caches: tuple[CacheDef, ...] = ()

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
            preset=_preset(stack),
            transport=_choice(stack, "transport", "udp", TRANSPORTS, "spec.stack"),
            stack_set=_str_map(stack, "set", "spec.stack"),
            grid=_str_map(spec, "grid"),
            member_port=_int(spec, "memberPort", 7800, 1, 65535),
            http_port=_int(spec, "httpPort", 8080, 1, 65535),
            leave_timeout=_int(spec, "leaveTimeoutSeconds", 120, 1, 3600),
            pod_template=dict(template),
            auth=AuthSpec.from_spec(spec),
            caches=_caches(spec),
        )
        if out.member_port == out.http_port:
            raise SpecError(f"spec.memberPort and spec.httpPort: both are {out.http_port}; they must differ")
        for key in out.stack_set:
            layer, dot, param = key.partition(".")
            if not dot or not layer or not param:
                raise SpecError(f"spec.stack.set: key {key!r} should look like layer.key (e.g. fd.timeout)")
            if key in AUTH_MANAGED_PARAMS:
                raise SpecError(f"spec.stack.set: {key} is managed by spec.auth (the operator's Secret); remove it")
            if key in FLUSH_PARAMS:
                raise SpecError(
                    f"spec.stack.set: {key} cannot be set: every GroupCluster flushes its view changes (virtual "
                    "synchrony), which the operator's joins and leaves rely on; remove it"
                )
        # More copies than members: the PodDisruptionBudget (numOwners-1 at once) could let a drain evict every
        # member, and the grid holds fewer copies than asked. 0 stays allowed: it stops the cluster.
        owners = [("spec.numOwners", out.num_owners)] + [
            (f"spec.caches ({c.name}).numOwners", c.num_owners) for c in out.caches if c.num_owners is not None
        ]
        for where, count in owners:
            if out.replicas and count > out.replicas:
                raise SpecError(
                    f"{where}: {count} copies of every segment need at least {count} members, but spec.replicas is "
                    f"{out.replicas}; lower numOwners or raise replicas (0 stops the cluster and is always allowed)"
                )
        if INITIAL_SIZE_PARAM in out.grid:
            raise SpecError(
                f"spec.grid.{INITIAL_SIZE_PARAM}: set by the operator for each member pod (1 for the first, one more "
                "than the members ready for every later one, so a member whose join fails cannot start a second, "
                "empty grid); remove it"
            )
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
        # A distributed named cache with fewer owners bounds it too (replicated caches have every member).
        owners = [self.num_owners] + [c.num_owners or 2 for c in self.caches if c.mode == "distributed"]
        return max(1, min(owners) - 1)

    @property
    def max_unavailable(self) -> int:
        """The PodDisruptionBudget's maxUnavailable: a drain never takes every owner of a segment at once.

        numOwners-1 evictions leave one copy of every segment, and never more than replicas-1, so one member
        always stays. With one owner (or one member) it is still 1, not 0: an evicted member hands its segments
        off before it stops (SIGTERM), so one eviction at a time is safe, while 0 would block every drain forever.
        """
        owners = [self.num_owners] + [c.num_owners or 2 for c in self.caches if c.mode == "distributed"]
        return max(1, min(min(owners) - 1, self.replicas - 1))

    @property
    def auth_secret_name(self) -> str:
        """The Secret the members mount: the user's ``existingSecret``, else the operator's ``<name>-auth``."""
        return self.auth.existing_secret or f"{self.name}-auth"

    def pod_hash(self, secret_digest: str = "") -> str:
        """Hash of everything a member pod runs (not replicas): a change rolls the members one at a time.

        ``secret_digest`` (a digest of the Secret's keys the members read, from the handler) is part of it:
        members read their keys once at start, so an edit of the Secret (a key rotation) must roll them too.
        """
        relevant: dict[str, Any] = asdict(self)
        for key in ("replicas", "name", "namespace"):
            relevant.pop(key)
        if secret_digest:
            relevant["secret_digest"] = secret_digest
        text = json.dumps(relevant, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]
