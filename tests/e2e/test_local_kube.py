"""End-to-end proof that the local Kubernetes environment is real: a real apiserver, controller-manager,
scheduler, kubectl and helm, with the node agent running pods as local processes on loopback."""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from .kubeharness import Kube, wait_for

# pytest-timeout counts the session fixture's set-up in the first test: on a machine whose cache lacks the
# binaries that set-up includes the cold build (several minutes), so allow for it.
pytestmark = pytest.mark.timeout(1800)


def _http_ok(ip: str, port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{ip}:{port}/", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def _ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))


def _pods(kube: Kube, ns: str, selector: str) -> list[dict[str, Any]]:
    return kube.json("get", "pods", "-n", ns, "-l", selector)["items"]


def _http_server_deployment(kube: Kube, ns: str) -> str:
    """`kubectl create deployment` of python's http.server, with probes added to the generated manifest."""
    out = kube.kubectl(
        "create",
        "deployment",
        "web",
        "-n",
        ns,
        "--image=python:3.11-slim",
        "--port=8080",
        "--dry-run=client",
        "-o",
        "json",
        "--",
        "python3",
        "-m",
        "http.server",
        "--bind",
        "$(POD_IP)",
        "8080",
    ).stdout
    dep = json.loads(out)
    c = dep["spec"]["template"]["spec"]["containers"][0]
    probe = {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1, "failureThreshold": 3}
    c["readinessProbe"] = probe
    c["livenessProbe"] = {**probe, "periodSeconds": 2}
    return kube.kubectl("create", "-f", "-", input=json.dumps(dep)).stdout


def test_deployment_ready_scale_and_garbage_collection(kube: Kube, namespace: str) -> None:
    ns = namespace
    _http_server_deployment(kube, ns)
    kube.kubectl("rollout", "status", "deployment/web", "-n", ns, "--timeout=60s", timeout=90)

    (pod,) = _pods(kube, ns, "app=web")
    assert _ready(pod)
    ip = pod["status"]["podIP"]
    subnet = os.environ.get("LOCAL_KUBE_POD_SUBNET", "127.0.0")  # the node agent's pod addresses
    assert ip.startswith(f"{subnet}.") and ip != "127.0.0.1", ip
    assert pod["status"]["hostIP"] == "127.0.0.1"
    assert _http_ok(ip, 8080), f"pod {ip}:8080 not reachable from the test"
    assert len(kube.pod_pids(pod["metadata"]["uid"])) == 1

    kube.kubectl("scale", "deployment/web", "-n", ns, "--replicas=2")
    kube.kubectl("rollout", "status", "deployment/web", "-n", ns, "--timeout=60s", timeout=90)

    def two_ready() -> list[dict[str, Any]] | None:
        p = _pods(kube, ns, "app=web")
        return p if len(p) == 2 and all(map(_ready, p)) else None

    pods = wait_for("2 ready pods", two_ready, 60)
    ips = {p["status"]["podIP"] for p in pods}
    assert len(ips) == 2, ips
    assert all(_http_ok(i, 8080) for i in ips)
    uids = [p["metadata"]["uid"] for p in pods]
    assert all(len(kube.pod_pids(u)) == 1 for u in uids)
    assert len({pid for u in uids for pid in kube.pod_pids(u)}) == 2

    # Only the Deployment is deleted; the ReplicaSet and Pods go through owner references, i.e. the
    # controller-manager's garbage collector, then the agent's graceful stop.
    kube.kubectl("delete", "deployment/web", "-n", ns)
    wait_for("pods gone", lambda: not _pods(kube, ns, "app=web"), 60)
    wait_for("processes gone", lambda: not any(kube.pod_pids(u) for u in uids), 30)
    assert kube.json("get", "replicasets", "-n", ns)["items"] == []
    assert not any(_http_ok(i, 8080) for i in ips)


def _token_kubeconfig(kube: Kube, tmp_path: Path, token: str) -> Path:
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": kube.server, "certificate-authority": str(kube.ca_file)}}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    }
    p = tmp_path / "token.kubeconfig"
    p.write_text(yaml.safe_dump(cfg))
    return p


def test_rbac_denies_service_account_without_role(kube: Kube, namespace: str, tmp_path: Path) -> None:
    ns = namespace
    kube.kubectl("create", "serviceaccount", "nobody", "-n", ns)
    token = kube.kubectl("create", "token", "nobody", "-n", ns).stdout.strip()
    tk = _token_kubeconfig(kube, tmp_path, token)

    denied = kube.kubectl(f"--kubeconfig={tk}", "get", "pods", "-n", ns, check=False)
    assert denied.returncode != 0
    assert "Forbidden" in denied.stderr and f"system:serviceaccount:{ns}:nobody" in denied.stderr, denied.stderr

    # The same identity is allowed once a Role grants it: the denial above was RBAC, not authentication.
    kube.kubectl("create", "role", "pod-reader", "-n", ns, "--verb=get,list", "--resource=pods")
    kube.kubectl(
        "create",
        "rolebinding",
        "nobody-reads",
        "-n",
        ns,
        "--role=pod-reader",
        f"--serviceaccount={ns}:nobody",
    )
    wait_for(
        "rolebinding in effect",
        lambda: kube.kubectl(f"--kubeconfig={tk}", "get", "pods", "-n", ns, check=False).returncode == 0,
        20,
    )


IN_POD_CLIENT = """
import os, ssl, sys, urllib.request, urllib.error
sa = os.environ["GROUPCLUSTER_SA_DIR"]
token = open(os.path.join(sa, "token")).read()
ns = open(os.path.join(sa, "namespace")).read()
ctx = ssl.create_default_context(cafile=os.path.join(sa, "ca.crt"))
url = "https://%s:%s/api/v1/namespaces/%s/configmaps" % (
    os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"], ns)
req = urllib.request.Request(url, headers={"Authorization": "Bearer " + token})
try:
    urllib.request.urlopen(req, context=ctx)
    code = 200
except urllib.error.HTTPError as e:
    code = e.code
print("status", code, "pod", os.environ["MY_NAME"], "ip", os.environ["MY_IP"], "sa", os.environ["MY_SA"],
      "tier", os.environ["MY_TIER"], flush=True)
sys.exit(0 if code == 403 else 1)
"""


def test_pod_token_downward_api_and_logs(kube: Kube, namespace: str) -> None:
    """A pod's own projected token reaches the API and is denied by RBAC; downward-API env is filled."""
    ns = namespace
    kube.kubectl("create", "serviceaccount", "worker", "-n", ns)
    field = lambda path: {"valueFrom": {"fieldRef": {"fieldPath": path}}}  # noqa: E731
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "client", "namespace": ns, "labels": {"tier": "backend"}},
        "spec": {
            "serviceAccountName": "worker",
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": "python:3.11-slim",
                    "command": ["python3", "-c", IN_POD_CLIENT],
                    "env": [
                        {"name": "MY_NAME", **field("metadata.name")},
                        {"name": "MY_IP", **field("status.podIP")},
                        {"name": "MY_SA", **field("spec.serviceAccountName")},
                        {"name": "MY_TIER", **field("metadata.labels['tier']")},
                    ],
                }
            ],
        },
    }
    kube.kubectl("create", "-f", "-", input=json.dumps(pod))
    done = wait_for(
        "pod finished",
        lambda: (
            (p := kube.json("get", "pod", "client", "-n", ns))["status"].get("phase") in ("Succeeded", "Failed") and p
        ),
        60,
    )
    logs = kube.kubectl("logs", "client", "-n", ns).stdout
    ip = done["status"]["podIP"]
    assert f"status 403 pod client ip {ip} sa worker tier backend" in logs, logs
    assert done["status"]["phase"] == "Succeeded", logs
    term = done["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 0 and term["reason"] == "Completed"


def test_restart_policy_liveness_and_graceful_deletion(kube: Kube, namespace: str) -> None:
    ns = namespace
    # OnFailure: a failing container is restarted; Never: it stays failed with its exit code.
    for name, policy in (("crash-onfailure", "OnFailure"), ("crash-never", "Never")):
        kube.kubectl(
            "run",
            name,
            "-n",
            ns,
            "--image=busybox",
            f"--restart={policy}",
            "--command",
            "--",
            "sh",
            "-c",
            "echo started; exit 3",
        )
    wait_for(
        "OnFailure restarts",
        lambda: (
            kube.json("get", "pod", "crash-onfailure", "-n", ns)["status"]
            .get("containerStatuses", [{}])[0]
            .get("restartCount", 0)
            >= 1
        ),
        30,
    )
    failed = wait_for(
        "Never fails",
        lambda: (p := kube.json("get", "pod", "crash-never", "-n", ns))["status"].get("phase") == "Failed" and p,
        30,
    )
    assert failed["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3
    assert failed["status"]["containerStatuses"][0]["restartCount"] == 0

    # A liveness probe that never succeeds gets the container restarted.
    live = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "unlively", "namespace": ns},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "command": ["sleep", "600"],
                    "livenessProbe": {
                        "httpGet": {"port": 9, "path": "/healthz"},
                        "periodSeconds": 1,
                        "failureThreshold": 1,
                    },
                }
            ],
            "terminationGracePeriodSeconds": 1,
        },
    }
    kube.kubectl("create", "-f", "-", input=json.dumps(live))
    wait_for(
        "liveness restart",
        lambda: (
            kube.json("get", "pod", "unlively", "-n", ns)["status"]
            .get("containerStatuses", [{}])[0]
            .get("restartCount", 0)
            >= 1
        ),
        40,
    )

    # SIGTERM is ignored here, so deletion must wait out the grace period and then SIGKILL.
    kube.kubectl(
        "run",
        "stubborn",
        "-n",
        ns,
        "--image=busybox",
        "--restart=Never",
        "--command",
        "--",
        "sh",
        "-c",
        "trap 'echo got TERM' TERM; echo up; while true; do sleep 0.2; done",
    )
    pod = wait_for(
        "stubborn running",
        lambda: (p := kube.json("get", "pod", "stubborn", "-n", ns))["status"].get("phase") == "Running" and p,
        30,
    )
    uid = pod["metadata"]["uid"]
    assert kube.pod_pids(uid)
    t0 = time.monotonic()
    kube.kubectl("delete", "pod", "stubborn", "-n", ns, "--grace-period=3", timeout=60)
    took = time.monotonic() - t0
    assert not kube.pod_pids(uid)
    assert 2.5 <= took < 20, took
    assert "got TERM" in kube.pod_log_file(ns, "stubborn", "stubborn").read_text()


