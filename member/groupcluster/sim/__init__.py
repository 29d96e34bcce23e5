"""Deterministic simulation: virtual clock and network, fault injection, histories and property checkers."""
