"""Session fixture for end-to-end tests: a real local Kubernetes control plane (scripts/local-kube).

The fixture builds the pinned binaries when the cache lacks them (a clear failure if Go is missing, never
a skip), starts a private instance in a temporary state directory, yields a helper around the real
kubectl and helm binaries (kubeharness.Kube), and stops every process it started at the end, whatever the
outcome.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LOCAL_KUBE = REPO / "scripts" / "local-kube"
sys.path.insert(0, str(REPO / "scripts"))

from localkube import build  # noqa: E402
from localkube.controlplane import ControlPlane  # noqa: E402

from .kubeharness import Kube, wait_for  # noqa: E402


def _local_kube_env() -> dict[str, str]:
    env = dict(os.environ)
    # The node agent (and so every pod of the project's image) runs on the interpreter running the tests.
    env["LOCAL_KUBE_PYTHON"] = sys.executable
    return env


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
