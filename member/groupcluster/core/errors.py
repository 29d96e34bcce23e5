"""Exceptions raised by the core: bad configuration and bad wire input."""


class GroupClusterError(Exception):
    """Base class of the project's own errors."""


class ConfigError(GroupClusterError, ValueError):
    """A stack or layer configuration is wrong; the message names the key and what is allowed."""


class WireError(GroupClusterError, ValueError):
    """A frame or header failed validation; the message says which field and why."""
