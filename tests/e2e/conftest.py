"""Session fixture for end-to-end tests: a real local Kubernetes control plane (scripts/local-kube).

The fixture builds the pinned binaries when the cache lacks them (a clear failure if Go is missing, never
a skip), starts a private instance in a temporary state directory, yields a helper around the real
kubectl and helm binaries, and stops every process it started at the end, whatever the outcome.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

REPO = Path(__file__).resolve().parents[2]
LOCAL_KUBE = REPO / "scripts" / "local-kube"
sys.path.insert(0, str(REPO / "scripts"))

from localkube import build  # noqa: E402
from localkube.controlplane import ControlPlane  # noqa: E402

T = TypeVar("T")


def _local_kube_env() -> dict[str, str]:
    env = dict(os.environ)
    # The node agent (and so every pod of the project's image) runs on the interpreter running the tests.
    env["LOCAL_KUBE_PYTHON"] = sys.executable
    return env


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


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kube]:
    if build.missing_binaries():
        # A cold machine builds here (minutes, once); a broken toolchain fails loudly, it does not skip.
        res = subprocess.run([str(LOCAL_KUBE), "build"], env=_local_kube_env(), text=True, capture_output=True)
        if res.returncode != 0:
            pytest.fail(f"scripts/local-kube build failed:\n{res.stdout}\n{res.stderr}", pytrace=False)
    state_dir = tmp_path_factory.mktemp("localkube")
    cmd = [str(LOCAL_KUBE), f"--state-dir={state_dir}"]
    try:
        res = subprocess.run([*cmd, "up"], env=_local_kube_env(), text=True, capture_output=True, timeout=300)
        if res.returncode != 0:
            pytest.fail(f"scripts/local-kube up failed:\n{res.stdout}\n{res.stderr}", pytrace=False)
        kubeconfig = Path(res.stdout.strip().splitlines()[-1])
        assert kubeconfig.is_file(), res.stdout
        yield Kube(kubeconfig=kubeconfig, bin_dir=build.bin_dir(), state_dir=state_dir)
    finally:
        down = subprocess.run([*cmd, "down"], env=_local_kube_env(), text=True, capture_output=True, timeout=120)
        left = ControlPlane(state_dir).owned_pids()
        assert down.returncode == 0 and not left, f"local-kube down left {left}:\n{down.stdout}\n{down.stderr}"


@pytest.fixture
def namespace(kube: Kube) -> Iterator[str]:
    """A fresh namespace per test, with its default service account in place (pods need it)."""
    ns = f"t-{uuid.uuid4().hex[:8]}"
    kube.kubectl("create", "namespace", ns)
    wait_for(
        f"serviceaccount {ns}/default",
        lambda: kube.kubectl("get", "sa", "default", "-n", ns, check=False).returncode == 0,
        30,
    )
    yield ns
    kube.kubectl("delete", "namespace", ns, "--wait=false", check=False)
