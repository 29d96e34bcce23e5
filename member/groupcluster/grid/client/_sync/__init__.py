# Generated from ../_async/__init__.py by scripts/unasync_client.py: do not edit. Change the asyncio source, then run
# .venv/bin/python scripts/unasync_client.py (scripts/test checks that this file is current).
"""Client code in two forms: ``_async`` (asyncio, the source) and ``_sync`` (blocking, generated from it by
``scripts/unasync_client.py``)."""
