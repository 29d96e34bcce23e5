"""Frame authentication, optional encryption and replay protection: the transport's sealed envelope.

Only members holding the cluster's secret can send frames others accept. With a secret configured
(``transport.auth_secret_file`` or ``transport.auth_secret_env``), every frame the transport produces is wrapped
once (a multicast frame is sealed once and the same bytes go to every member) in::

    envelope = marker(0xC1) | mode(1) | key_id(4) | session(16) | counter(8) | body | tag(16)

* ``marker`` 0xC1 is the one byte msgpack never uses, so a sealed frame can never be taken for a plain one.
* ``mode`` 1 = HMAC-SHA256 (truncated to 128 bits) over everything before the tag; the body is the plain
  frame. Mode 2 = ChaCha20-Poly1305: the body is the encrypted frame, the 30 header bytes are associated data.
* ``key_id`` names the key (a hash of the derived key, so another cluster's frames under the same secret
  are "foreign" at the first look); a secret file may list several keys: the first one seals, all of them
  open (key rotation without a restart of every member at once).
* ``session`` is 16 random bytes drawn when the sender's stack starts (from the driver's ``os.urandom``;
  from the layer's seeded RNG in the simulator) and ``counter`` increases by one per frame. Encryption uses
  a key derived from (secret, cluster, session) and the counter as the nonce, so a nonce is never reused:
  a restarted member has a new session, hence a new key.
* Replay protection: per session, the receiver keeps the highest counter seen and a bitmap of the
  ``window`` counters below it; a counter seen before, or older than the window, is a replay. Each member
  receives only the frames meant for it, so counters have gaps; that is fine for a sliding window.

Everything here is sans-IO: no clock (``now`` comes in), no sockets, no global random. Keys are derived with
HMAC-SHA256 from the secret and the cluster name, so the same secret used by two clusters gives unrelated keys.

Bounded state: at most ``max_senders`` sessions are remembered; the least recently seen session of a sender
outside the view goes first, and sessions of senders outside the view unseen for ``sender_ttl`` are pruned.
A pruned session's old frames could be replayed once more (the price of bounded memory; docs/guarantees.md).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.address import Address
from ..core.errors import ConfigError

MARKER = 0xC1
MODE_MAC = 1
MODE_AEAD = 2
MODE_NAMES = {MODE_MAC: "HMAC-SHA256", MODE_AEAD: "ChaCha20-Poly1305"}
_HEADER = struct.Struct(">BB4s16sQ")
HEADER_SIZE = _HEADER.size  # 30
TAG_SIZE = 16
OVERHEAD = HEADER_SIZE + TAG_SIZE
SESSION_SIZE = 16
MIN_SECRET_CHARS = 16
MAX_SECRETS = 16

# Reasons a frame is rejected; the transport counts each as ``transport.auth_<reason>``.
TRUNCATED = "truncated"
UNAUTHENTICATED = "unauthenticated"
WRONG_MODE = "wrong_mode"
UNKNOWN_KEY = "unknown_key"
FORGED = "forged"
REPLAYED = "replayed"
REASONS = (TRUNCATED, UNAUTHENTICATED, WRONG_MODE, UNKNOWN_KEY, FORGED, REPLAYED)


class AuthError(Exception):
    """A frame failed authentication; ``reason`` is one of :data:`REASONS`, the message says why."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


# -- configuration ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Secret:
    """The cluster secret(s), as read from a file or an environment variable. The repr never shows them."""

    source: str
    keys: tuple[bytes, ...]

    def __repr__(self) -> str:
        return f"Secret({self.source}, {len(self.keys)} key(s))"

    __str__ = __repr__


def _parse_secret_text(text: str, source: str, where: str) -> Secret:
    keys = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if len(line) < MIN_SECRET_CHARS:
            raise ConfigError(
                f"{where}: a key in {source} has {len(line)} characters; at least {MIN_SECRET_CHARS} are required "
                "(e.g. the output of `openssl rand -hex 32`)"
            )
        keys.append(line.encode())
    if not keys:
        raise ConfigError(f"{where}: {source} holds no key (one key per line; the first one signs)")
    if len(keys) > MAX_SECRETS:
        raise ConfigError(f"{where}: {source} holds {len(keys)} keys; at most {MAX_SECRETS} are allowed")
    return Secret(source, tuple(keys))


def parse_secret_file(value: Any, where: str) -> Secret | None:
    """Config parser for ``auth_secret_file``: a path to a text file with one key per line (first one signs)."""
    if value is None or isinstance(value, Secret):
        return value
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: expected the path of a file holding the cluster secret, got {value!r}")
    try:
        raw = Path(value).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read the secret file {value}: {exc.strerror or exc}") from None
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: the secret file {value} is not text (expected one key per line)") from None
    return _parse_secret_text(text, f"file {value}", where)


