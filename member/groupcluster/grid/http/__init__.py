"""The member's HTTP API (aiohttp): the endpoints and their answers are described in :mod:`.app`; this package
exports what the member runtime needs to serve it."""

from .app import SHUTDOWN_TIMEOUT, build_app, close_http
from .context import MemberContext

__all__ = ["SHUTDOWN_TIMEOUT", "MemberContext", "build_app", "close_http"]
