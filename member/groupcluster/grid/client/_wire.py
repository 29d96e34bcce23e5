"""What the clients send and read on the wire: limits, headers, request paths, argument checks and the
decoding of answers (no I/O here)."""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

import msgpack

from ..errors import (
    TX_ERRORS,
    GridError,
    GridRequestError,
    GridTxAborted,
    GridTxError,
    GridTxTimeout,
    GridTxUnavailable,
    GridTxUnknownOutcome,
)
from ..lifespan import check_lifespan

DEFAULT_TIMEOUT = 60.0
DEFAULT_REQUEST_TIMEOUT = 35.0  # above the grid's default op_timeout (30 s): its 504 arrives first
RETRYABLE_STATUS = frozenset({502, 503, 504})
DEFAULT_BATCH_SIZE = 1000  # operations per batch request (the server takes up to 10,000)
BATCH_BYTES = 4 * 1024 * 1024  # keys and values per batch request, roughly
BATCH_KEY_LIMIT = 64 * 1024  # the grid's key limit; batch keys travel in the body, not the URL
VALUE_LIMIT = 4 * 1024 * 1024
MSGPACK = "application/msgpack"
JSON = "application/json"
VERSION_HEADER = "X-Grid-Version"
DEADLINE_HEADER = "X-Grid-Deadline"  # see the package docstring, "Retries"
DEFAULT_CLOCK_SKEW = 1.0  # seconds the members' clocks may differ from the client's (the deadline's margin)
# A commit goes on a connection used this recently or a fresh one: the server may have closed one idle for
# longer, and a commit is never re-sent on its own (the transports, request(once=True)).
IDLE_REFRESH_SECONDS = 10.0
TX_MODES = ("optimistic", "pessimistic")


@dataclass
class _Reply:
    status: int
    body: bytes
    version: int | None = None  # the X-Grid-Version header of a key/value GET


def normalize_endpoint(ep: str) -> str:
    """``host:port`` or ``http://host:port`` -> ``http://host:port`` (no trailing slash)."""
    ep = ep.strip().rstrip("/")
    if not ep:
        raise ValueError("endpoint: empty")
    if "://" not in ep:
        ep = f"http://{ep}"
    parsed = urllib.parse.urlsplit(ep)
    if parsed.scheme != "http" or not parsed.hostname or parsed.port is None:
        raise ValueError(f"endpoint: expected host:port or http://host:port, got {ep!r}")
    return f"http://{parsed.hostname}:{parsed.port}"


def key_path(key: bytes) -> str:
    if type(key) is not bytes:
        raise TypeError(f"key: expected bytes, got {type(key).__name__}")
    try:
        text = key.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("key: the HTTP API takes UTF-8 keys") from None
    return "/v1/kv/" + urllib.parse.quote(text, safe="")


def _with_lifespan(path: str, lifespan: float | None) -> str:
    # repr of a float reads back exactly (float() on the member): 30.0, 0.5, 1e-06.
    return path if lifespan is None else f"{path}?lifespan={urllib.parse.quote(repr(lifespan))}"


def _changes_path(segment: int, after: int, limit: int) -> str:
    if type(segment) is not int or segment < 0:
        raise ValueError(f"segment: expected a non-negative int, got {segment!r}")
    if type(after) is not int or after < 0:
        raise ValueError(f"after: expected a version (int >= 0), got {after!r}")
    if not 1 <= limit <= 10_000:
        raise ValueError(f"limit: expected 1 to 10000, got {limit}")
    return f"/v1/changes/{segment}?after={after}&limit={limit}"


def _scan_path(segment: int, after: str | None, limit: int) -> str:
    if type(segment) is not int or segment < 0:
        raise ValueError(f"segment: expected a non-negative int, got {segment!r}")
    if not 1 <= limit <= 10_000:
        raise ValueError(f"page_size: expected 1 to 10000, got {limit}")
    query = {"limit": str(limit)}
    if after is not None:
        query["after"] = after
    return f"/v1/segments/{segment}?{urllib.parse.urlencode(query)}"


def _tx_path(tx: str, action: str) -> str:
    return "/v1/tx/" + urllib.parse.quote(tx, safe="") + "/" + action


def _check_key(key: Any) -> bytes:
    if type(key) is not bytes:
        raise TypeError(f"key: expected bytes, got {type(key).__name__}")
    if not 1 <= len(key) <= BATCH_KEY_LIMIT:
        raise ValueError(f"key: {len(key)} bytes is outside [1, {BATCH_KEY_LIMIT}]")
    return key