def parse_secret_env(value: Any, where: str) -> Secret | None:
    """Config parser for ``auth_secret_env``: the name of an environment variable holding the key(s)."""
    if value is None or isinstance(value, Secret):
        return value
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: expected the name of an environment variable, got {value!r}")
    text = os.environ.get(value)
    if text is None:
        raise ConfigError(f"{where}: the environment variable {value} is not set")
    return _parse_secret_text(text, f"environment variable {value}", where)


# -- keys ---------------------------------------------------------------------------------------------------
def _derive(secret: bytes, purpose: str, cluster: str) -> bytes:
    return hmac.digest(secret, f"groupcluster/v1/{purpose}/{cluster}".encode(), "sha256")


@dataclass(frozen=True, eq=False)
class _Key:
    key_id: bytes
    mac_key: bytes
    enc_key: bytes


def _make_key(secret: bytes, cluster: str) -> _Key:
    mac_key = _derive(secret, "mac", cluster)
    enc_key = _derive(secret, "aead", cluster)
    key_id = hashlib.sha256(b"groupcluster/v1/key-id/" + mac_key).digest()[:4]
    return _Key(key_id, mac_key, enc_key)


def _aead_class() -> Any:
    try:
        from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
    except ImportError:  # pragma: no cover - cryptography is a dependency of the test and crypto extras
        raise ConfigError(
            "transport.encrypt: encryption needs the 'cryptography' package (pip install cryptography)"
        ) from None
    return ChaCha20Poly1305


# -- replay window --------------------------------------------------------------------------------------------
class _Session:
    """What a receiver remembers of one sender session: the replay window and the per-session cipher."""

    __slots__ = ("aead", "bits", "highest", "last_seen", "sender")

    def __init__(self, now: float) -> None:
        self.highest = 0
        self.bits = 0  # bit i set: counter highest - i was seen
        self.last_seen = now
        self.sender: Address | None = None
        self.aead: Any = None


