"""Deterministic simulation: virtual clock and network, fault injection, histories and property checkers.

``loop`` (virtual clock), ``network`` (links and faults), ``world`` (members driving real stacks),
``faults`` (per-seed fault mixes), ``scenario`` (one seed's run: safety phase, then liveness phase),
``runner`` (many seeds, in worker processes), ``history`` (the event format shared with real processes),
``checkers`` (the properties), ``cli`` and ``check_cli`` (the ``groupcluster sim`` and ``check`` commands).
See docs/simulation.md.
"""
