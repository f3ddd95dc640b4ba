"""ops/k8s manifests, validated offline: built-in kinds with ``kubernetes-validate`` (strict: unknown
fields fail) against two Kubernetes versions, the KEDA ScaledObject against KEDA's schema
(tests/data/keda/README.md), and the cross-file facts the manifests rely on (one partition count,
one consumer group, the image's uid, probes on the health port, grace period above the drain)."""
from __future__ import annotations

import copy
import json
import re
import shlex

import jsonschema
import kubernetes_validate
import pytest

from tests.opsutil import REPO, load_yaml_docs

K8S = REPO / "ops" / "k8s"
VERSIONS = ["1.29.0", kubernetes_validate.latest_version()]


def _docs() -> dict[str, dict]:
    out = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in load_yaml_docs(path):
            out[doc["kind"]] = doc
    return out


DOCS = _docs()


def test_expected_kinds():
    assert set(DOCS) == {"Deployment", "PodDisruptionBudget", "Service", "Job", "ScaledObject"}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("kind", ["Deployment", "PodDisruptionBudget", "Service", "Job"])
def test_builtin_kinds_validate(kind, version):
    kubernetes_validate.validate(DOCS[kind], version, strict=True)


def test_validator_rejects_a_typo():
    bad = copy.deepcopy(DOCS["Deployment"])
    bad["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["pathh"] = "/readyz"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, VERSIONS[-1], strict=True)


def _strict(schema):
    """Copy of ``schema`` with ``additionalProperties: false`` on every object listing properties."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


KEDA_SCHEMA = _strict(json.loads((REPO / "tests" / "data" / "keda" / "scaledobject.schema.json").read_text()))


def test_scaledobject_validates_against_keda_schema():
    so = DOCS["ScaledObject"]
    assert so["apiVersion"] == "keda.sh/v1alpha1"
    jsonschema.validate(so, KEDA_SCHEMA)
    bad = copy.deepcopy(so)
    bad["spec"]["maxReplicas"] = bad["spec"].pop("maxReplicaCount")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, KEDA_SCHEMA)


def _container(kind: str) -> dict:
    return DOCS[kind]["spec"]["template"]["spec"]["containers"][0]


def _env(kind: str) -> dict[str, str]:
    """The container's plain ``value`` variables (not those from a Secret)."""
    return {e["name"]: e["value"] for e in _container(kind).get("env", []) if "value" in e}


def test_passwords_come_from_a_secret_never_from_args():
    """Password variables are ``secretKeyRef`` (optional: the manifests start without the Secret);
    no password flag is in the args (every user of the node reads /proc/PID/cmdline)."""
    c = _container("Deployment")
    assert not any("password" in a for a in c.get("args", []) + c.get("command", []))
    secret_env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in c["env"] if "valueFrom" in e}
    assert {"DERENDER_REDIS_PASSWORD", "DERENDER_SASL_PASSWORD"} <= set(secret_env)
    for name, ref in secret_env.items():
        assert ref["optional"] is True and ref["name"] == "derender-worker-credentials", name
    assert not any("PASSWORD" in n for n in _env("Deployment")), "a password as a plain value"


def _topic_partitions() -> dict[str, int]:
    script = DOCS["Job"]["spec"]["template"]["spec"]["containers"][0]["args"][0]
    out = {}
    for line in script.splitlines():
        words = shlex.split(line)
        if "--create" in words:
            out[words[words.index("--topic") + 1]] = int(words[words.index("--partitions") + 1])
            assert "--if-not-exists" in words  # rerunnable
    return out


def test_scaledobject_matches_deployment_and_topics():
    so, dep = DOCS["ScaledObject"]["spec"], DOCS["Deployment"]
    env = _env("Deployment")
    assert so["scaleTargetRef"]["name"] == dep["metadata"]["name"]
    assert so["scaleTargetRef"]["kind"] == "Deployment"
    (trigger,) = so["triggers"]
    assert trigger["type"] == "kafka"
    md = trigger["metadata"]
    # the keys KEDA's kafka scaler reads (https://keda.sh/docs/latest/scalers/apache-kafka/)
    assert set(md) <= {"bootstrapServers", "consumerGroup", "topic", "lagThreshold", "activationLagThreshold",
                       "offsetResetPolicy", "allowIdleConsumers", "scaleToZeroOnInvalidOffset",
                       "excludePersistentLag", "limitToPartitionsWithLag", "partitionLimitation", "version"}
    assert md["bootstrapServers"] == env["KAFKA_BOOTSTRAP_SERVERS"]
    assert md["consumerGroup"] == env["DERENDER_GROUP_ID"]
    assert md["topic"] == env["DERENDER_INPUT_TOPIC"]
    assert int(md["lagThreshold"]) > 0
    assert md["allowIdleConsumers"] == "false"
    parts = _topic_partitions()
    assert set(parts) == {env["DERENDER_INPUT_TOPIC"], env["DERENDER_REPLY_TOPIC"], env["DERENDER_DEAD_LETTER_TOPIC"]}
    assert so["maxReplicaCount"] == parts[md["topic"]]  # max replicas = partitions
    assert 1 <= so["minReplicaCount"] <= so["maxReplicaCount"]


def test_deployment_probes_security_and_grace():
    dep = DOCS["Deployment"]
    pod = dep["spec"]["template"]["spec"]
    c = _container("Deployment")
    env = _env("Deployment")
    port = int(env["DERENDER_METRICS_PORT"])
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"metrics": port}
    assert c["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    # the port answers before the start-up waits (issue 23): started = ready; the window is the
    # worker's own default --state-store-outage-deadline (300 s), after which it exits by itself
    assert c["startupProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] >= 300
    assert "DERENDER_STATE_STORE_OUTAGE_DEADLINE" not in env
    sc = pod["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] >= 1000
    assert re.search(rf"^USER {sc['runAsUser']}\b", (REPO / "Dockerfile").read_text(), re.M)
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    # read-only root: /tmp is a volume
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert "/tmp" in {m["mountPath"] for m in c["volumeMounts"]}
    assert pod["terminationGracePeriodSeconds"] > float(env["DERENDER_DRAIN_TIMEOUT"])
    # selectors line up: PDB and Service select the Deployment's pods
    labels = dep["spec"]["template"]["metadata"]["labels"]
    for sel in (DOCS["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"], DOCS["Service"]["spec"]["selector"]):
        assert sel.items() <= labels.items()
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert DOCS["PodDisruptionBudget"]["spec"]["maxUnavailable"] == 1
    (sp,) = DOCS["Service"]["spec"]["ports"]
    assert sp["targetPort"] == "metrics" and sp["port"] == port
    job = DOCS["Job"]["spec"]["template"]["spec"]
    assert job["securityContext"]["runAsNonRoot"] is True