# -- the sealer/opener ----------------------------------------------------------------------------------------
class FrameAuth:
    """Seals outgoing frames and opens incoming ones for one member (sans-IO)."""

    def __init__(
        self,
        secrets: Iterable[bytes],
        cluster: str,
        *,
        session: bytes,
        encrypt: bool = False,
        window: int = 4096,
        max_senders: int = 1024,
        sender_ttl: float = 600.0,
    ) -> None:
        keys = [_make_key(s, cluster) for s in secrets]
        if not keys:
            raise ConfigError("transport: authentication needs at least one key")
        if len(session) != SESSION_SIZE:
            raise ValueError(f"session: expected {SESSION_SIZE} bytes, got {len(session)}")
        self.mode = MODE_AEAD if encrypt else MODE_MAC
        self.keys = {k.key_id: k for k in keys}
        self.send_key = keys[0]
        self.session = bytes(session)
        self.counter = 0
        self.window = window
        self._mask = (1 << window) - 1
        self.max_senders = max_senders
        self.sender_ttl = sender_ttl
        self.sessions: dict[tuple[bytes, bytes], _Session] = {}
        self.members: frozenset[Address] = frozenset()
        self._next_prune = 0.0
        self._aead_cls = _aead_class() if encrypt else None
        self._send_aead = self._session_aead(self.send_key, self.session) if encrypt else None

    def _session_aead(self, key: _Key, session: bytes) -> Any:
        # One key per (secret, cluster, session): the counter alone is then a unique nonce.
        assert self._aead_cls is not None
        return self._aead_cls(hmac.digest(key.enc_key, session, "sha256"))

    # -- sending ------------------------------------------------------------------------------------------
    def seal(self, frame: bytes) -> bytes:
        """The frame in its envelope; every call uses the next counter."""
        self.counter += 1
        counter = self.counter
        header = _HEADER.pack(MARKER, self.mode, self.send_key.key_id, self.session, counter)
        if self._send_aead is not None:
            return header + self._send_aead.encrypt(counter.to_bytes(12, "big"), frame, header)
        body = header + frame
        return body + hmac.digest(self.send_key.mac_key, body, "sha256")[:TAG_SIZE]

    # -- receiving ----------------------------------------------------------------------------------------
    def open(self, data: bytes, now: float) -> tuple[bytes | memoryview, _Session]:
        """Check ``data`` and return (the plain frame, its session); raise :class:`AuthError` if it fails.

        The replay window is updated only after the tag checks out, so forged frames cannot move it. Call
        :meth:`bind` with the decoded sender afterwards (used to prune sessions of members that left).
        """
        if len(data) < OVERHEAD:
            if data[:1] != b"\xc1":
                raise AuthError(UNAUTHENTICATED, f"frame of {len(data)} bytes is not sealed (no authentication)")
            raise AuthError(
                TRUNCATED, f"sealed frame of {len(data)} bytes is shorter than its {OVERHEAD}-byte envelope"
            )
        marker, mode, key_id, session_id, counter = _HEADER.unpack_from(data)
        if marker != MARKER:
            raise AuthError(UNAUTHENTICATED, "frame is not sealed (no authentication); this cluster requires it")
        if mode != self.mode:
            raise AuthError(
                WRONG_MODE,
                f"frame sealed with mode {mode} ({MODE_NAMES.get(mode, 'unknown')}); this member uses "
                f"{MODE_NAMES[self.mode]}",
            )
        key = self.keys.get(key_id)
        if key is None:
            raise AuthError(UNKNOWN_KEY, f"frame sealed with unknown key id {key_id.hex()} (another key or cluster)")
        if counter == 0:
            raise AuthError(FORGED, "frame counter 0 is never used")
        skey = (key_id, session_id)
        sess = self.sessions.get(skey)
        view = memoryview(data)
        if self.mode == MODE_MAC:
            tag = hmac.digest(key.mac_key, view[:-TAG_SIZE], "sha256")[:TAG_SIZE]
            if not hmac.compare_digest(tag, view[-TAG_SIZE:]):
                raise AuthError(FORGED, "frame tag does not match (forged, corrupted, or truncated)")
            plain: bytes | memoryview = view[HEADER_SIZE:-TAG_SIZE]
        else:
            aead = sess.aead if sess is not None else self._session_aead(key, session_id)
            try:
                plain = aead.decrypt(counter.to_bytes(12, "big"), view[HEADER_SIZE:], view[:HEADER_SIZE])
            except Exception:  # cryptography's InvalidTag; any failure is the same rejection
                raise AuthError(FORGED, "frame does not decrypt (forged, corrupted, or truncated)") from None
            if sess is None:
                sess = self._new_session(skey, now)
                sess.aead = aead
        if sess is None:
            sess = self._new_session(skey, now)
        self._check_replay(sess, counter)
        sess.last_seen = now
        if now >= self._next_prune:
            self.prune(now)
        return plain, sess

    def _check_replay(self, sess: _Session, counter: int) -> None:
        highest = sess.highest
        if counter > highest:
            shift = counter - highest
            sess.bits = ((sess.bits << shift) | 1) & self._mask if shift < self.window else 1
            sess.highest = counter
            return
        offset = highest - counter
        if offset >= self.window:
            raise AuthError(REPLAYED, f"frame counter {counter} is older than the replay window (highest {highest})")
        bit = 1 << offset
        if sess.bits & bit:
            raise AuthError(REPLAYED, f"frame counter {counter} was received before (a replay)")
        sess.bits |= bit

    def _new_session(self, skey: tuple[bytes, bytes], now: float) -> _Session:
        if len(self.sessions) >= self.max_senders:
            self._evict_one()
        sess = self.sessions[skey] = _Session(now)
        return sess

    def _evict_one(self) -> None:
        # The least recently seen session of a sender outside the view; among members only if all are members.
        members = self.members
        candidates = [(s.last_seen, k) for k, s in self.sessions.items() if s.sender not in members]
        if not candidates:
            candidates = [(s.last_seen, k) for k, s in self.sessions.items()]
        del self.sessions[min(candidates)[1]]

    @staticmethod
    def bind(sess: _Session, sender: Address) -> None:
        """Remember which member a session belongs to (the sender named in its first authentic frame)."""
        if sess.sender is None:
            sess.sender = sender

    def set_members(self, members: Iterable[Address]) -> None:
        """The current view: sessions of its members are not pruned for silence (failure detection decides)."""
        self.members = frozenset(members)

    def prune(self, now: float) -> int:
        """Forget sessions of non-members unseen for ``sender_ttl``; returns how many went."""
        self._next_prune = now + max(self.sender_ttl / 4, 1.0)
        members = self.members
        ttl = self.sender_ttl
        stale = [k for k, s in self.sessions.items() if s.sender not in members and now - s.last_seen > ttl]
        for k in stale:
            del self.sessions[k]
        return len(stale)


def make_session(entropy: Callable[[int], bytes]) -> bytes:
    """A fresh session id from ``entropy`` (``os.urandom`` in real processes)."""
    return bytes(entropy(SESSION_SIZE))
