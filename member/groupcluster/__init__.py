"""groupcluster: group communication and a data grid for Python.

The application API is :class:`Channel` (asyncio): connect to a cluster, send to all or to one member,
receive messages and view changes, leave. Everything below it is sans-IO protocol layers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import compiled as _compiled

# First, before any submodule is imported: it decides whether the mypyc-compiled modules or their sources run.
_compiled.install()

__all__ = ["Channel", "ChannelClosed", "ChannelError"]

if TYPE_CHECKING:
    from .runtime import Channel, ChannelClosed, ChannelError


def __getattr__(name: str) -> Any:
    # Imported lazily: `groupcluster sim` and the protocol layers must not pay for asyncio/aiohttp imports.
    if name in __all__:
        from . import runtime

        return getattr(runtime, name)
    raise AttributeError(f"module 'groupcluster' has no attribute {name!r}")
