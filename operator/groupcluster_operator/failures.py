"""Unexpected member exits in a row (the status' ``failures``) and the back-off that paces their replacement."""

from __future__ import annotations

import datetime
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Back-off between replacements of members that keep exiting: 5 s doubling to 5 minutes (the kubelet's
# CrashLoopBackOff runs from 10 s to 5 minutes); the first exit is replaced at once.
FAILURE_BACKOFF_START = 5
FAILURE_BACKOFF_MAX = 300


def failure_backoff(count: int) -> int:
    """Seconds before a member is replaced after ``count`` unexpected exits in a row (0: at once).

    A single exit (a crash, a killed process, a lost node) says nothing about the next member, so it is replaced
    at once; from the second in a row on, the image or the settings are the likelier cause, and creating pods as
    fast as they die only floods the cluster with them.
    """
    if count <= 1:
        return 0
    return int(min(FAILURE_BACKOFF_START * 2 ** (count - 2), FAILURE_BACKOFF_MAX))


def _parse_time(text: str) -> datetime.datetime | None:
    try:
        return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    except (TypeError, ValueError):
        return None


def _format_time(when: datetime.datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Failures:
    """Unexpected member exits in a row (the status' ``failures``): what paces their replacement.

    ``seen`` names the failed pods already counted (they stay while a back-off runs), so each exit counts once.
    The count starts afresh when the spec changes (a new image may well fix it) and once the cluster is Ready.
    """

    count: int = 0
    last_pod: str = ""
    last_reason: str = ""
    last_time: str = ""
    seen: tuple[str, ...] = ()
    spec_hash: str = ""

    @classmethod
    def from_status(cls, raw: Any, spec_hash: str) -> Failures:
        if not isinstance(raw, Mapping):
            return cls(spec_hash=spec_hash)
        seen = tuple(str(n) for n in raw.get("failedPods") or ())
        if raw.get("specHash") != spec_hash:
            return cls(seen=seen, spec_hash=spec_hash)
        count = raw.get("count")
        return cls(
            count=count if type(count) is int and count > 0 else 0,
            last_pod=str(raw.get("lastPod") or ""),
            last_reason=str(raw.get("lastReason") or ""),
            last_time=str(raw.get("lastTime") or ""),
            seen=seen,
            spec_hash=spec_hash,
        )

    def retry_at(self) -> datetime.datetime | None:
        """When the next replacement may be created (None: at once)."""
        last = _parse_time(self.last_time)
        delay = failure_backoff(self.count)
        return None if last is None or not delay else last + datetime.timedelta(seconds=delay)

    def wait_seconds(self, now: str) -> int:
        at, current = self.retry_at(), _parse_time(now)
        if at is None or current is None:
            return 0
        return max(0, math.ceil((at - current).total_seconds()))

    def to_status(self) -> dict[str, Any]:
        at = self.retry_at()
        return {
            "count": self.count,
            "lastPod": self.last_pod,
            "lastReason": self.last_reason,
            "lastTime": self.last_time,
            "retryAfter": _format_time(at) if at is not None else "",
            "failedPods": list(self.seen),
            "specHash": self.spec_hash,
        }
