"""spec.auth end to end on the real local control plane: the operator's Secret and members that need it.

The chart is installed cluster-wide (``rbac.clusterWide``: a ClusterRole, the operator watches every namespace;
tests/e2e/test_operator.py covers the namespaced default; both get/create on secrets, nothing more), a
GroupCluster of 3 with ``auth.kvToken`` is applied, and then:

* the Secret ``demo-auth`` exists with ``cluster-secret``, ``admin-token`` and ``kv-token`` and an owner
  reference to the GroupCluster, and the members formed one view with authenticated frames;
* the data endpoints and ``POST /v1/leave`` answer 401 without the tokens, and the data endpoints work with
  the kv token;
* a member started by hand with the cluster's labels but another key is found by discovery yet never gets
  into the view (its frames are dropped as an unknown key, and it drops theirs);
* ``kubectl scale`` down to 2 works: the operator sent the admin token on ``POST /v1/leave``;
* ``auth.encrypt`` without ``auth.enabled`` is rejected by the API server;
* a GroupCluster whose ``existingSecret`` lacks ``admin-token`` is Degraded with a message naming the Secret
  and the key, gets no pod, and gets its pod once the key is added;
* deleting the GroupCluster removes the Secret (garbage collection through the owner reference);
* the cluster-wide operator logged no ERROR (no namespace list either: it needs none).
"""

from __future__ import annotations

import base64
import json
import re
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from groupcluster.grid.client import GridClient

from .groupclusters import gc_events, get_gc, member_pods, wait_settled
from .kubeharness import Kube, wait_for

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "groupcluster"

# The session fixture's set-up (a cold build of the binaries on a fresh machine) counts in the first test.
pytestmark = pytest.mark.timeout(1800)


def _http(method: str, url: str, token: str | None = None, body: bytes | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, method=method)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=15) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:  # not listening yet, or gone: no answer
        return 0, b""


def _status(ip: str) -> dict[str, Any]:
    code, body = _http("GET", f"http://{ip}:8080/v1/status")
    assert code == 200, body
    return dict(json.loads(body))


def _counter(ip: str, name: str) -> int:
    code, body = _http("GET", f"http://{ip}:8080/metrics")
    assert code == 200
    m = re.search(rf'^groupcluster_protocol_counter\{{name="{re.escape(name)}"\}} (\d+)$', body.decode(), re.M)
    return int(m.group(1)) if m else 0


def _secret_data(kube: Kube, ns: str, name: str) -> dict[str, str]:
    secret = kube.json("get", "secret", name, "-n", ns)
    return {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}


def _condition(gc: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in (gc.get("status") or {}).get("conditions") or () if c["type"] == kind), {})


