"""deploy/k8s as kubectl reads it, for static checks (no cluster here): the objects
kustomization.yaml lists, the worker settings its ConfigMap gives, and a validator for KEDA's
ScaledObject from the vendored CRD (tests/data/keda)."""

from __future__ import annotations

import copy
import importlib.util
import sys
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema
import yaml

from worker.config import WorkerConfig, load_worker_config

REPO_ROOT = Path(__file__).resolve().parents[2]
K8S_DIR = REPO_ROOT / "deploy" / "k8s"
KEDA_DIR = REPO_ROOT / "tests" / "data" / "keda"
GENERATOR = K8S_DIR / "scaledobject.py"


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def kustomization() -> dict[str, Any]:
    (doc,) = documents(K8S_DIR / "kustomization.yaml")
    return doc


def objects() -> list[dict[str, Any]]:
    """Every object ``kubectl apply -k deploy/k8s`` creates, in the listed order."""
    return [doc for resource in kustomization()["resources"] for doc in documents(K8S_DIR / resource)]


def the(kind: str, name: str | None = None) -> dict[str, Any]:
    """The one object of ``kind`` (named ``name``, when given)."""
    (found,) = [o for o in objects() if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    return found


def container(workload: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in workload["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    return found


def worker_environment() -> dict[str, str]:
    """The worker container's environment: its ConfigMaps (envFrom) under its own env."""
    deployment = the("Deployment", "radixq-worker")
    worker = container(deployment, "worker")
    environ: dict[str, str] = {}
    for source in worker.get("envFrom", []):
        environ.update(the("ConfigMap", source["configMapRef"]["name"])["data"])
    for variable in worker.get("env", []):
        environ[variable["name"]] = variable["value"]
    return environ


def worker_config() -> WorkerConfig:
    """The settings a worker of the Deployment runs with, read by the worker's own loader."""
    worker = container(the("Deployment", "radixq-worker"), "worker")
    assert worker["args"] == ["worker"], "flags or --config would need reading here too"
    return load_worker_config(None, worker_environment(), {})


def generator() -> ModuleType:
    """deploy/k8s/scaledobject.py as a module."""
    spec = importlib.util.spec_from_file_location("radixq_k8s_scaledobject", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _closed(schema: Any) -> Any:
    """The schema refusing unknown fields, as the API server does for a CRD's structural schema
    under kubectl's strict field validation: every object with ``properties`` and no
    ``additionalProperties`` or ``x-kubernetes-preserve-unknown-fields`` gets
    ``additionalProperties: false``."""
    if isinstance(schema, list):
        return [_closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    closed = {key: _closed(value) for key, value in schema.items()}
    if (
        "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        closed["additionalProperties"] = False
    return closed


@cache
def _keda_schema(kind: str) -> dict[str, Any]:
    files = {"ScaledObject": "keda.sh_scaledobjects.yaml"}
    (crd,) = documents(KEDA_DIR / files[kind])
    assert crd["spec"]["names"]["kind"] == kind
    (version,) = [v for v in crd["spec"]["versions"] if v["served"] and v["storage"]]
    schema = _closed(copy.deepcopy(version["schema"]["openAPIV3Schema"]))
    # NOTE: the CRD leaves metadata to the API server (ObjectMeta); these objects use three fields
    schema["properties"]["metadata"] = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1},
            "namespace": {"type": "string"},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        },
        "required": ["name"],
        "additionalProperties": False,
    }
    schema["properties"]["apiVersion"]["enum"] = [f"{crd['spec']['group']}/{version['name']}"]
    schema["properties"]["kind"]["enum"] = [kind]
    schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind", "metadata", "spec"})
    jsonschema.Draft7Validator.check_schema(schema)
    return schema


def keda_errors(obj: Mapping[str, Any]) -> list[str]:
    """What the API server would refuse in a KEDA object, per its CRD schema (the CEL rules and
    the admission webhook's checks are tests/unit/test_k8s_schema.py's)."""
    validator = jsonschema.Draft7Validator(_keda_schema(obj["kind"]))
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]
