"""The node agent's pure rules (no cluster needed): $(VAR) expansion, downward API, quantities, the
project-image command mapping, and the version pins staying in one place."""

from __future__ import annotations

import sys
from decimal import Decimal
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

from localkube import build, podspec  # noqa: E402


def test_expand_follows_kubernetes_rules() -> None:
    env = {"POD_IP": "127.0.0.10", "A": "x"}
    assert podspec.expand("--bind=$(POD_IP)", env) == "--bind=127.0.0.10"
    assert podspec.expand("$(MISSING)-$(A)", env) == "$(MISSING)-x"
    assert podspec.expand("$$(A) $$", env) == "$(A) $"


def test_field_refs() -> None:
    pod = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u", "labels": {"app": "web"}},
        "spec": {"nodeName": "n1", "serviceAccountName": "sa"},
        "status": {"podIP": "127.0.0.11"},
    }
    get = lambda path: podspec.field_ref(pod, path, "n1", "127.0.0.1")  # noqa: E731
    assert get("metadata.name") == "p"
    assert get("metadata.namespace") == "ns"
    assert get("metadata.labels['app']") == "web"
    assert get("metadata.labels['absent']") == ""
    assert get("status.podIP") == "127.0.0.11"
    assert get("spec.nodeName") == "n1"
    assert get("spec.serviceAccountName") == "sa"
    assert get("status.hostIP") == "127.0.0.1"
    with pytest.raises(ValueError, match=r"unsupported fieldRef 'spec\.nonsense'"):
        get("spec.nonsense")


def test_quantities_and_resource_field_ref() -> None:
    assert podspec.parse_quantity("500m") == Decimal("0.5")
    assert podspec.parse_quantity("1Gi") == 1024**3
    assert podspec.parse_quantity("2") == 2
    c = {"resources": {"limits": {"memory": "64Mi"}, "requests": {"cpu": "250m"}}}
    node = {"cpu": "2", "memory": "1Gi"}
    assert podspec.resource_field_ref(c, {"resource": "limits.memory", "divisor": "1Mi"}, node) == "64"
    assert podspec.resource_field_ref(c, {"resource": "limits.cpu"}, node) == "2"
    assert podspec.resource_field_ref(c, {"resource": "requests.cpu", "divisor": "1m"}, node) == "250"
    assert podspec.resource_field_ref(c, {"resource": "requests.cpu"}, node) == "1"


def test_project_image_maps_to_this_environment() -> None:
    env = {"POD_IP": "127.0.0.10"}
    argv = podspec.resolve_argv({"image": "groupcluster:dev", "args": ["member", "--bind", "$(POD_IP)"]}, env)
    assert argv[-3:] == ["member", "--bind", "127.0.0.10"]
    assert argv[0].endswith("groupcluster") or argv[0] == sys.executable
    py = podspec.resolve_argv({"image": "x/groupcluster", "command": ["python3", "-V"]}, env)
    assert py == [sys.executable, "-V"]
    other = podspec.resolve_argv({"image": "busybox", "command": ["sh", "-c", "echo $(POD_IP)"]}, env)
    assert other == ["sh", "-c", "echo 127.0.0.10"]
    with pytest.raises(ValueError, match="command must be given"):
        podspec.resolve_argv({"image": "nginx"}, env)


def test_go_mods_agree_with_versions_env() -> None:
    # Every version lives in kube/versions.env; the go.mod files must pin exactly those.
    build.check_pins(build.read_versions())
