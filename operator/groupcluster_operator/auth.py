"""The cluster Secret: what the operator creates, and what it checks before any member mounts it.

A GroupCluster with ``spec.auth.enabled`` (the default) runs its members with frame authentication: they
mount a Secret holding

=================  ===========================================================================================
``cluster-secret``  one key per line (the first one seals, every one opens: rotation); the members'
                    ``transport.auth_secret_file``
``admin-token``     the bearer token of ``POST /v1/leave`` and ``/v1/force-available`` (``--admin-token-file``);
                    the operator reads it to ask members to leave
``kv-token``        the bearer token of the data endpoints (``--kv-token-file``), required when
                    ``spec.auth.kvToken``
=================  ===========================================================================================

The operator creates ``<name>-auth`` (owned by the GroupCluster, so deleting it removes the Secret) unless
``spec.auth.existingSecret`` names one the user manages. It never overwrites a Secret: a restart of the
operator that drew new keys would split the cluster between old and new members.

Pure code: :func:`groupcluster_operator.builders.build_auth_secret` takes the random material from the
caller (the handler draws it with :func:`secrets.token_urlsafe`); :func:`read_auth_secret` checks a Secret
read from the API server and raises :class:`AuthSecretError` naming the Secret and what is wrong with it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from groupcluster.protocols.auth import MAX_SECRETS, MIN_SECRET_CHARS

from .model import ClusterSpec

CLUSTER_SECRET_KEY = "cluster-secret"
ADMIN_TOKEN_KEY = "admin-token"
KV_TOKEN_KEY = "kv-token"
# What the handler asks secrets.token_urlsafe for: 32 random bytes (43 characters) per key and token.
RANDOM_BYTES = 32
# The member's rule for a token file (member_cli._token_file): one word of at least this many characters.
MIN_TOKEN_CHARS = 16
# Generated material is held to more than the members accept: a short key is a weak key.
MIN_GENERATED_CHARS = 32


class AuthSecretError(Exception):
    """The Secret is missing or unusable; the message names the Secret and the key."""


@dataclass(frozen=True, repr=False)
class AuthMaterial:
    """What the operator needs from the Secret: the admin token, and a digest of what the members read."""

    secret_name: str
    admin_token: str
    kv_token: str | None
    digest: str  # changes whenever a key the members read changes: it is part of the pods' spec hash

    def __repr__(self) -> str:  # never print a token
        return f"AuthMaterial({self.secret_name}, digest={self.digest})"


def required_keys(spec: ClusterSpec) -> tuple[str, ...]:
    """The keys the members of ``spec`` read from the Secret (what the pod's volume projects)."""
    keys = [CLUSTER_SECRET_KEY, ADMIN_TOKEN_KEY]
    if spec.auth.kv_token:
        keys.append(KV_TOKEN_KEY)
    return tuple(keys)


def _decoded(secret: Mapping[str, Any], name: str) -> dict[str, str]:
    data = secret.get("data") or {}
    if not isinstance(data, Mapping):
        raise AuthSecretError(f"Secret {name}: its data is not a map of keys")
    out = {}
    for key, value in data.items():
        try:
            out[str(key)] = base64.b64decode(str(value), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            raise AuthSecretError(f"Secret {name}: key {key} is not UTF-8 text") from None
    return out


def read_auth_secret(spec: ClusterSpec, secret: Mapping[str, Any] | None) -> AuthMaterial:
    """Check the Secret the members of ``spec`` would mount; raise :class:`AuthSecretError` saying what is wrong.

    The checks are the members' own (a member given this Secret would refuse to start otherwise), made before
    any pod mounts it, so a bad Secret stops the operator instead of crash-looping members.
    """
    name = f"{spec.namespace}/{spec.auth_secret_name}"
    if secret is None:
        raise AuthSecretError(f"Secret {name} does not exist (spec.auth.existingSecret names it)")
    data = _decoded(secret, name)
    missing = [k for k in required_keys(spec) if not data.get(k, "").strip()]
    if missing:
        raise AuthSecretError(f"Secret {name} lacks the key(s) {', '.join(missing)} (or they are empty)")
    lines = [ln.strip() for ln in data[CLUSTER_SECRET_KEY].splitlines()]
    keys = [ln for ln in lines if ln and not ln.startswith("#")]
    if not keys:
        raise AuthSecretError(f"Secret {name}: key {CLUSTER_SECRET_KEY} holds no key line (only comments)")
    short = [i + 1 for i, k in enumerate(keys) if len(k) < MIN_SECRET_CHARS]
    if short:
        raise AuthSecretError(
            f"Secret {name}: key {CLUSTER_SECRET_KEY}: key line(s) {short} are shorter than {MIN_SECRET_CHARS} "
            "characters"
        )
    if len(keys) > MAX_SECRETS:
        raise AuthSecretError(f"Secret {name}: key {CLUSTER_SECRET_KEY} lists {len(keys)} keys, at most {MAX_SECRETS}")
    for key in required_keys(spec)[1:]:
        token = data[key].strip()
        if len(token) < MIN_TOKEN_CHARS or any(c.isspace() for c in token):
            raise AuthSecretError(f"Secret {name}: key {key} must be one word of at least {MIN_TOKEN_CHARS} characters")
    digest = hashlib.sha256()
    for key in required_keys(spec):
        digest.update(f"{key}\0{data[key]}\0".encode())
    return AuthMaterial(
        secret_name=spec.auth_secret_name,
        admin_token=data[ADMIN_TOKEN_KEY].strip(),
        kv_token=data[KV_TOKEN_KEY].strip() if spec.auth.kv_token else None,
        # A digest of secret material in a pod annotation: 64 bits of SHA-256 over >= 16-character keys tell
        # nothing about them, and only say "these pods read other keys" (a roll is needed).
        digest=digest.hexdigest()[:16],
    )
