"""Protocol layers, one module or package each. Importing this package registers every layer by name."""

from . import discovery, faults, fd, flow, flush, frag, gms, merge, nakack, sequencer, stable, transport, unicast  # noqa: F401