def test_operator_secret_tokens_foreign_member_scale_down_and_a_broken_existing_secret(
    kube: Kube, namespace: str
) -> None:
    ns = namespace
    kube.helm(
        "install", "gca", str(CHART), "-n", ns, "--set", "operator.interval=1", "--set", "rbac.clusterWide=true",
        "--wait", "--timeout", "120s",
    )  # fmt: skip
    kube.kubectl("wait", "--for=condition=Established", "crd/groupclusters.groupcluster.io", "--timeout=60s")
    rules = kube.json("get", "clusterrole", "gca-groupcluster")["rules"]
    assert not [r for r in rules if "namespaces" in r["resources"]], rules
    ops = kube.json("get", "pods", "-n", ns, "-l", "app.kubernetes.io/component=operator")["items"]
    assert len(ops) == 2 and all("--all-namespaces" in op["spec"]["containers"][0]["args"] for op in ops)
    # The replicas of a cluster-wide install peer cluster-wide.
    assert [r["resources"] for r in rules if "kopf.dev" in r["apiGroups"]] == [["clusterkopfpeerings"]], rules
    kube.kubectl("get", "clusterkopfpeering", "gca-groupcluster")
    manifest = {
        "apiVersion": "groupcluster.io/v1alpha1",
        "kind": "GroupCluster",
        "metadata": {"name": "demo", "namespace": ns},
        "spec": {"replicas": 3, "auth": {"kvToken": True}, "stack": {"set": {"fd.timeout": "3s"}}},
    }
    kube.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    gc = wait_settled(kube, ns, 3)
    assert gc["spec"]["auth"] == {"enabled": True, "encrypt": False, "kvToken": True}  # the CRD's defaults

    # The Secret: the three keys, random, owned by the GroupCluster.
    secret = kube.json("get", "secret", "demo-auth", "-n", ns)
    (owner,) = secret["metadata"]["ownerReferences"]
    assert owner["kind"] == "GroupCluster" and owner["uid"] == gc["metadata"]["uid"]
    data = _secret_data(kube, ns, "demo-auth")
    assert set(data) == {"cluster-secret", "admin-token", "kv-token"}
    assert all(len(v.strip()) >= 43 for v in data.values()) and len(set(data.values())) == 3
    admin, kv = data["admin-token"], data["kv-token"]

    # Members mount it and authenticate every frame; the view holds exactly the three of them.
    pods = member_pods(kube, ns)
    ips = [p["status"]["podIP"] for p in pods]
    for pod in pods:
        volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "auth")
        assert volume["secret"]["secretName"] == "demo-auth"
        assert pod["metadata"]["annotations"]["groupcluster.io/auth-mode"] == "mac"
    statuses = [_status(ip) for ip in ips]
    addresses = {s["address"] for s in statuses}
    assert all(set(s["view"]["members"]) == addresses for s in statuses)

    # Without the tokens: 401. With the kv token the data endpoints work.
    url = f"http://{ips[0]}:8080"
    assert _http("PUT", f"{url}/v1/kv/k1", body=b"v1")[0] == 401
    assert _http("PUT", f"{url}/v1/kv/k1", token=admin, body=b"v1")[0] == 401  # the admin token is not the kv one
    assert _http("POST", f"{url}/v1/leave")[0] == 401
    assert _http("POST", f"{url}/v1/leave", token=kv)[0] == 401
    assert _http("PUT", f"{url}/v1/kv/k1", token=kv, body=b"v1")[0] == 200
    assert _http("GET", f"{url}/v1/kv/k1", token=kv) == (200, b"v1")
    expected = {f"key-{i:04d}".encode(): f"value-{i}".encode() for i in range(500)}
    client = GridClient([f"http://{ip}:8080" for ip in ips], timeout=30, token=kv)
    try:
        client.put_many(expected)
    finally:
        client.close()

    # A member with the cluster's labels (so discovery finds it) but another key never enters the view.
    kube.kubectl(
        "create", "secret", "generic", "rogue-auth", "-n", ns,
        "--from-literal=cluster-secret=" + "r" * 43, "--from-literal=admin-token=" + "q" * 43,
    )  # fmt: skip
    rogue = json.loads(json.dumps(pods[0]))
    meta = rogue["metadata"]
    rogue["metadata"] = {
        "name": "rogue",
        "namespace": ns,
        "labels": {k: v for k, v in meta["labels"].items() if k != "groupcluster.io/ordinal"},
    }
    rogue["spec"]["volumes"] = [v for v in rogue["spec"]["volumes"] if v["name"] == "auth"]
    rogue["spec"]["volumes"][0]["secret"]["secretName"] = "rogue-auth"
    rogue["spec"]["volumes"][0]["secret"]["items"] = [
        {"key": "cluster-secret", "path": "cluster-secret"},
        {"key": "admin-token", "path": "admin-token"},
    ]
    (container,) = rogue["spec"]["containers"]
    container["args"] = [a for a in container["args"] if "kv-token" not in a]
    container["volumeMounts"] = [m for m in container["volumeMounts"] if m["name"] == "auth"]
    rogue["spec"].pop("nodeName", None)
    rogue.pop("status", None)
    kube.kubectl("apply", "-f", "-", input=json.dumps(rogue))
    rogue_ip = wait_for(
        "the foreign member to answer",
        lambda: (ip := kube.json("get", "pod", "rogue", "-n", ns)["status"].get("podIP")) and _status(ip) and ip,
        60,
        1.0,
    )
    # It reaches the members and they reach it (discovery lists it), and every frame is dropped both ways.
    wait_for(
        "the members to drop the foreign member's frames",
        lambda: (
            sum(_counter(ip, "transport.auth_unknown_key") for ip in ips) > 0
            and _counter(rogue_ip, "transport.auth_unknown_key") > 0
        ),
        60,
        1.0,
    )
    rogue_status = _status(rogue_ip)
    assert rogue_status["view"]["members"] == [rogue_status["address"]]
    for ip in ips:
        assert set(_status(ip)["view"]["members"]) == addresses
    kube.kubectl("delete", "pod", "rogue", "-n", ns, "--grace-period=1", "--wait=false")

    # kubectl scale: the operator asks a member to leave with the admin token, the member leaves gracefully.
    kube.kubectl("scale", "groupcluster/demo", "-n", ns, "--replicas=2")
    gc = wait_settled(kube, ns, 2, timeout=200)
    assert gc_events(kube, ns, "MemberLeft"), "the leave was not graceful"
    refused = [e for e in gc_events(kube, ns, "StepFailed") if "401" in e.get("message", "")]
    assert not refused, refused
    client = GridClient([f"http://{p['status']['podIP']}:8080" for p in member_pods(kube, ns)], timeout=30, token=kv)
    try:
        got = client.get_many(list(expected))
    finally:
        client.close()
    assert {k: v for k, v in expected.items() if got.get(k) != v} == {}

    # A user's Secret that lacks admin-token: Degraded, naming the Secret and the key; no pod until fixed.
    kube.kubectl("create", "secret", "generic", "partial", "-n", ns, "--from-literal=cluster-secret=" + "p" * 43)
    broken = {
        "apiVersion": "groupcluster.io/v1alpha1",
        "kind": "GroupCluster",
        "metadata": {"name": "broken", "namespace": ns},
        "spec": {"replicas": 1, "numOwners": 1, "auth": {"existingSecret": "partial"}},
    }
    kube.kubectl("apply", "-f", "-", input=json.dumps(broken))
    # The API server rejects settings that contradict each other, with the CRD's message.
    invalid = json.loads(json.dumps(broken))
    invalid["metadata"]["name"] = "contradictory"
    invalid["spec"]["auth"] = {"enabled": False, "encrypt": True}
    res = kube.kubectl("apply", "-f", "-", input=json.dumps(invalid), check=False)
    assert res.returncode != 0 and "need auth.enabled true" in res.stderr, res.stderr

    def degraded() -> dict[str, Any] | None:
        cond = _condition(get_gc(kube, ns, "broken"), "Degraded")
        return cond if cond.get("status") == "True" else None

    cond = wait_for("GroupCluster broken to be Degraded", degraded, 60, 1.0)
    assert cond["reason"] == "AuthSecretInvalid"
    assert f"Secret {ns}/partial lacks the key(s) admin-token" in cond["message"], cond
    warned = [e for e in gc_events(kube, ns, "AuthSecretInvalid") if e["involvedObject"]["name"] == "broken"]
    assert warned and "partial" in warned[0]["message"] and "admin-token" in warned[0]["message"]
    assert get_gc(kube, ns, "broken")["status"]["phase"] == "Degraded"
    assert not member_pods(kube, ns, "broken")
    # The operator never writes a Secret it did not create.
    assert set(_secret_data(kube, ns, "partial")) == {"cluster-secret"}
    patch = {"stringData": {"admin-token": "t" * 43}}
    kube.kubectl("patch", "secret", "partial", "-n", ns, "--type=merge", "-p", json.dumps(patch))
    wait_for("a member pod once the Secret is fixed", lambda: member_pods(kube, ns, "broken"), 60, 1.0)
    kube.kubectl("delete", "groupcluster", "broken", "-n", ns, "--timeout=150s", timeout=180)  # see test_operator

    # Deleting the GroupCluster removes its Secret with everything else it owned.
    kube.kubectl("delete", "groupcluster", "demo", "-n", ns, "--timeout=150s", timeout=180)
    wait_for(
        "the Secret to be garbage-collected",
        lambda: kube.kubectl("get", "secret", "demo-auth", "-n", ns, check=False).returncode != 0,
        90,
        1.0,
    )
    log = "\n".join(kube.pod_log_file(ns, op["metadata"]["name"], "operator").read_text(errors="replace") for op in ops)
    errors = [line for line in log.splitlines() if " ERROR " in line]
    assert not errors, "\n".join(errors[:5])
    kube.helm("uninstall", "gca", "-n", ns, "--wait", "--timeout", "120s")
