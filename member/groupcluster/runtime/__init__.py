"""The asyncio runtime: runs a sans-IO Stack on real UDP or TCP sockets with real timers.

``driver`` moves bytes and fires timers, ``channel`` is the application API (:class:`Channel`),
``member_cli`` is ``groupcluster member``, ``demo`` is ``groupcluster demo``, ``file_discovery`` feeds a
shared hosts file to the discovery layer and ``recorder`` writes histories as JSON lines.
"""

from __future__ import annotations

from .channel import Channel, ChannelClosed, ChannelError

__all__ = ["Channel", "ChannelClosed", "ChannelError"]
