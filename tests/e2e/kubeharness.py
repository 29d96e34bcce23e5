"""A running local control plane as the e2e tests see it: :class:`Kube` (kubectl, helm, the pods' processes and
logs) and :func:`wait_for`.

Not a test module: tests/e2e/conftest.py's ``kube`` fixture yields a :class:`Kube`, and the e2e tests import
these names from here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

from localkube.controlplane import ControlPlane  # noqa: E402

T = TypeVar("T")


@dataclass
class Kube:
    """A running local cluster and the real client binaries that talk to it."""

    kubeconfig: Path
    bin_dir: Path
    state_dir: Path

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args]
        res = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
        if check and res.returncode != 0:
            raise AssertionError(f"{' '.join(cmd[1:])} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
        return res

    def json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json").stdout)

    def helm(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bin_dir / "helm"), f"--kubeconfig={self.kubeconfig}", *args]
        env = dict(os.environ)
        # helm keeps caches and config under these; keep them inside the instance.
        for var, sub in (
            ("HELM_CACHE_HOME", "cache"),
            ("HELM_CONFIG_HOME", "config"),
            ("HELM_DATA_HOME", "data"),
        ):
            env[var] = str(self.state_dir / "helm" / sub)
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        if check and res.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
        return res

    @property
    def server(self) -> str:
        return str(ControlPlane(self.state_dir).state()["server"])

    @property
    def ca_file(self) -> Path:
        return self.state_dir / "pki" / "ca.crt"

    def pod_pids(self, uid: str) -> list[int]:
        """Live processes the node agent started for a pod (found by the marker in their environment)."""
        marker = f"LOCALKUBE_POD_UID={uid}".encode()
        pids = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if marker not in f.read().split(b"\0"):
                        continue
                with open(f"/proc/{entry}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                        continue
            except OSError:
                continue
            pids.append(int(entry))
        return pids

    def pod_log_file(self, namespace: str, name: str, container: str) -> Path:
        matches = sorted((self.state_dir / "logs" / "pods").glob(f"{namespace}_{name}_*/{container}.log"))
        assert matches, f"no log file for {namespace}/{name}/{container}"
        return matches[-1]


def wait_for(what: str, fn: Callable[[], T | None], timeout: float = 60, interval: float = 0.3) -> T:
    """Poll fn until it returns something truthy; fail naming what was awaited."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            val = fn()
        except AssertionError as e:
            val, last = None, e
        if val:
            return val
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}" + (f" (last: {last})" if last else ""))
