"""Client code in two forms: ``_async`` (asyncio, the source) and ``_sync`` (blocking, generated from it by
``scripts/unasync_client.py``)."""
