"""docker-compose.yml and Dockerfile hold what the deployment needs (no Docker engine in CI)."""

from __future__ import annotations

from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_compose_file_has_persistent_redis_gpu_workers_and_producer() -> None:
    compose = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"redis", "worker", "producer"} <= set(services)

    redis = services["redis"]
    command = redis["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction"
    assert any(volume.endswith(":/data") for volume in redis["volumes"])
    assert "redis-cli" in redis["healthcheck"]["test"]
    assert "redis-data" in compose["volumes"]

    worker = services["worker"]
    assert worker["command"][0] == "worker"
    assert "replicas" not in worker.get("deploy", {})  # scales with --scale worker=N
    assert "container_name" not in worker  # a fixed name would forbid scaling
    (device,) = worker["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    assert worker["depends_on"]["redis"]["condition"] == "service_healthy"
    assert worker["environment"]["RADIXQ_REDIS_URL"].startswith("redis://redis:6379")

    producer = services["producer"]
    assert producer["command"][0] == "enqueue" and producer["restart"] == "no"


def test_dockerfile_installs_pinned_torch_before_the_project() -> None:
    lines = (REPO_ROOT / "Dockerfile").read_text().splitlines()
    torch = next(i for i, line in enumerate(lines) if "torch==2.13.0" in line)
    project = next(i for i, line in enumerate(lines) if "'.[worker]'" in line)
    assert torch < project
    assert any(line.startswith("ENTRYPOINT") and "radixq" in line for line in lines)
