"""The member's HTTP API (aiohttp): the endpoints and their answers are described in :mod:`.app`."""

from .app import SHUTDOWN_TIMEOUT, build_app, close_http
from .context import MemberContext
from .metrics import render_metrics

__all__ = ["SHUTDOWN_TIMEOUT", "MemberContext", "build_app", "close_http", "render_metrics"]
