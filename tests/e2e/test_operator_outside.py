"""The operator run outside the cluster, logged in through a kubeconfig ``exec`` credential plugin.

As against a managed cluster (``aws eks get-token``, ``gke-gcloud-auth-plugin``, ``kubelogin``): the chart's
CRD, service account and namespaced RBAC are applied without its Deployment, and ``groupcluster operator`` runs on
this machine with a kubeconfig whose user is tests/e2e/exec_credential.py, a plugin that prints a token of
the chart's service account (``kubectl create token``, bound to a Secret so that the test can revoke it).

* the operator reconciles a GroupCluster of 2 to Running with the chart's namespaced RBAC, and its members
  find each other through the API server (their discovery runs in pods, with their own service account);
* the token is revoked (its Secret deleted) after a new one was handed to the plugin: the operator's calls
  and kopf's watch get a 401, run the plugin again and carry on, scaling the GroupCluster to 3;
* the operator logs no ERROR and no traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from .groupclusters import member_pods, wait_settled
from .kubeharness import Kube, wait_for

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "groupcluster"
PLUGIN = Path(__file__).resolve().parent / "exec_credential.py"

pytestmark = pytest.mark.timeout(1800)


def _bound_token(kube: Kube, ns: str, account: str, secret: str) -> str:
    """A token of ``account`` that the API server accepts until the Secret ``secret`` is deleted."""
    kube.kubectl("create", "secret", "generic", secret, "-n", ns, "--from-literal=purpose=binds-a-token")
    uid = kube.json("get", "secret", secret, "-n", ns)["metadata"]["uid"]
    res = kube.kubectl(
        "create", "token", account, "-n", ns, "--duration=1h",
        "--bound-object-kind=Secret", f"--bound-object-name={secret}", f"--bound-object-uid={uid}",
    )  # fmt: skip
    return res.stdout.strip()


def _exec_kubeconfig(kube: Kube, ns: str, tmp: Path, token_file: Path, log: Path) -> Path:
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": kube.server, "certificate-authority": str(kube.ca_file)}}],
        "users": [
            {
                "name": "operator",
                "user": {
                    "exec": {
                        "apiVersion": "client.authentication.k8s.io/v1",
                        "command": sys.executable,
                        "args": [str(PLUGIN)],
                        "env": [
                            {"name": "TEST_EXEC_TOKEN_FILE", "value": str(token_file)},
                            {"name": "TEST_EXEC_LOG", "value": str(log)},
                        ],
                        "interactiveMode": "Never",
                    }
                },
            }
        ],
        "contexts": [{"name": "outside", "context": {"cluster": "local", "user": "operator", "namespace": ns}}],
        "current-context": "outside",
    }
    path = tmp / "kubeconfig"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_operator_outside_the_cluster_with_an_exec_credential_plugin(
    kube: Kube, namespace: str, tmp_path: Path
) -> None:
    ns = namespace
    # The chart's CRD, service account and namespaced RBAC; its operator Deployment stays out (it runs here).
    kube.kubectl("apply", "-f", str(CHART / "crds"))
    kube.kubectl("wait", "--for=condition=Established", "crd/groupclusters.groupcluster.io", "--timeout=60s")
    rendered = kube.helm(
        "template", "gco", str(CHART), "-n", ns,
        "--show-only", "templates/serviceaccount.yaml", "--show-only", "templates/rbac.yaml",
    ).stdout  # fmt: skip
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    assert {d["kind"] for d in docs} >= {"ServiceAccount", "Role", "RoleBinding"}, docs
    assert not [d for d in docs if d["kind"].startswith("Cluster")]  # namespaced, as the default install
    kube.kubectl("apply", "-n", ns, "-f", "-", input=rendered)
    (account_name,) = [d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"]

    token_file, plugin_log = tmp_path / "token", tmp_path / "plugin.log"
    token_file.write_text(_bound_token(kube, ns, account_name, "operator-token-1"))
    kubeconfig = _exec_kubeconfig(kube, ns, tmp_path, token_file, plugin_log)

    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    env.pop("KUBECONFIG", None)
    cli = Path(sys.executable).parent / "groupcluster"
    log_path = tmp_path / "operator.log"
    with open(log_path, "w") as log_file:
        op = subprocess.Popen(
            [str(cli), "operator", "--kubeconfig", str(kubeconfig), "--interval", "1",
             "--member-image", "groupcluster:test"],
            stdout=log_file, stderr=subprocess.STDOUT, env=env, cwd=tmp_path,
        )  # fmt: skip
    try:
        manifest = {
            "apiVersion": "groupcluster.io/v1alpha1",
            "kind": "GroupCluster",
            "metadata": {"name": "demo", "namespace": ns},
            "spec": {"replicas": 2, "stack": {"set": {"fd.timeout": "3s"}}},
        }
        kube.kubectl("apply", "-f", "-", input=json.dumps(manifest))
        gc = wait_settled(kube, ns, 2)
        assert gc["status"]["phase"] == "Running"
        log = log_path.read_text(errors="replace")
        assert f"watching GroupClusters in {ns} at {kube.server}" in log, log
        # The members found each other through the API server (discovery in the pods, their own account).
        members = {p["metadata"]["name"] for p in member_pods(kube, ns)}
        assert len(members) == 2 and len(gc["status"]["members"]) == 2
        runs_before = len(plugin_log.read_text().splitlines())
        assert runs_before >= 1

        # The identity provider issues a new token and the old one is revoked: every call with it gets a 401.
        token_file.write_text(_bound_token(kube, ns, account_name, "operator-token-2"))
        kube.kubectl("delete", "secret", "operator-token-1", "-n", ns)
        time.sleep(2)  # the API server's view of the bound Secret catches up
        kube.kubectl("patch", "groupcluster", "demo", "-n", ns, "--type=merge", "-p", '{"spec":{"replicas":3}}')
        gc = wait_settled(kube, ns, 3, timeout=240)
        assert gc["status"]["phase"] == "Running"
        wait_for(
            "the plugin asked again after the revocation",
            lambda: len(plugin_log.read_text().splitlines()) > runs_before,
            30,
        )
        assert op.poll() is None, log_path.read_text(errors="replace")
    finally:
        op.terminate()
        try:
            op.wait(timeout=60)
        except subprocess.TimeoutExpired:
            op.kill()
            op.wait()
        kube.kubectl("delete", "groupcluster", "demo", "-n", ns, "--wait=false", check=False)
    log = log_path.read_text(errors="replace")
    print(log[-4000:])
    assert "Traceback" not in log, log
    errors = [line for line in log.splitlines() if " ERROR " in line]
    assert not errors, "\n".join(errors[:5])