def _check_value(value: Any) -> bytes:
    if type(value) is not bytes:
        raise TypeError(f"value: expected bytes, got {type(value).__name__}")
    return value


def _check_lifespan(lifespan: Any) -> float | None:
    """``lifespan`` (seconds, or None: the entry never expires) as a float once it is one the members take."""
    if lifespan is None:
        return None
    if isinstance(lifespan, bool) or not isinstance(lifespan, int | float):
        raise TypeError(f"lifespan: expected seconds (int or float) or None, got {type(lifespan).__name__}")
    return check_lifespan(lifespan)


def _check_deadline_margin(request_timeout: float, clock_skew: float) -> None:
    if not request_timeout > 0:
        raise ValueError(f"request_timeout: expected seconds above 0, got {request_timeout}")
    if not 0 <= clock_skew < request_timeout:
        raise ValueError(f"clock_skew: expected 0 to below request_timeout ({request_timeout} s), got {clock_skew}")


def _deadline(request_timeout: float, clock_skew: float) -> str:
    """The ``X-Grid-Deadline`` value of an attempt starting now."""
    return f"{time.time() + request_timeout - clock_skew:.6f}"


def _check_batching(batch_size: int, parallel: int) -> None:
    if not 1 <= batch_size <= 10_000:
        raise ValueError(f"batch_size: expected 1 to 10000, got {batch_size}")
    if parallel < 1:
        raise ValueError(f"parallel: expected at least 1, got {parallel}")


def _check_reruns(retries: int) -> None:
    if type(retries) is not int or retries < 0:
        raise ValueError(f"retries: expected an int >= 0, got {retries!r}")


def _locked(body: bytes) -> bool:
    """A 409 answer saying a transaction holds the key (a plain write may be tried again)."""
    try:
        doc = json.loads(body)
    except ValueError:
        return False
    return isinstance(doc, dict) and doc.get("reason") == "locked"


def _version_header(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


def error_message(reply: _Reply) -> str:
    """The member's message in a refusal (its JSON ``error``, else the start of the body or the status text)."""
    try:
        data = json.loads(reply.body)
        return str(data.get("error") or data)
    except (ValueError, AttributeError):
        return reply.body[:200].decode("utf-8", errors="replace") or http.client.responses.get(reply.status, "")


def _tx_failure(reply: _Reply, tx: str | None) -> GridError:
    """The exception for a transaction request the member did not answer with 200: for a rollback, the class
    a member raises in-process for that reason (:data:`~..errors.TX_ERRORS`)."""
    try:
        doc = json.loads(reply.body)
        if not isinstance(doc, dict):
            raise ValueError("not a map")
    except ValueError:
        doc = {}
    message = str(doc.get("error") or error_message(reply))
    reason = doc.get("reason") if isinstance(doc.get("reason"), str) else ""
    tx = doc.get("tx") if isinstance(doc.get("tx"), str) else tx
    status = reply.status
    if status in (409, 503, 504):
        # Nothing of the transaction took effect: 409 (conflict, lock timeout, ...) and 503/504 (unavailable,
        # timed out) are rollbacks.
        by_status: dict[int, type[GridTxError]] = {503: GridTxUnavailable, 504: GridTxTimeout}
        reason = reason or {409: "aborted", 503: "unavailable", 504: "timeout"}[status]
        cls = TX_ERRORS.get(reason) or by_status.get(status, GridTxAborted)
        if not issubclass(cls, GridTxAborted):
            cls = GridTxAborted
        return cls(f"transaction {tx} aborted ({reason}): {message}", reason, tx, status)
    if status == 404 and tx is not None and "runs no data grid" not in message:
        # An interactive transaction the member no longer knows: rolled back (timeout, member restarted).
        return GridTxAborted(f"transaction {tx} aborted: {message}", "not_found", tx, status)
    if status == 500 and doc.get("committed", False) is None:
        return GridTxUnknownOutcome(f"transaction {tx}: outcome unknown: {message}", reason or "unknown", tx, status)
    return GridRequestError(status, message)


def _decode_ok(reply: _Reply, what: str) -> dict[str, Any]:
    try:
        doc = msgpack.unpackb(reply.body, raw=False)
        if not isinstance(doc, dict):
            raise ValueError("not a map")
    except Exception as exc:
        raise GridError(f"malformed answer to {what}: {exc}") from None
    return doc
