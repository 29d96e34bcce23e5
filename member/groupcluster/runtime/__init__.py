"""The asyncio runtime: runs a sans-IO Stack on real UDP or TCP sockets with real timers.

``driver`` moves bytes and fires timers, ``channel`` is the application API (:class:`Channel`),
``member_cli`` is ``groupcluster member``, ``file_discovery`` and ``kube_discovery`` feed the discovery layer,
``faults_control`` steers a member's fault injection from a file and ``recorder`` writes histories as JSON
lines. The tools built on it (``groupcluster local``, ``demo``, ``chaos``) live in :mod:`groupcluster.tools`.
"""

from __future__ import annotations

from .channel import Channel, ChannelClosed, ChannelError

__all__ = ["Channel", "ChannelClosed", "ChannelError"]
