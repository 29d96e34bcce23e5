"""Pure helpers of the node agent: how a pod spec turns into argv, environment and status values.

Nothing here does I/O, so the rules (downward API, ``$(VAR)`` expansion, which command runs for the
project's image, quantities) are unit-testable without a cluster.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import re
import sys
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any

# The standard mount point of the service-account volume; a process cannot have it (many pods share one
# filesystem here), so its files go to a per-pod directory named by GROUPCLUSTER_SA_DIR instead.
SA_MOUNT_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
PROJECT_IMAGE_MARK = "groupcluster"

_SUFFIXES = {
    "Ki": Decimal(1024),
    "Mi": Decimal(1024**2),
    "Gi": Decimal(1024**3),
    "Ti": Decimal(1024**4),
    "Pi": Decimal(1024**5),
    "Ei": Decimal(1024**6),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal(1000),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
}
_QTY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")


def parse_quantity(q: str | int | float) -> Decimal:
    """A Kubernetes resource quantity ("500m", "1Gi", "2") as a number of base units."""
    if isinstance(q, int | float):
        return Decimal(str(q))
    m = _QTY.match(q.strip())
    if not m:
        raise ValueError(f"bad quantity {q!r}")
    num, suf = m.group(1), m.group(2) or ""
    if "e" in num.lower() and suf:
        raise ValueError(f"bad quantity {q!r}")
    return Decimal(num) * _SUFFIXES[suf]


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def is_project_image(image: str) -> bool:
    return PROJECT_IMAGE_MARK in (image or "")


def env_key(name: str) -> str:
    """A volume name as an environment variable suffix: GROUPCLUSTER_VOLUME_<NAME>."""
    return re.sub(r"[^A-Za-z0-9]", "_", name).upper()


_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.\-]*)\)")


def expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: defined references are replaced, $$ escapes, others stay as written."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env[name] if name in env else m.group(0)

    return _VAR_REF.sub(sub, value)


_LABEL_REF = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


def field_ref(pod: Mapping[str, Any], path: str, node_name: str, host_ip: str) -> str:
    """The value of a downward-API fieldRef for this pod."""
    meta = pod.get("metadata", {})
    spec = pod.get("spec", {})
    status = pod.get("status", {})
    m = _LABEL_REF.match(path)
    if m:
        return str(meta.get(m.group(1), {}).get(m.group(2), ""))
    simple: dict[str, Any] = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", node_name),
        "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
        "status.hostIP": host_ip,
        "status.hostIPs": host_ip,
        "status.podIP": status.get("podIP", ""),
        "status.podIPs": ",".join(p["ip"] for p in status.get("podIPs", [])) or status.get("podIP", ""),
    }
    if path == "metadata.labels":
        return "\n".join(f'{k}="{v}"' for k, v in sorted(meta.get("labels", {}).items()))
    if path == "metadata.annotations":
        return "\n".join(f'{k}="{v}"' for k, v in sorted(meta.get("annotations", {}).items()))
    if path not in simple:
        raise ValueError(f"unsupported fieldRef {path!r}")
    return str(simple[path])


def resource_field_ref(container: Mapping[str, Any], ref: Mapping[str, Any], node_alloc: Mapping[str, str]) -> str:
    """A resourceFieldRef value: the container's request/limit, or the node's allocatable when unset
    (the kubelet's rule for limits), divided by the divisor and rounded up."""
    res = ref.get("resource", "")
    kind, _, name = res.partition(".")
    resources = container.get("resources", {})
    value = resources.get(kind, {}).get(name)
    if value is None:
        if kind == "limits":
            value = node_alloc.get(name, "0")
        elif kind == "requests":
            # An unset request defaults to the limit when that is set, otherwise to 0 (cpu) or 0.
            value = resources.get("limits", {}).get(name, "0")
    divisor = parse_quantity(ref.get("divisor", "1") or "1")
    if divisor == 0:
        divisor = Decimal(1)
    return str(math.ceil(parse_quantity(value) / divisor))


def venv_bin() -> Path:
    return Path(sys.executable).parent


def resolve_argv(container: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """The argv to run for a container, after $(VAR) expansion.

    The project's image (any image whose name contains "groupcluster") maps to this Python environment:
    `groupcluster ...` runs the console script next to sys.executable, `python`/`python3` run
    sys.executable, and an empty command means the image's entry point, `groupcluster`. Any other image
    runs its command as given, found through PATH.
    """
    command = [expand(c, env) for c in container.get("command") or []]
    args = [expand(a, env) for a in container.get("args") or []]
    image = container.get("image", "")
    if is_project_image(image):
        argv = command + args if command else ["groupcluster", *args]
        first = argv[0]
        if first == "groupcluster":
            script = venv_bin() / "groupcluster"
            if script.exists():
                argv[0] = str(script)
            else:
                argv[:1] = [
                    sys.executable,
                    "-c",
                    "import sys; from groupcluster.cli import main; sys.exit(main())",
                ]
        elif first in ("python", "python3", f"python3.{sys.version_info.minor}"):
            argv[0] = sys.executable
        return argv
    if not command:
        raise ValueError(
            f"image {image!r} is not the project's image and the container has no command: "
            "images are not pulled here, so the command must be given"
        )
    return command + args


def container_ports(container: Mapping[str, Any]) -> dict[str, int]:
    return {p["name"]: int(p["containerPort"]) for p in container.get("ports", []) if p.get("name")}


def probe_port(container: Mapping[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    if port.isdigit():
        return int(port)
    named = container_ports(container)
    if port not in named:
        raise ValueError(f"probe port {port!r} is not a named port of container {container.get('name')!r}")
    return named[port]


def base_env(pod_ip: str, extra_path: list[str] | None = None) -> dict[str, str]:
    """What every container process starts from: a PATH that finds python3 and the venv's scripts."""
    path = os.pathsep.join([*(extra_path or []), os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")])
    env = {"PATH": path, "POD_IP": pod_ip}
    for k in ("HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "VIRTUAL_ENV", "PYTHONPATH"):
        if k in os.environ:
            env[k] = os.environ[k]
    return env
