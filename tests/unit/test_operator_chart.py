"""The CRD and the Helm chart, without a cluster: one CRD source, a documented values file, RBAC that covers
what the operator does. (``helm lint`` and a real install run in tests/e2e/test_operator.py.)"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from groupcluster_operator import builders
from groupcluster_operator.model import AuthSpec, ClusterSpec
from groupcluster_operator.observations import MemberReport, PodState
from groupcluster_operator.planner import plan

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "groupcluster"
CRD = ROOT / "crds" / "groupclusters.groupcluster.io.yaml"


def test_the_chart_crd_is_the_generated_copy_of_crds() -> None:
    res = subprocess.run([sys.executable, str(ROOT / "crds" / "sync.py"), "--check"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    copy = (CHART / "crds" / CRD.name).read_text()
    assert copy.endswith(CRD.read_text()) and copy.startswith("# GENERATED")


def _schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    (version,) = crd["spec"]["versions"]
    return version


def test_crd_has_scale_status_printer_columns_and_described_fields() -> None:
    version = _schema()
    assert version["name"] == "v1alpha1"
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    assert "status" in version["subresources"]
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    assert [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")] == [
        "Ready",
        "Phase",
        "View",
        "Age",
    ]
    assert columns["Ready"]["jsonPath"] == ".status.ready" and columns["View"]["jsonPath"] == ".status.view"
    status_props = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    for column in columns.values():
        field = column["jsonPath"].split(".")
        if field[1] == "status":
            assert field[2] in status_props, f"column {column['name']}: status.{field[2]} is not in the schema"
    # numOwners above replicas (0 aside) is refused by the API server, naming the field.
    rules = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["x-kubernetes-validations"]
    owners = next(r for r in rules if r.get("fieldPath") == ".numOwners")
    assert "self.numOwners <= self.replicas" in owners["rule"] and "self.replicas == 0" in owners["rule"]
    spec_props = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    for name in ("replicas", "image", "resources", "numOwners", "numSegments", "partitionHandling", "stack"):
        assert spec_props[name].get("description"), f"spec.{name} has no description (kubectl explain)"
    assert spec_props["replicas"]["minimum"] == 0
    caches = spec_props["caches"]
    assert caches["description"] and caches["default"] == []
    assert caches["x-kubernetes-validations"] == [
        {"rule": "self == oldSelf", "message": "caches cannot be changed after creation"}
    ]
    item = caches["items"]
    assert item["required"] == ["name"] and all(p.get("description") for p in item["properties"].values())
    assert item["properties"]["mode"]["enum"] == ["distributed", "replicated", "invalidation"]


def _pruned(value: Any, schema: dict[str, Any], path: str) -> list[str]:
    """The fields of ``value`` the API server's structural pruning would drop under ``schema``."""
    if isinstance(value, dict) and not schema.get("x-kubernetes-preserve-unknown-fields"):
        props = schema.get("properties") or {}
        out = [f"{path}.{k}" for k in value if k not in props]
        return out + [m for k, v in value.items() if k in props for m in _pruned(v, props[k], f"{path}.{k}")]
    if isinstance(value, list):
        return [m for i, v in enumerate(value) for m in _pruned(v, schema.get("items") or {}, f"{path}[{i}]")]
    return []


