"""Protocol ids: the one place every header's id is assigned (collisions also fail at import)."""

TRANSPORT = 1
DISCOVERY = 2
MERGE = 3
FD = 4
NAKACK = 5
UNICAST = 6
STABLE = 7
GMS = 8
FLOW = 9
FRAG = 10
FLUSH = 11
SEQUENCER = 12
STATE = 13
FAULTS = 14
AUTH = 15
GRID = 20
