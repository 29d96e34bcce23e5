"""Pure machinery shared by every layer: addresses, messages, headers, views, digests, wire codec, Layer, Stack.

Nothing in this package performs I/O, reads the clock or uses the global random generator.
"""
