"""Protocol layers, one module each. Importing this package registers every layer by name."""

from . import transport  # noqa: F401
