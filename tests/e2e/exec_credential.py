#!/usr/bin/env python3
"""A kubeconfig ``exec`` credential plugin for the tests, in the manner of ``aws eks get-token``.

Prints an ExecCredential whose token is the content of ``$TEST_EXEC_TOKEN_FILE`` (read on every run, so a
test can rotate it), valid for ``$TEST_EXEC_TTL`` seconds when set; appends one line per run to
``$TEST_EXEC_LOG`` when set, so a test can count how often the client asked.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path


def main() -> int:
    info = json.loads(os.environ.get("KUBERNETES_EXEC_INFO") or "{}")
    api_version = info.get("apiVersion") or "client.authentication.k8s.io/v1"
    token = Path(os.environ["TEST_EXEC_TOKEN_FILE"]).read_text(encoding="utf-8").strip()
    status: dict[str, str] = {"token": token}
    ttl = os.environ.get("TEST_EXEC_TTL")
    if ttl:
        until = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=float(ttl))
        status["expirationTimestamp"] = until.strftime("%Y-%m-%dT%H:%M:%SZ")
    log = os.environ.get("TEST_EXEC_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(f"{token[:12]}\n")
    json.dump({"apiVersion": api_version, "kind": "ExecCredential", "status": status}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
