"""Every object of deploy/k8s is one the API server accepts: the Kubernetes kinds against the
Kubernetes OpenAPI schemas (kubernetes-validate's strict JSON schemas, which refuse unknown
fields), the ScaledObject against KEDA's own CRD (vendored in tests/data/keda), plus the
rules the CRD states in CEL and KEDA's admission webhook checks, which no JSON schema holds."""

from __future__ import annotations

import copy
import re
from typing import Any

import kubernetes_validate
import pytest

from tests.unit.k8s_files import KEDA_DIR, generator, keda_errors, objects, the

# The oldest Kubernetes KEDA 2.20 supports, and the newest kubernetes-validate knows.
KUBERNETES_VERSIONS = ("1.32", kubernetes_validate.latest_version())

# The trigger metadata KEDA v2.20.2's redis-streams scalers read (pkg/scalers/
# redis_streams_scaler.go and redis_scaler.go's redisConnectionInfo); a key not here is ignored
# by KEDA without a word, so a misspelt one would silently fall back to its default.
REDIS_STREAMS_METADATA = {
    "stream",
    "consumerGroup",
    "pendingEntriesCount",
    "streamLength",
    "lagCount",
    "activationLagCount",
    "databaseIndex",
    "enableTLS",
    "unsafeSsl",
    *(
        f"{name}{suffix}"
        for name in ("address", "addresses", "host", "hosts", "port", "ports", "username", "password")
        for suffix in ("", "FromEnv")
    ),
}
FORMULA_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")  # an expr-lang variable


def kubernetes_errors(obj: dict[str, Any], version: str) -> str | None:
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return f"{'.'.join(map(str, exc.path))}: {exc.message}"
    return None


def webhook_errors(obj: dict[str, Any]) -> list[str]:
    """The ScaledObject checks outside its schema: the CRD's CEL rule (min <= max) and the
    webhook's formula checks (every trigger named, once; the formula's names are triggers)."""
    spec = obj["spec"]
    found = []
    if spec.get("minReplicaCount", 0) > spec.get("maxReplicaCount", 100):
        found.append("minReplicaCount must be less than or equal to maxReplicaCount")
    names = [trigger.get("name", "") for trigger in spec["triggers"]]
    if len(set(names)) != len(names):
        found.append("trigger names must be unique")
    modifiers = spec.get("advanced", {}).get("scalingModifiers")
    if modifiers:
        if not modifiers.get("target"):
            found.append("formula is given but target is empty")
        used = re.findall(r"[A-Za-z_][A-Za-z0-9_]*", modifiers["formula"])
        if not set(used) <= set(names) or not all(FORMULA_NAME.match(name) for name in names):
            found.append(f"formula {modifiers['formula']!r} names what no trigger is called")
    return found


def scaled_objects() -> dict[str, dict[str, Any]]:
    """The committed ScaledObject and the generator's other shapes."""
    make = generator().scaled_object
    return {
        "committed": the("ScaledObject"),
        "one partition": make(partitions=1),
        "1024 partitions": make(queue="big", partitions=1024),
        "cluster": make(cluster=True, redis_address="redis-0.redis:6379,redis-1.redis:6379"),
    }


def test_the_vendored_crd_comes_with_its_licence() -> None:
    assert "Apache License" in (KEDA_DIR / "LICENSE").read_text()
    assert "v2.20.2" in (KEDA_DIR / "README.md").read_text()


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_kubernetes_object_is_valid(version: str) -> None:
    checked = [o for o in objects() if o["apiVersion"] != "keda.sh/v1alpha1"]
    assert {o["kind"] for o in checked} == {
        "Namespace", "Service", "StatefulSet", "ConfigMap", "Deployment", "PersistentVolumeClaim"
    }  # fmt: skip
    assert {o["metadata"]["name"]: kubernetes_errors(o, version) for o in checked} == {
        o["metadata"]["name"]: None for o in checked
    }


@pytest.mark.parametrize("shape", ["committed", "one partition", "1024 partitions", "cluster"])
def test_the_scaled_object_is_valid_against_kedas_crd(shape: str) -> None:
    obj = scaled_objects()[shape]
    assert keda_errors(obj) == []
    assert webhook_errors(obj) == []
    for trigger in obj["spec"]["triggers"]:
        assert trigger["type"] in ("redis-streams", "redis-cluster-streams")
        assert set(trigger["metadata"]) <= REDIS_STREAMS_METADATA


def test_the_validators_refuse_what_the_api_server_refuses() -> None:
    """They are live: a misspelt field, a wrong type, an unknown key, a broken formula fail."""
    deployment = copy.deepcopy(the("Deployment", "radixq-worker"))
    pod = deployment["spec"]["template"]["spec"]
    pod["terminationGracePeriod"] = pod.pop("terminationGracePeriodSeconds")
    assert kubernetes_errors(deployment, KUBERNETES_VERSIONS[-1])
    deployment = copy.deepcopy(the("Deployment", "radixq-api"))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["periodSeconds"] = "10s"
    assert kubernetes_errors(deployment, KUBERNETES_VERSIONS[-1])

    def broken(change: Any) -> dict[str, Any]:
        obj = copy.deepcopy(the("ScaledObject"))
        change(obj["spec"])
        return obj

    assert keda_errors(broken(lambda s: s["triggers"][0]["metadata"].update(streamLength=512)))
    assert keda_errors(broken(lambda s: s.update(minReplicaCount=-1)))
    assert keda_errors(broken(lambda s: s["advanced"]["scalingModifiers"].update(metricType="Utilization")))
    assert keda_errors(broken(lambda s: s["advanced"].update(scalingModifier={})))
    assert keda_errors(broken(lambda s: s.update(triggers=[])))
    assert webhook_errors(broken(lambda s: s.update(minReplicaCount=9, maxReplicaCount=8)))
    assert webhook_errors(broken(lambda s: s["advanced"]["scalingModifiers"].update(formula="p0 + p99")))
    assert webhook_errors(broken(lambda s: s["triggers"][1].update(name="p0")))
