"""The answers the handlers share: JSON errors (with ``Retry-After`` on a 503), transaction failures, and
batch results and bodies in the request's format (msgpack or JSON)."""

from __future__ import annotations

import base64
from typing import Any

import msgpack
from aiohttp import web

from ..errors import (
    GridError,
    GridLeaving,
    GridTimeout,
    GridTxBusy,
    GridTxError,
    GridTxNotFound,
    GridTxTimeout,
    GridTxUnavailable,
    GridTxUnknown,
    GridUnavailable,
)
from ..lifespan import LIFESPAN_PARAM
from ..messages import GET
from ..node import OpResult
from ..tx.messages import TxId

RETRY_AFTER_SECONDS = "1"
MSGPACK = "application/msgpack"


def json_error(status: int, message: str, **extra: Any) -> web.Response:
    headers = {"Retry-After": RETRY_AFTER_SECONDS} if status == 503 else None
    return web.json_response({"error": message, **extra}, status=status, headers=headers)


LEAVING_ERROR = "this member is leaving the grid: send the request to another member"


def unavailable(exc: GridError) -> web.Response:
    """The 503 for a grid that refuses for now: ``reason`` ``leaving`` when this member is leaving (the client
    goes to another member), else the refusal's text (degraded partition, not joined yet)."""
    return json_error(503, str(exc), reason="leaving" if isinstance(exc, GridLeaving) else str(exc))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


OK_DOC: dict[str, Any] = {"status": 200}  # a write's answer in a batch; shared, so never changed


def result_doc(res: OpResult, binary: bool, version: int | None = None) -> dict[str, Any]:
    """One operation's entry in a batch answer (``version``: of a get's value, when known)."""
    if res.ok:
        if res.kind == GET:
            if res.value is None:
                return {"status": 404}
            doc: dict[str, Any] = {"status": 200, "value": res.value if binary else b64(res.value)}
            if version is not None:
                doc["version"] = version
            return doc
        return {"status": 200}
    if res.reason == "locked":
        return {"status": 409, "error": res.error, "reason": "locked"}
    if res.reason == "full":
        return {"status": 507, "error": res.error, "reason": "full"}
    if "unavailable" in res.error:
        return {"status": 503, "error": res.error}
    if "timed out" in res.error:
        return {"status": 504, "error": res.error}
    return {"status": 500, "error": res.error or "operation failed"}


def committed_doc(tx: TxId, res: OpResult) -> dict[str, Any]:
    doc: dict[str, Any] = {"tx": str(tx), "committed": True, "attempts": res.attempts}
    if res.reason:
        doc["reason"] = res.reason  # e.g. "mixed": committed, but a participant had been resolved the other way
    return doc


def tx_failure(exc: GridError) -> web.Response:
    """The answer for a transaction that did not commit: 409 aborted (conflict, lock timeout, rolled back),
    503 unavailable, 504 timed out (both rolled back: safe to run again), 404 unknown interactive transaction,
    500 outcome unknown. Always JSON ``{"error", "tx", "committed", "reason"}``."""
    tx = getattr(exc, "tx", None)
    reason = getattr(exc, "reason", None)
    committed: bool | None = False
    if isinstance(exc, GridTxNotFound):
        status = 404
    elif isinstance(exc, GridTxBusy):
        status = 409
    elif isinstance(exc, GridTxUnknown):
        status, committed = 500, None
    elif isinstance(exc, GridLeaving):
        status, reason = 503, "leaving"
    elif isinstance(exc, GridTxUnavailable | GridUnavailable):
        status, reason = 503, "unavailable"
    elif isinstance(exc, GridTxTimeout | GridTimeout):
        status, reason = 504, "timeout"
    elif isinstance(exc, GridTxError):
        status = 409
    else:
        status = 500
    return json_error(
        status, str(exc), tx=str(tx) if tx is not None else None, committed=committed, reason=reason or "error"
    )


def packed(doc: dict[str, Any], binary: bool, status: int = 200) -> web.Response:
    if binary:
        return web.Response(body=msgpack.packb(doc, use_bin_type=True), status=status, content_type=MSGPACK)
    return web.json_response(doc, status=status)


def no_lifespan_here(request: web.Request, where: str = LIFESPAN_PARAM) -> web.Response:
    """The 400 for a lifespan on an invalidation cache: each member holds its own copies, so no owner could
    expire an entry everywhere."""
    name = request.match_info.get("cache")
    return json_error(
        400,
        f"{where}: lifespans are not supported for invalidation caches (cache {name!r} is one); nothing was written",
        cache=name,
    )