def test_every_status_field_the_operator_writes_survives_pruning() -> None:
    # A status field the schema lacks is silently dropped on write, and the planner never sees it again.
    status_schema = _schema()["schema"]["openAPIV3Schema"]["properties"]["status"]
    spec = ClusterSpec.from_resource({"metadata": {"name": "demo", "namespace": "ns"}, "spec": {"image": "x"}})
    pod = PodState(name="demo-0", ordinal=0, phase="Running", ip="10.0.0.10", ready=True, spec_hash=spec.pod_hash())
    report = MemberReport(address="a", view_id="a|1", view_members=("a",), coordinator="a")
    first = plan(spec, [pod, PodState(name="demo-1", ordinal=1, phase="Failed", exit_code=1)], {"demo-0": report})
    # demo-2 was a member; gone without the operator removing it while demo-0 is not ready (so the step waits),
    # it is a pending replacement.
    previous = {**first.status, "members": [*first.status["members"], {"pod": "demo-2", "leaving": False}]}
    waiting = PodState(**{**pod.__dict__, "ready": False})
    step = plan(spec, [waiting], {"demo-0": report}, previous_status=previous, now="2026-01-01T00:00:00Z")
    status = {**step.status, "observedGeneration": 1, "clientService": builders.client_service_name(spec)}
    assert status["pendingReplacements"] and status["members"] and status["failures"]["failedPods"] == []
    assert first.status["failures"]["failedPods"] == ["demo-1"]
    assert _pruned(first.status, status_schema, "status") == []
    assert _pruned(status, status_schema, "status") == []


