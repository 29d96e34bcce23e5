"""``groupcluster`` with every layer registered: the benchmarks start members through this script.

The sequencer layer is imported explicitly (until the ``groupcluster.protocols`` package imports it), so a
member can run the ``total-order`` stack. Also a plain file, so ``python -m cProfile`` can run it.
"""

import sys

import groupcluster.protocols.sequencer  # noqa: F401  (registers the "sequencer" layer)
from groupcluster.cli import main

if __name__ == "__main__":
    sys.exit(main())
