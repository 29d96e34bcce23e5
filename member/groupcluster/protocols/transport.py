"""Transport: the bottom layer. Bundles messages into frames, loops multicasts back, decodes and checks input.

Messages sent during one driver step are bundled: all multicasts of the step travel in as few frames as
fit ``max_frame_size``, and so do all unicasts to one member. The same multicast frame bytes go to every
other member of the view (encoded once). Malformed frames, frames of another cluster and unicasts meant
for another incarnation are dropped and counted, never raised.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core import protocol_ids
from ..core.address import Address
from ..core.config import param
from ..core.errors import WireError
from ..core.events import Event, SetLocalAddress, ViewChange
from ..core.layer import Layer, register_layer
from ..core.message import Message
from ..core.wire import WireLimits, decode_frame, encode_frame, encode_message

# Rough per-message framing overhead used to cut frames before encoding them.
_MESSAGE_OVERHEAD = 48


@dataclass(frozen=True)
class TransportConfig:
    max_frame_size: int = param("60KiB", "size", doc="largest frame sent; bigger batches are split", minimum=512)
    max_receive_frame: int = param("4MiB", "size", doc="largest frame accepted from a peer", minimum=512)
    max_messages_per_frame: int = param(65536, "int", doc="most messages accepted in one frame", minimum=1)


@register_layer
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
        self.bad_frames = 0

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
        elif isinstance(event, SetLocalAddress):  # pragma: no cover - addresses are fixed at creation
            pass
        return self.below.down_event(event)

    def end_of_step(self) -> bool:
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
                    for frame in self._frames(msgs):
                        for endpoint in targets:
                            self.ctx.transmit(endpoint, frame)
        if self._ucast:
            ucast, self._ucast = self._ucast, {}
            for endpoint, msgs in ucast.items():
                for frame in self._frames(msgs):
                    self.ctx.transmit(endpoint, frame)
        return False

    def _frames(self, msgs: list[Message]) -> list[bytes]:
        limit = self.config.max_frame_size
        frames: list[bytes] = []
        encoded: list[list[Any]] = []
        size = 0
        for msg in msgs:
            item = encode_message(msg)
            est = len(msg.payload) + _MESSAGE_OVERHEAD + 16 * len(msg.headers)
            if encoded and size + est > limit:
                frames.append(encode_frame(self.ctx.cluster, self.local_address, encoded))
                encoded, size = [], 0
            encoded.append(item)
            size += est
        if encoded:
            frames.append(encode_frame(self.ctx.cluster, self.local_address, encoded))
        self.count("frames_sent", len(frames))
        self.count("messages_sent", len(msgs))
        return frames

    # -- up ------------------------------------------------------------------------------------------
    def receive(self, data: bytes) -> None:
        try:
            sender, msgs = decode_frame(data, self.ctx.cluster, self.limits)
        except WireError as exc:
            self.bad_frames += 1
            self.count("bad_frames")
            # Logged at warning for the first few, then only counted: a flood must not flood the log too.
            if self.bad_frames <= 10 or self.bad_frames % 1000 == 0:
                self.ctx.log.warning("dropped a bad frame (%d so far): %s", self.bad_frames, exc)
            return
        me = self.local_address
        if sender == me:
            self.count("own_frames_dropped")
            return
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

    def _for_me(self, dest: Address) -> bool:
        me = self.local_address
        return dest == me or (dest.is_placeholder() and dest.endpoint == me.endpoint)

    def describe_state(self) -> dict[str, Any]:
        return {"targets": len(self.targets), "bad_frames": self.bad_frames}