def test_crd_defaults_agree_with_the_operator_defaults() -> None:
    spec_props = _schema()["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    d = ClusterSpec(name="x", namespace="y")
    pairs = {
        "replicas": d.replicas,
        "numOwners": d.num_owners,
        "numSegments": d.num_segments,
        "partitionHandling": d.partition_handling,
        "memberPort": d.member_port,
        "httpPort": d.http_port,
        "leaveTimeoutSeconds": d.leave_timeout,
    }
    for field, value in pairs.items():
        assert spec_props[field]["default"] == value, field
    stack = spec_props["stack"]["properties"]
    assert stack["preset"]["default"] == d.preset and stack["transport"]["default"] == d.transport
    auth = spec_props["auth"]
    assert auth["default"] == {} and auth["description"]
    props = auth["properties"]
    assert (props["enabled"]["default"], props["encrypt"]["default"], props["kvToken"]["default"]) == (
        d.auth.enabled,
        d.auth.encrypt,
        d.auth.kv_token,
    )
    assert all(p.get("description") for p in props.values())
    assert "default" not in props["existingSecret"]


def _rules(cluster_wide: bool = False) -> list[dict[str, Any]]:
    text = (CHART / "templates" / "_helpers.tpl").read_text()
    block = re.search(r'define "groupcluster.rules" -\}\}\n(.*?)\{\{- end', text, re.S)
    assert block, "groupcluster.rules not found in _helpers.tpl"
    # The one conditional in the rules: which of kopf's peering resources (namespaced or cluster-wide).
    peering = "{{ if .Values.rbac.clusterWide }}cluster{{ end }}"
    rules = block.group(1).replace(peering, "cluster" if cluster_wide else "")
    assert "{{" not in rules, rules
    return yaml.safe_load(rules)


def _allowed(rules: list[dict[str, Any]], group: str, resource: str, verb: str) -> bool:
    return any(group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in rules)


def test_operator_rbac_covers_every_object_it_creates_and_no_more_than_needed() -> None:
    rules = _rules()
    spec = ClusterSpec(name="x", namespace="y", image="i")
    for obj in [
        *builders.build_supporting_objects(spec, "u"),
        builders.build_member_pod(spec, "u", 0, initial_cluster_size=1),
    ]:
        group = obj["apiVersion"].rpartition("/")[0]
        plural = {"PodDisruptionBudget": "poddisruptionbudgets"}.get(obj["kind"], obj["kind"].lower() + "s")
        for verb in ("get", "create"):
            assert _allowed(rules, group, plural, verb), f"{verb} {group}/{plural}"
    for verb in ("list", "delete", "patch"):
        assert _allowed(rules, "", "pods", verb)
    assert _allowed(rules, "groupcluster.io", "groupclusters/status", "patch")
    assert _allowed(rules, "", "events", "create")
    # The auth Secret: the operator creates it and reads it by name, nothing more.
    auth_spec = ClusterSpec(name="x", namespace="y", image="i", auth=AuthSpec(kv_token=True))
    secret = builders.build_auth_secret(
        auth_spec, "u", cluster_secret="c" * 43, admin_token="a" * 43, kv_token="k" * 43
    )
    assert secret["kind"] == "Secret"
    for verb in ("get", "create"):
        assert _allowed(rules, "", "secrets", verb), f"{verb} secrets"
    for verb in ("list", "watch", "update", "patch", "delete", "deletecollection"):
        assert not _allowed(rules, "", "secrets", verb), f"{verb} secrets is more than the operator needs"
    # The replicas' peering: kopf watches and patches its peering object, the operator makes a missing one; the
    # namespaced install in its namespaces, the cluster-wide one cluster-wide.
    for verb in ("get", "list", "watch", "patch", "create"):
        assert _allowed(rules, "kopf.dev", "kopfpeerings", verb), f"{verb} kopfpeerings"
        assert _allowed(_rules(cluster_wide=True), "kopf.dev", "clusterkopfpeerings", verb)
    assert not _allowed(rules, "kopf.dev", "clusterkopfpeerings", "get")
    # Least privilege: no wildcards, no deletion of anything but pods and services (an older operator's headless
    # Service that held the client Service's name).
    for r in rules:
        assert "*" not in r["verbs"] and "*" not in r["resources"]
        if "delete" in r["verbs"]:
            assert r["resources"] in (["pods"], ["services"])


def test_values_are_documented() -> None:
    """Every value of the chart's own settings has a comment right above it (Kubernetes objects passed through,
    like resources or podSecurityContext, are documented as a whole)."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    own_sections = {"image", "rbac", "serviceAccount", "operator", "uninstall"}
    undocumented, section = [], ""
    for i, line in enumerate(lines):
        m = re.match(r"^( *)([A-Za-z]\w*):\s*(\S.*)?$", line)
        if not m:
            continue
        if not m.group(1):
            section = m.group(2)
        ours = not m.group(1) or (len(m.group(1)) == 2 and section in own_sections)
        if ours and m.group(3) and not lines[i - 1].strip().startswith("#"):
            undocumented.append(line.strip())
    assert not undocumented, f"values without a comment: {undocumented}"
    assert yaml.safe_load("\n".join(lines))["rbac"]["clusterWide"] is False  # namespaced by default


def _check(schema: dict[str, Any], value: Any, where: str) -> list[str]:
    """The part of JSON Schema the chart's schema uses: type, enum, properties, additionalProperties."""
    kinds = {"object": dict, "array": list, "string": str, "boolean": bool, "integer": int, "number": (int, float)}
    kind = schema.get("type")
    if (kind and not isinstance(value, kinds[kind])) or (kind in ("integer", "number") and isinstance(value, bool)):
        return [f"{where}: {value!r} is not of type {kind}"]
    if "enum" in schema and value not in schema["enum"]:
        return [f"{where}: {value!r} not in {schema['enum']}"]
    problems = []
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for key, item in value.items():
            if key in props:
                problems += _check(props[key], item, f"{where}.{key}")
            elif schema.get("additionalProperties") is False:
                problems.append(f"{where}.{key}: not in the schema")
    return problems


def test_values_schema_knows_every_value_and_refuses_unknown_keys() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert _check(schema, values, "values") == []
    # Every key of the chart's own sections is in the schema, and the schema has no key the values lack.
    props = schema["properties"]
    assert set(props) - {"global"} == set(values)
    for section in ("image", "rbac", "serviceAccount", "operator", "uninstall"):
        assert props[section]["additionalProperties"] is False
        assert set(props[section]["properties"]) == set(values[section]), section
    assert schema["additionalProperties"] is False
    # What a typo looks like (helm refuses such values with the schema's message; the e2e test runs helm).
    typo = {**values, "image": {**values["image"], "repositry": "x"}}
    assert _check(schema, typo, "values") == ["values.image.repositry: not in the schema"]
    assert _check(schema, {**values, "operator": {"interval": "2s"}}, "values") == [
        "values.operator.interval: '2s' is not of type number"
    ]
