"""Every compose file, alone where it stands alone and merged as the docs run it, is valid
against the Compose Specification's JSON schema (vendored in tests/data/compose-spec with its
licence), validated as compose-go's loader does: after interpolation and merging. (The schema
leaves durations to Compose's Go parser: tests/unit/test_compose.py checks them.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.unit.docker_files import (
    BASE_FILE,
    REDIS_PORT_FILE,
    SCHEMA_DIR,
    generate_gpu_override,
    load_project,
)


def validator() -> jsonschema.Draft7Validator:
    schema = json.loads((SCHEMA_DIR / "compose-spec.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def errors(project: dict[str, Any]) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator().iter_errors(project)]


def test_the_vendored_schema_comes_with_its_licence() -> None:
    assert "Apache License" in (SCHEMA_DIR / "LICENSE").read_text()
    assert (SCHEMA_DIR / "NOTICE").read_text().startswith("The Compose Specification")


def test_the_schema_rejects_what_compose_rejects() -> None:
    """The validator is live: unknown keys and wrong types fail."""
    project = load_project(BASE_FILE)
    redis = project["services"]["redis"]
    assert errors({**project, "services": {"redis": {**redis, "healthchek": redis["healthcheck"]}}})
    assert errors({**project, "services": {"redis": {**redis, "restart": ["always"]}}})
    assert errors({**project, "services": {"redis": {**redis, "healthcheck": {"test": 5}}}})
    gpu = {"driver": "nvidia", "device_ids": "0", "capabilities": ["gpu"]}  # ids must be a list
    worker = {"image": "x", "deploy": {"resources": {"reservations": {"devices": [gpu]}}}}
    assert errors({"services": {"w": worker}})


def test_base_file_is_valid() -> None:
    assert errors(load_project(BASE_FILE)) == []
    assert errors(load_project(BASE_FILE, env={"RADIXQ_QUEUE": "q", "RADIXQ_MODEL": "m"})) == []


@pytest.mark.parametrize("count", [1, 4, 8])
def test_generated_gpu_file_is_valid_alone_and_merged(tmp_path: Path, count: int) -> None:
    gpus = generate_gpu_override(tmp_path, str(count))
    assert errors(yaml.safe_load(gpus.read_text())) == []
    assert errors(load_project(BASE_FILE, gpus)) == []
    assert errors(load_project(BASE_FILE, gpus, REDIS_PORT_FILE)) == []


def test_redis_port_override_is_valid_merged() -> None:
    assert errors(load_project(BASE_FILE, REDIS_PORT_FILE)) == []
    assert errors(load_project(BASE_FILE, REDIS_PORT_FILE, env={"RADIXQ_REDIS_PORT": "7001"})) == []
