"""deploy/k8s agrees with the code it deploys, checked where the schemas cannot: the KEDA
triggers read the streams the queue's jobs go to, on the Redis the workers use; the target is
one worker's window; the grace period outlasts the drain; the readiness probe is the worker's
health check; every setting named is one the worker reads (tests/unit/test_k8s_schema.py
validates the same objects against the schemas)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.unit.docker_files import BASE_FILE, GPU_DOCKERFILE, load_project, parse_dockerfile
from tests.unit.k8s_files import (
    GENERATOR,
    K8S_DIR,
    REPO_ROOT,
    container,
    generator,
    kustomization,
    objects,
    the,
    worker_config,
    worker_environment,
)
from wire.keys import GROUP, QueueKeys
from wire.routing import DEFAULT_PARTITIONS
from worker.config import settings
from worker.queue.consumer import HELD_PER_SLOT

# SIGKILL comes terminationGracePeriodSeconds after SIGTERM; the drain must be over by then,
# with room for what comes after the drain's deadline (the engine's children exiting, os._exit)
GRACE_MARGIN_S = 10


def triggers() -> list[dict[str, str]]:
    return [trigger["metadata"] for trigger in the("ScaledObject")["spec"]["triggers"]]


def test_kustomize_applies_every_manifest_into_one_namespace() -> None:
    listed = set(kustomization()["resources"])
    assert listed == {path.name for path in K8S_DIR.glob("*.yaml")} - {"kustomization.yaml"}
    namespace = kustomization()["namespace"]
    assert the("Namespace")["metadata"]["name"] == namespace
    assert {o["metadata"].get("namespace", namespace) for o in objects()} == {namespace}


def test_the_triggers_read_every_partition_stream_of_the_workers_queue() -> None:
    """The names come from the code (wire.keys); the queue from the workers' own settings."""
    queue = worker_config().worker.queue
    streams = [metadata["stream"] for metadata in triggers()]
    assert streams == QueueKeys(queue).partitions(len(streams))
    # a queue enqueued without --partitions has DEFAULT_PARTITIONS streams: all covered
    assert len(streams) >= DEFAULT_PARTITIONS, "write it again: deploy/k8s/scaledobject.py --partitions N"
    # NOTE: no consumerGroup: with one KEDA reads XPENDING or the lag instead of XLEN
    # (deploy/k8s/scaledobject.py says why neither works for radixq)
    assert all("consumerGroup" not in metadata for metadata in triggers())
    spec = the("ScaledObject")["spec"]
    names = [trigger["name"] for trigger in spec["triggers"]]
    formula = spec["advanced"]["scalingModifiers"]["formula"]
    assert sorted(term.strip() for term in formula.split("+")) == sorted(names)  # a sum, each once


def test_the_docs_map_the_trigger_to_the_codes_names() -> None:
    page = (REPO_ROOT / "docs" / "operations.md").read_text()  # "How the KEDA trigger maps to the queue"
    keys = QueueKeys("Q")
    for name in (keys.partition(0), keys.partition(1), keys.partition(15), GROUP):
        assert f"`{name}`" in page


def test_the_triggers_reach_the_workers_redis() -> None:
    url = urlsplit(worker_config().worker.redis_url)
    for metadata in triggers():
        assert metadata["address"] == f"{url.hostname}:{url.port or 6379}"
        assert metadata["databaseIndex"] == (url.path.strip("/") or "0")
    service, namespace, *domain = (url.hostname or "").split(".")
    assert domain == ["svc", "cluster", "local"]  # KEDA's operator runs in another namespace
    redis = the("Service", service)
    assert redis["metadata"]["namespace"] == namespace
    assert [port["port"] for port in redis["spec"]["ports"]] == [url.port]
    assert the("StatefulSet", service)["spec"]["template"]["metadata"]["labels"] == redis["spec"]["selector"]


def test_the_target_is_one_workers_window_and_the_streams_hold_only_unfinished_jobs() -> None:
    config = worker_config()
    assert config.queue.read_window == 0  # the default window, HELD_PER_SLOT per running slot
    window = HELD_PER_SLOT * config.engine.max_running_reqs
    modifiers = the("ScaledObject")["spec"]["advanced"]["scalingModifiers"]
    assert (modifiers["target"], modifiers["metricType"]) == (str(window), "AverageValue")
    assert modifiers["activationTarget"] == "0"  # one job wakes the pool
    # XLEN counts unfinished jobs only while workers trim acknowledged entries
    assert config.queue.trim_jobs is True