def test_project_image_runs_in_this_python(kube: Kube, namespace: str) -> None:
    """Images named *groupcluster* map to this environment's interpreter and entry points."""
    ns = namespace
    kube.kubectl(
        "run",
        "proj",
        "-n",
        ns,
        "--image=ghcr.io/example/groupcluster:dev",
        "--restart=Never",
        "--command",
        "--",
        "python3",
        "-c",
        "import sys; print(sys.executable)",
    )
    wait_for(
        "proj done",
        lambda: kube.json("get", "pod", "proj", "-n", ns)["status"].get("phase") == "Succeeded",
        30,
    )
    assert kube.kubectl("logs", "proj", "-n", ns).stdout.strip() == sys.executable


@pytest.mark.parametrize("release", ["demo"])
def test_helm_installs_into_the_cluster(kube: Kube, namespace: str, tmp_path: Path, release: str) -> None:
    chart = tmp_path / "mini"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: mini\nversion: 0.1.0\n")
    (chart / "values.yaml").write_text("greeting: hello\n")
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-cm\n"
        "data:\n  greeting: {{ .Values.greeting | quote }}\n"
    )
    kube.helm("install", release, str(chart), "-n", namespace, "--set", "greeting=hi", "--wait", "--timeout=60s")
    cm = kube.json("get", "configmap", f"{release}-cm", "-n", namespace)
    assert cm["data"]["greeting"] == "hi"
    assert release in kube.helm("list", "-n", namespace).stdout
    kube.helm("uninstall", release, "-n", namespace, "--wait")
    assert kube.kubectl("get", "configmap", f"{release}-cm", "-n", namespace, check=False).returncode != 0


def test_readiness_gates_ready_until_http_probe_passes(kube: Kube, namespace: str) -> None:
    ns = namespace
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "slow", "namespace": ns},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "python:3.11-slim",
                    "command": ["sh", "-c", "sleep 3; exec python3 -m http.server --bind $(POD_IP) 8080"],
                    "readinessProbe": {"httpGet": {"port": "web"}, "periodSeconds": 1},
                    "ports": [{"name": "web", "containerPort": 8080}],
                }
            ]
        },
    }
    kube.kubectl("create", "-f", "-", input=json.dumps(pod))
    running = wait_for(
        "slow running",
        lambda: (p := kube.json("get", "pod", "slow", "-n", ns))["status"].get("phase") == "Running" and p,
        30,
    )
    assert not _ready(running), "Ready before the readiness probe could pass"
    ready = wait_for("slow ready", lambda: _ready(p := kube.json("get", "pod", "slow", "-n", ns)) and p, 30)
    assert _http_ok(ready["status"]["podIP"], 8080)
