"""Protocol ids: the one place every header's id is assigned (collisions also fail at import)."""

from typing import Final

TRANSPORT: Final = 1
DISCOVERY: Final = 2
MERGE: Final = 3
FD: Final = 4
NAKACK: Final = 5
UNICAST: Final = 6
STABLE: Final = 7
GMS: Final = 8
FLOW: Final = 9
FRAG: Final = 10
FLUSH: Final = 11
SEQUENCER: Final = 12
STATE: Final = 13
FAULTS: Final = 14
AUTH: Final = 15
GRID: Final = 20
