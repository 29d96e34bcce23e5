"""Python clients of the grid's HTTP API (moved into a package; the split follows)."""

from ._async.client import *  # noqa: F403
from ._async.client import (  # noqa: F401
    BATCH_KEY_LIMIT,
    MAX_LIFESPAN_SECONDS,
    VALUE_LIMIT,
    _BatchRun,
    _put_ops,
    _Reply,
    _Router,
    _tx_failure,
    _tx_path,
    _TxCore,
)