def test_scale_to_zero_and_one_gpu_per_worker() -> None:
    spec = the("ScaledObject")["spec"]
    assert spec["minReplicaCount"] == 0
    assert spec["scaleTargetRef"] == {"name": "radixq-worker"}  # kind Deployment by default
    deployment = the("Deployment", "radixq-worker")
    assert "replicas" not in deployment["spec"]  # KEDA's: an apply must not reset it
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()  # the API server's rule
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0
    resources = container(deployment, "worker")["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == 1
    assert worker_config().engine.device == "cuda"


def test_the_grace_period_outlasts_the_drain() -> None:
    pod = the("Deployment", "radixq-worker")["spec"]["template"]["spec"]
    drain_s = worker_config().queue.drain_timeout_s
    assert pod["terminationGracePeriodSeconds"] >= drain_s + GRACE_MARGIN_S
    assert "lifecycle" not in container(
        the("Deployment", "radixq-worker"), "worker"
    )  # no preStop eating the grace
    assert pod["shareProcessNamespace"] is True  # an init reaps children, as compose's init: true


def test_readiness_is_the_workers_docker_healthcheck() -> None:
    worker = container(the("Deployment", "radixq-worker"), "worker")
    compose = load_project(BASE_FILE)["services"]["worker-cpu"]["healthcheck"]["test"]
    assert compose[0] == "CMD" and worker["readinessProbe"]["exec"]["command"] == compose[1:]
    assert "livenessProbe" not in worker  # a Redis outage must not restart every worker
    # the GPU image has the script where the probe runs it, and radixq as its entrypoint
    instructions = parse_dockerfile(GPU_DOCKERFILE)
    assert "COPY docker/healthcheck.py ./docker/healthcheck.py" in [f"COPY {i.args}" for i in instructions]
    (entrypoint,) = [i.exec_form() for i in instructions if i.keyword == "ENTRYPOINT"]
    assert entrypoint == ["radixq"] and worker["args"][0] == "worker"
    # the probe finds the heartbeat by the variables the worker itself reads
    environ = worker_environment()
    assert {"RADIXQ_REDIS_URL", "RADIXQ_QUEUE"} <= set(environ)


def test_the_config_map_names_only_settings_the_worker_reads() -> None:
    known = {name for setting in settings() for name in setting.env}
    assert set(worker_environment()) - known == {"OMP_NUM_THREADS"}  # the OpenMP runtime's (below)


def test_a_worker_runs_as_many_openmp_threads_as_the_cores_it_requests() -> None:
    """Issue 32, defect 5: GPU workers sharing a node do not each take every core."""
    requested = container(the("Deployment", "radixq-worker"), "worker")["resources"]["requests"]["cpu"]
    assert worker_environment()["OMP_NUM_THREADS"] == requested == "4"


def test_metrics_port_is_the_containers_and_the_scrape_annotations() -> None:
    deployment = the("Deployment", "radixq-worker")
    port = worker_config().worker.metrics_port
    assert [p["containerPort"] for p in container(deployment, "worker")["ports"]] == [port]
    assert deployment["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == str(port)


def test_redis_keeps_an_aof_on_a_volume_claim() -> None:
    redis = the("StatefulSet", "radixq-redis")
    args = container(redis, "redis")["args"]
    assert args[args.index("--appendonly") + 1] == "yes"
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction"
    (claim,) = redis["spec"]["volumeClaimTemplates"]
    mounts = container(redis, "redis")["volumeMounts"]
    assert {"name": claim["metadata"]["name"], "mountPath": "/data"} in mounts


def test_the_committed_scaled_object_is_the_generators_output(tmp_path: Path) -> None:
    out = tmp_path / "scaledobject.yaml"
    subprocess.run([sys.executable, str(GENERATOR), "-o", str(out)], check=True, cwd=tmp_path)
    assert out.read_text() == (K8S_DIR / "scaledobject.yaml").read_text()


def test_the_generator_follows_its_flags() -> None:
    make = generator().scaled_object
    obj = make(queue="q", partitions=3, redis_address="r:7000", database=2, target=10)
    metadata = [t["metadata"] for t in obj["spec"]["triggers"]]
    assert [m["stream"] for m in metadata] == QueueKeys("q").partitions(3)
    assert {(m["address"], m["databaseIndex"], m["streamLength"]) for m in metadata} == {
        ("r:7000", "2", "10")
    }
    assert obj["spec"]["advanced"]["scalingModifiers"]["formula"] == "p0 + p1 + p2"
    cluster = make(cluster=True, redis_address="a:1,b:2")["spec"]["triggers"][0]
    assert cluster["type"] == "redis-cluster-streams" and cluster["metadata"]["addresses"] == "a:1,b:2"


@pytest.mark.parametrize("args", [["--partitions", "0"], ["--partitions", "1025"], ["--target", "0"]])
def test_the_generator_refuses_bad_flags(args: list[str], tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(GENERATOR), *args, "-o", str(tmp_path / "x.yaml")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and done.stderr.startswith("error: ")
    assert not (tmp_path / "x.yaml").exists()


def test_the_api_serves_the_workers_queue_from_the_cpu_image_behind_its_service() -> None:
    """radixq serve (api.yaml): the workers' Redis and queue (their ConfigMap), keys from a
    Secret, ready while /health answers, its data on a claim, reached through the Service."""
    deployment = the("Deployment", "radixq-api")
    api = container(deployment, "api")
    assert api["args"][0] == "serve" and [s["configMapRef"]["name"] for s in api["envFrom"]] == [
        "radixq-worker"
    ]
    (keys,) = api["env"]
    assert keys["name"] == "RADIXQ_API_KEYS" and keys["valueFrom"]["secretKeyRef"]["name"] == "radixq-api"
    assert api["readinessProbe"]["httpGet"]["path"] == "/health" and "livenessProbe" not in api
    images = {image["name"]: image for image in kustomization()["images"]}
    assert images[api["image"]]["newTag"] == "cpu"  # the image docker-compose.yml's api runs too
    port = api["args"][api["args"].index("--port") + 1]
    assert [p["containerPort"] for p in api["ports"]] == [int(port)]
    (claim,) = deployment["spec"]["template"]["spec"]["volumes"]
    assert the("PersistentVolumeClaim")["metadata"]["name"] == claim["persistentVolumeClaim"]["claimName"]
    assert api["volumeMounts"][0]["mountPath"] == api["args"][api["args"].index("--data-dir") + 1]
    service = the("Service", "radixq-api")
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert service["spec"]["ports"][0]["targetPort"] == api["ports"][0]["name"]
