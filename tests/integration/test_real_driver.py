"""The asyncio driver on real loopback sockets, with a bare transport-only stack (no membership).

Two channels in one event loop send unicasts to each other's endpoint (the placeholder address
``host:port#0`` is accepted by whoever listens there), over UDP and over TCP; the TCP listener survives
a peer that sends a bad length prefix, and frames to an unreachable peer are dropped and counted.
"""

from __future__ import annotations

import asyncio
import socket

import pytest
from groupcluster.core.address import Address
from groupcluster.core.errors import ConfigError
from groupcluster.runtime.channel import Channel

BARE = [{"layer": "transport"}]


def placeholder(ch: Channel) -> Address:
    return Address(ch.address.host, ch.address.port, 0)


async def _wait(predicate) -> None:  # type: ignore[no-untyped-def]
    """Poll until ``predicate`` holds; AssertionError after 5 s."""
    loop = asyncio.get_running_loop()
    end = loop.time() + 5.0
    while not predicate():
        if loop.time() > end:
            raise AssertionError("timed out")
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("transport", ["udp", "tcp"])
def test_two_bare_stacks_exchange_unicasts_in_order(transport: str) -> None:
    async def main() -> None:
        a = await Channel.connect("drv", bind=("127.0.0.1", 0), stack=BARE, transport=transport)
        b = await Channel.connect("drv", bind=("127.0.0.1", 0), stack=BARE, transport=transport)
        try:
            got_a: list[bytes] = []
            got_b: list[bytes] = []
            a.on_message(lambda m: got_a.append(m.payload))
            b.on_message(lambda m: got_b.append(m.payload))
            # Sent in one loop iteration: they leave as a few bundled frames, not 5000 datagrams.
            for i in range(5000):
                a.send(b"a%d" % i, dest=placeholder(b))
            for i in range(300):
                b.send(b"b%d" % i, dest=placeholder(a))
            await _wait(lambda: len(got_b) >= 5000 and len(got_a) >= 300)
            assert got_b == [b"a%d" % i for i in range(5000)]
            assert got_a == [b"b%d" % i for i in range(300)]
            assert a.metrics()["transport.frames_sent"] < 50
            assert b.metrics()["transport.frames_received"] == a.metrics()["transport.frames_sent"]
            assert a.metrics().get("runtime.errors", 0) == 0
        finally:
            a.close()
            b.close()

    asyncio.run(main())


def test_tcp_bad_length_prefix_closes_only_that_connection() -> None:
    async def main() -> None:
        a = await Channel.connect("drv", bind=("127.0.0.1", 0), stack=BARE, transport="tcp")
        b = await Channel.connect("drv", bind=("127.0.0.1", 0), stack=BARE, transport="tcp")
        try:
            got: list[bytes] = []
            b.on_message(lambda m: got.append(m.payload))
            reader, writer = await asyncio.open_connection(*b.address.endpoint)
            writer.write(b"\xff\xff\xff\xff garbage")  # 4 GiB frame: beyond max_receive_frame
            await writer.drain()
            assert await asyncio.wait_for(reader.read(), 5) == b""  # the member closed it
            writer.close()
            reader2, writer2 = await asyncio.open_connection(*b.address.endpoint)
            writer2.write(b"\x00\x00\x00\x00")  # zero length is never a frame
            await writer2.drain()
            assert await asyncio.wait_for(reader2.read(), 5) == b""
            writer2.close()
            a.send(b"still works", dest=placeholder(b))
            await _wait(lambda: got == [b"still works"])
            assert b.metrics()["runtime.tcp_bad_length"] == 2
        finally:
            a.close()
            b.close()

    asyncio.run(main())


def test_tcp_frames_to_an_unreachable_peer_are_dropped_then_the_peer_is_reached() -> None:
    async def main() -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]  # nobody listens here yet
        a = await Channel.connect("drv", bind=("127.0.0.1", 0), stack=BARE, transport="tcp")
        b: Channel | None = None
        try:
            a.send(b"lost", dest=Address("127.0.0.1", port, 0))
            await _wait(lambda: a.metrics().get("runtime.tcp_connect_failures", 0) == 1)
            assert a.metrics()["runtime.tcp_frames_dropped"] == 1
            b = await Channel.connect("drv", bind=("127.0.0.1", port), stack=BARE, transport="tcp")
            got: list[bytes] = []
            b.on_message(lambda m: got.append(m.payload))
            await asyncio.sleep(0.6)  # past the reconnect delay

            async def resend_until_received() -> None:
                while not got:
                    a.send(b"again", dest=Address("127.0.0.1", port, 0))
                    await asyncio.sleep(0.1)

            await asyncio.wait_for(resend_until_received(), 5)
            assert got[0] == b"again"
        finally:
            a.close()
            if b is not None:
                b.close()

    asyncio.run(main())


def test_udp_garbage_datagrams_are_counted_and_the_member_keeps_working() -> None:
    async def main() -> None:
        a = await Channel.connect("drv", bind=("127.0.0.1", 0), stack=BARE)
        b = await Channel.connect("drv", bind=("127.0.0.1", 0), stack=BARE)
        try:
            got: list[bytes] = []
            b.on_message(lambda m: got.append(m.payload))
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                for i in range(200):
                    s.sendto(bytes([i % 256]) * (1 + i * 7), b.address.endpoint)
            a.send(b"fine", dest=placeholder(b))
            await _wait(lambda: got == [b"fine"] and b.metrics().get("transport.bad_frames", 0) == 200)
        finally:
            a.close()
            b.close()

    asyncio.run(main())


def test_bad_configuration_is_refused_before_binding() -> None:
    async def main() -> None:
        with pytest.raises(ConfigError, match=r"transport: 'sctp' is not allowed; allowed values: udp, tcp"):
            await Channel.connect("drv", bind=("127.0.0.1", 0), stack=BARE, transport="sctp")
        big = [{"layer": "transport", "max_frame_size": "1MiB"}]
        with pytest.raises(ConfigError, match=r"max_frame_size: .* too large for UDP"):
            await Channel.connect("drv", bind=("127.0.0.1", 0), stack=big)
        with pytest.raises(ConfigError, match=r"unknown key 'max_frame'"):
            await Channel.connect("drv", bind=("127.0.0.1", 0), stack=[{"layer": "transport", "max_frame": 10}])

    asyncio.run(main())


def test_tcp_reconnects_after_the_peer_restarts_on_its_endpoint() -> None:
    async def main() -> None:
        a = await Channel.connect("drv", bind=("127.0.0.1", 0), stack=BARE, transport="tcp")
        b = await Channel.connect("drv", bind=("127.0.0.1", 0), stack=BARE, transport="tcp")
        b2: Channel | None = None
        try:
            got: list[bytes] = []
            b.on_message(lambda m: got.append(m.payload))
            a.send(b"first", dest=placeholder(b))
            await _wait(lambda: got == [b"first"])
            endpoint = b.address.endpoint
            b.close()  # the peer goes away; a's connection to it breaks
            b2 = await Channel.connect("drv", bind=endpoint, stack=BARE, transport="tcp")
            got2: list[bytes] = []
            b2.on_message(lambda m: got2.append(m.payload))

            async def resend_until_received() -> None:
                while not got2:
                    a.send(b"after restart", dest=Address(*endpoint, 0))
                    await asyncio.sleep(0.05)

            await asyncio.wait_for(resend_until_received(), 5)
            assert got2[0] == b"after restart"
            assert a.metrics()["runtime.tcp_connects"] == 2
        finally:
            a.close()
            b.close()
            if b2 is not None:
                b2.close()

    asyncio.run(main())
