"""Protocol layers, one module each (SEQUENCER: a package). Importing this package registers every layer by name."""

from . import discovery, faults, fd, flow, flush, frag, gms, merge, nakack, sequencer, stable, transport, unicast  # noqa: F401
