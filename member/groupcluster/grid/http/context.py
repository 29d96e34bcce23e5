"""What the HTTP API reads from the running member: :class:`MemberContext`."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..caches import CacheSet
from ..driver.grid_runtime import GridRuntime

if TYPE_CHECKING:
    from ...runtime.channel import Channel


@dataclass
class MemberContext:
    """What the HTTP API reads from the running member (the channel appears once joined)."""

    cluster: str
    grid: GridRuntime | None
    request_leave: Callable[[], None]
    channel: Callable[[], Channel | None]
    # The default cache and the named ones (--cache); None when the member declares no named cache.
    caches: CacheSet | None = None
    started: float = field(default_factory=time.time)
    http_requests: dict[str, int] = field(default_factory=dict)
    # Bearer tokens: ``admin_token`` guards POST /v1/leave; ``kv_token`` guards the data endpoints (/v1/kv,
    # /v1/batch, /v1/segments, /v1/changes). None leaves them open. Probes, status and metrics stay open so
    # Kubernetes and Prometheus need no secret.
    admin_token: str | None = None
    kv_token: str | None = None
    # Set when the member begins to stop (before its grid hand-off): new data requests are refused with 503,
    # reason "leaving", and every answer closes its connection (app.py: the leaving middlewares and close_http).
    leaving: bool = False
