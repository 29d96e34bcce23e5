"""Transport: the bottom layer. Bundles messages into frames, loops multicasts back, decodes and checks input.

Messages sent during one driver step are bundled: all multicasts of the step travel in as few frames as
fit ``max_frame_size``, and so do all unicasts to one member. The same multicast frame bytes go to every
other member of the view (encoded once). Consecutive NAKACK multicasts travel as runs (see :mod:`..core.wire`)
towards members known to decode them: each member says so with an empty RUNS_VERSION frame ("hello") to every
member of each new view it has not heard one from, and any RUNS_VERSION frame counts as one
(docs/decisions/004-wire-runs.md). Malformed frames, frames of another cluster and unicasts meant
for another incarnation are dropped and counted, never raised.

With a cluster secret (``auth_secret_file`` or ``auth_secret_env``) every frame is sealed once after encoding
(HMAC-SHA256, or ChaCha20-Poly1305 with ``encrypt: true``; see :mod:`.auth`) and every received frame must
open before it is decoded: forged, replayed, truncated, unsealed and foreign frames are dropped and counted
as ``transport.auth_rejected`` and ``transport.auth_<reason>``. Without a secret nothing of this runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from ..core import protocol_ids
from ..core.address import Address
from ..core.config import param
from ..core.errors import ConfigError, WireError
from ..core.events import Event, SetLocalAddress, ViewChange
from ..core.layer import Layer, register_layer
from ..core.message import Message
from ..core.wire import FORMAT_VERSION, RUNS_VERSION, WireLimits, decode_frame_version, encode_frame, encode_items
from .auth import OVERHEAD, AuthError, FrameAuth, Secret, make_session, parse_secret_env, parse_secret_file

# Rough per-message framing overhead used to cut frames before encoding them.
_MESSAGE_OVERHEAD: Final = 48
# Most members remembered as decoding runs between two view changes.
_MAX_RUNS_OK: Final = 1024


@dataclass(frozen=True)
class TransportConfig:
    max_frame_size: int = param("60KiB", "size", doc="largest frame sent; bigger batches are split", minimum=512)
    max_receive_frame: int = param("4MiB", "size", doc="largest frame accepted from a peer", minimum=512)
    max_messages_per_frame: int = param(65536, "int", doc="most messages accepted in one frame", minimum=1)
    # Secret is a frozen dataclass: an immutable default (ruff cannot see that across modules).
    auth_secret_file: Secret | None = param(  # noqa: RUF009
        None,
        "custom",
        parser=parse_secret_file,
        doc="file holding the cluster secret (one key per line, the first signs): every frame is authenticated",
    )
    auth_secret_env: Secret | None = param(  # noqa: RUF009
        None,
        "custom",
        parser=parse_secret_env,
        doc="name of an environment variable holding the cluster secret (instead of auth_secret_file)",
    )
    encrypt: bool = param(False, "bool", doc="encrypt frames (ChaCha20-Poly1305); needs a cluster secret")
    wire_runs: bool = param(
        True,
        "bool",
        doc="send consecutive multicasts as runs to members that decode them (false: the previous wire format only)",
    )
    auth_replay_window: int = param(
        4096, "int", doc="frames per sender accepted out of order; older ones count as replays", minimum=64
    )
    auth_max_senders: int = param(1024, "int", doc="sender sessions remembered for replay protection", minimum=1)
    auth_sender_ttl: float = param(
        "10m", "duration", doc="forget the replay state of a sender outside the view silent this long", minimum=1
    )

    def __post_init__(self) -> None:
        if self.auth_secret_file is not None and self.auth_secret_env is not None:
            raise ConfigError("transport: set auth_secret_file or auth_secret_env, not both")
        if self.encrypt and self.secret is None:
            raise ConfigError(
                "transport.encrypt: encryption needs a cluster secret (auth_secret_file or auth_secret_env)"
            )

    @property
    def secret(self) -> Secret | None:
        return self.auth_secret_file or self.auth_secret_env


class Transport(Layer):
    NAME = "transport"
    PROTO_ID = protocol_ids.TRANSPORT
    Config = TransportConfig
    IS_TRANSPORT = True

    def __init__(self, config: TransportConfig, ctx: Any) -> None:
        super().__init__(config, ctx)
        self.limits = WireLimits(max_frame_bytes=config.max_receive_frame, max_messages=config.max_messages_per_frame)
        self.targets: tuple[tuple[str, int], ...] = ()
        # Multicast bundles keep the targets current when each message was sent: a view message must
        # still reach the members of the old view even if the new view is installed within the same step.
        self._mcast: list[tuple[tuple[tuple[str, int], ...], list[Message]]] = []
        self._ucast: dict[tuple[str, int], list[Message]] = {}
        self._loopback: list[Message] = []
        # Members (by endpoint, with the address that said so) known to decode runs, and the members of the
        # current view still to be told that we do; both kept to the current view's members.
        self._runs_ok: dict[tuple[str, int], Address] = {}
        self._hello: list[Address] = []
        self._told: set[Address] = set()
        self.wire_runs: bool = config.wire_runs
        self.bad_frames = 0
        self.auth_rejected = 0
        self._next_warning = 0.0
        self._frame_limit = config.max_frame_size
        self.auth: FrameAuth | None = None
        if config.secret is not None:
            # The simulator's session comes from the seeded RNG (reproducible runs); the asyncio driver replaces
            # it with os.urandom bytes before the first frame (reseed_session), so no nonce is ever reused.
            self.auth = self._make_auth(make_session(ctx.rng.randbytes))
            self._frame_limit = max(config.max_frame_size - OVERHEAD, 256)

    def _make_auth(self, session: bytes) -> FrameAuth:
        cfg = self.config
        assert cfg.secret is not None
        return FrameAuth(
            cfg.secret.keys,
            self.ctx.cluster,
            session=session,
            encrypt=cfg.encrypt,
            window=cfg.auth_replay_window,
            max_senders=cfg.auth_max_senders,
            sender_ttl=cfg.auth_sender_ttl,
        )

    def reseed_session(self, session: bytes) -> None:
        """Use ``session`` (fresh random bytes from the driver) as this member's sender session."""
        if self.auth is not None:
            if self.auth.counter:
                raise RuntimeError("reseed_session: frames were sealed already")
            self.auth = self._make_auth(session)

    # -- down ----------------------------------------------------------------------------------------
    def down(self, msg: Message) -> None:
        msg.src = self.local_address
        dest = msg.dest
        if dest is None:
            mcast = self._mcast
            if mcast and mcast[-1][0] is self.targets:
                mcast[-1][1].append(msg)
            else:
                mcast.append((self.targets, [msg]))
            self._loopback.append(msg)
        elif dest == self.local_address:
            self._loopback.append(msg)
        else:
            bundle = self._ucast.get(dest.endpoint)
            if bundle is None:
                self._ucast[dest.endpoint] = [msg]
            else:
                bundle.append(msg)

    def down_event(self, event: Event) -> Any:
        if isinstance(event, ViewChange):
            me = self.local_address.endpoint
            self.targets = tuple(m.endpoint for m in event.view.members if m.endpoint != me)
            if self.wire_runs:
                self._on_view(event.view.members)
            if self.auth is not None:
                self.auth.set_members(event.view.members)
        elif isinstance(event, SetLocalAddress):  # pragma: no cover - addresses are fixed at creation
            pass
        return self.below.down_event(event)

    def _on_view(self, members: tuple[Address, ...]) -> None:
        me = self.local_address
        peers = [m for m in members if m != me]
        runs_ok = self._runs_ok
        # An endpoint counts only with the address that said so: a member restarted there (maybe with the
        # previous version, in a rollback) must say so again.
        self._runs_ok = {m.endpoint: m for m in peers if runs_ok.get(m.endpoint) == m}
        self._told = {m for m in self._told if m in self._runs_ok.values() or m in peers}
        # Told again at every view change until it told us: a hello may be lost like any frame.
        due = [m for m in peers if m not in self._told or m.endpoint not in self._runs_ok]
        self._hello = due + [m for m in self._hello if m not in due]

    def _runs_to(self, targets: tuple[tuple[str, int], ...]) -> bool:
        runs_ok = self._runs_ok
        for endpoint in targets:
            if endpoint not in runs_ok:
                return False
        return self.wire_runs

    def end_of_step(self) -> bool:
        if self._hello:
            hello, self._hello = self._hello, []
            frame = encode_frame(self.ctx.cluster, self.local_address, [], RUNS_VERSION)
            if self.auth is not None:
                frame = self.auth.seal(frame)
            for m in hello:
                self._told.add(m)
                self.ctx.transmit(m.endpoint, frame)
            self.count("hellos_sent", len(hello))
        if self._loopback:
            batch, self._loopback = self._loopback, []
            # Loopback goes up as the local member's own batch; unicasts to self and multicasts alike.
            self.count("loopback", len(batch))
            self.above.up(batch)
            return True
        if self._mcast:
            bundles, self._mcast = self._mcast, []
            for targets, msgs in bundles:
                if targets:
                    for frame in self._frames(msgs, self._runs_to(targets)):
                        for endpoint in targets:
                            self.ctx.transmit(endpoint, frame)
        if self._ucast:
            ucast, self._ucast = self._ucast, {}
            for endpoint, msgs in ucast.items():
                for frame in self._frames(msgs, False):
                    self.ctx.transmit(endpoint, frame)
        return False

    def _frames(self, msgs: list[Message], runs: bool) -> list[bytes]:
        limit = self._frame_limit
        frames: list[bytes] = []
        start = 0
        size = 0
        # Cut by the same estimate with or without runs (a run is smaller than its messages): the frames hold
        # the same messages either way.
        for i, msg in enumerate(msgs):
            est = len(msg.payload) + _MESSAGE_OVERHEAD + 16 * len(msg.headers)
            if i > start and size + est > limit:
                frames.append(self._frame(msgs[start:i], runs))
                start, size = i, 0
            size += est
        if start < len(msgs):
            frames.append(self._frame(msgs[start:] if start else msgs, runs))
        if self.auth is not None:
            seal = self.auth.seal
            frames = [seal(f) for f in frames]
        self.count("frames_sent", len(frames))
        self.count("messages_sent", len(msgs))
        return frames

    def _frame(self, msgs: list[Message], runs: bool) -> bytes:
        items, any_run = encode_items(msgs, runs)
        return encode_frame(self.ctx.cluster, self.local_address, items, RUNS_VERSION if any_run else FORMAT_VERSION)

    # -- up ------------------------------------------------------------------------------------------
    def receive(self, data: bytes) -> None:
        auth = self.auth
        session = None
        frame: bytes | memoryview = data  # opening a sealed frame gives a view into it
        if auth is not None:
            try:
                frame, session = auth.open(data, self.now)
            except AuthError as exc:
                self.auth_rejected += 1
                self.count("auth_rejected")
                self.count(f"auth_{exc.reason}")
                self._warn("an unauthentic frame", self.auth_rejected, exc)
                return
        try:
            sender, msgs, version = decode_frame_version(frame, self.ctx.cluster, self.limits)
        except WireError as exc:
            self.bad_frames += 1
            self.count("bad_frames")
            why: Exception = exc
            if auth is None and frame[:1] == b"\xc1":
                why = WireError("a sealed (authenticated) frame, but this member has no cluster secret configured")
            self._warn("a bad frame", self.bad_frames, why)
            return
        if session is not None and session.sender is None:
            session.sender = sender
        me = self.local_address
        if sender == me:
            self.count("own_frames_dropped")
            return
        if version == RUNS_VERSION and self.wire_runs and self._runs_ok.get(sender.endpoint) != sender:
            self._learn_runs(sender)
        batch = msgs
        for msg in msgs:
            dest = msg.dest
            if dest is not None and dest != me:
                batch = [m for m in msgs if m.dest is None or self._for_me(m.dest)]
                self.count("wrong_destination", len(msgs) - len(batch))
                break
        self.count("frames_received")
        self.count("messages_received", len(batch))
        if batch:
            self.above.up(batch)

    def _warn(self, what: str, so_far: int, exc: Exception) -> None:
        # The first few are logged, then at most one line per 10 s: a flood must not flood the log too.
        now = self.now
        if so_far <= 10 or now >= self._next_warning:
            self._next_warning = now + 10.0
            self.ctx.log.warning("dropped %s (%d so far): %s", what, so_far, exc)

    def _learn_runs(self, sender: Address) -> None:
        # Kept even from a member not in our view yet (a joiner may install the view first); bounded, and cut to
        # the view's members at the next view change.
        if len(self._runs_ok) >= _MAX_RUNS_OK and sender.endpoint not in self._runs_ok:
            return
        self._runs_ok[sender.endpoint] = sender
        # Told back at once: our hello to it may have been lost. It learns us now and answers nothing more.
        self._hello.append(sender)
        self.count("runs_peers_learned")

    def _for_me(self, dest: Address) -> bool:
        me = self.local_address
        return dest == me or (dest.is_placeholder() and dest.endpoint == me.endpoint)

    def describe_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"targets": len(self.targets), "bad_frames": self.bad_frames}
        if self.auth is not None:
            state["auth"] = {
                "mode": "encrypt" if self.config.encrypt else "mac",
                "sessions": len(self.auth.sessions),
                "rejected": self.auth_rejected,
            }
        return state


register_layer(Transport)
