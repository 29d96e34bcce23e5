"""A member process whose application state is the log of multicasts it applied, for state-transfer tests.

    python tests/integration/state_app.py --bind HOST:PORT --hosts H:P,... --cluster NAME --out DIR
        [--stack vsync] [--fetch] [--send-count N] [--send-rate R] [--padding BYTES] [--wait-members M]

The state is ``padding`` filler bytes (to make the transfer take many chunks) and then one line per applied
multicast, ``sender payload``. With ``--fetch`` the member asks for the group's state after joining. It sends
``send-count`` multicasts (``<n>``) at ``send-rate`` per second, writes ``DIR/<port-host>.status.json``
(address, view size, state ready, sent, applied) every 0.2 s, and on SIGTERM writes its final log to
``DIR/<host>.log.txt`` and leaves.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
from pathlib import Path

from groupcluster.core.message import Message
from groupcluster.runtime.channel import Channel


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bind", required=True)
    ap.add_argument("--hosts", required=True)
    ap.add_argument("--cluster", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--stack", default="vsync")
    ap.add_argument("--fetch", action="store_true")
    ap.add_argument("--send-count", type=int, default=0)
    ap.add_argument("--send-rate", type=float, default=200.0)
    ap.add_argument("--padding", type=int, default=0)
    ap.add_argument("--wait-members", type=int, default=0, help="start sending once the view has this many")
    args = ap.parse_args()
    host, port = args.bind.rsplit(":", 1)
    out = Path(args.out)
    name = host
    log: list[str] = []
    padding = b"p" * args.padding

    def on_message(msg: Message) -> None:
        if msg.dest is None:
            log.append(f"{msg.src} {msg.payload.decode()}")

    def get_state() -> bytes:
        return padding + b"\n" + "\n".join(log).encode()

    def set_state(data: bytes) -> None:
        _pad, _, body = data.partition(b"\n")
        log[:] = body.decode().split("\n") if body else []

    ch = await Channel.connect(
        args.cluster,
        bind=(host, int(port)),
        initial_hosts=args.hosts.split(","),
        stack=args.stack,
        stack_overrides={"fd": {"interval": 0.5, "timeout": 2.0, "verify_timeout": 0.5}},
        on_message=on_message,
        get_state=get_state,
        set_state=set_state if args.fetch else None,
        join_timeout=60,
    )
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    sent = 0

    def status() -> None:
        st = {
            "address": str(ch.address),
            "view": len(ch.members),
            "state_ready": ch.state_ready if ch.state_requested else True,
            "donor": None if ch.state_donor is None else str(ch.state_donor),
            "sent": sent,
            "applied": len(log),
            "covered": ch.covered,
            "metrics": {k: v for k, v in ch.metrics().items() if k.startswith(("state.", "nakack.", "flush.", "gms."))},
        }
        tmp = out / f"{name}.status.tmp"
        tmp.write_text(json.dumps(st))
        tmp.replace(out / f"{name}.status.json")

    async def reporter() -> None:
        while True:
            status()
            await asyncio.sleep(0.2)

    rep = asyncio.create_task(reporter())
    if args.wait_members:
        await ch.wait_for_view(lambda v: len(v.members) >= args.wait_members, 60)
    interval = 1.0 / args.send_rate
    while sent < args.send_count and not stop.is_set():
        await ch.send_async(str(sent).encode())
        sent += 1
        await asyncio.sleep(interval)
    await stop.wait()
    status()
    (out / f"{name}.log.txt").write_text("\n".join(log))
    rep.cancel()
    await ch.leave()


if __name__ == "__main__":
    asyncio.run(main())
