"""The compose files do what the README and docs/operations.md say, checked where the schema cannot: profiles, GPU
assignments, references to files and volumes, commands the images can run (no Docker engine
here; tests/unit/test_compose_schema.py validates the same projects against the schema)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from tests.unit.docker_files import (
    BASE_FILE,
    CPU_DOCKERFILE,
    GPU_DOCKERFILE,
    GPU_SERVICES,
    REDIS_PORT_FILE,
    REPO_ROOT,
    active_services,
    generate_gpu_override,
    gpu_devices,
    load_project,
    mounts,
    parse_dockerfile,
)

WORKER_SETTINGS_SHARED = (
    "environment",
    "init",
    "depends_on",
    "healthcheck.test",
    "healthcheck.interval",
    "healthcheck.timeout",
    "healthcheck.retries",
    "stop_signal",
    "stop_grace_period",
    "restart",
)


# Go's time.ParseDuration, which Compose applies to these fields after the schema check.
GO_DURATION = re.compile(r"(?:(?:\d+(?:\.\d*)?|\.\d+)(?:ns|us|µs|ms|s|m|h))+")
DURATION_FIELDS = (
    "healthcheck.interval",
    "healthcheck.timeout",
    "healthcheck.start_period",
    "stop_grace_period",
)


def setting(service: dict[str, Any], dotted: str) -> Any:
    value: Any = service
    for key in dotted.split("."):
        value = value[key]
    return value


def projects(tmp_path: Path) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """Every way the docs start the stack: (merged project, services `up` starts)."""
    gpus = generate_gpu_override(tmp_path, "2")
    base = load_project(BASE_FILE)
    with_gpus = load_project(BASE_FILE, gpus)
    with_port = load_project(BASE_FILE, gpus, REDIS_PORT_FILE)
    return {
        "default": (base, active_services(base)),
        "cpu": (base, active_services(base, "cpu")),
        "producer": (base, {"producer": base["services"]["producer"]}),  # compose run producer
        "gpus": (with_gpus, active_services(with_gpus)),
        "gpus+port": (with_port, active_services(with_port)),
    }


def test_default_project_is_redis_and_prometheus_unpublished_and_persistent() -> None:
    project = load_project(BASE_FILE)
    services = active_services(project)
    assert set(services) == {"redis", "prometheus"}  # any host; workers come from a profile or the GPU file
    assert services["prometheus"]["ports"] == ["127.0.0.1:9090:9090"]  # loopback only
    redis = services["redis"]
    assert "ports" not in redis  # a host Redis on 6379 is never in the way
    command = redis["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction"
    assert any(m.is_named_volume and m.target == "/data" for m in mounts(redis))
    assert "redis-cli" in redis["healthcheck"]["test"]


def test_redis_port_override_publishes_on_loopback_only() -> None:
    (port,) = load_project(BASE_FILE, REDIS_PORT_FILE)["services"]["redis"]["ports"]
    assert port == "127.0.0.1:6380:6379"
    (port,) = load_project(BASE_FILE, REDIS_PORT_FILE, env={"RADIXQ_REDIS_PORT": "7001"})["services"][
        "redis"
    ]["ports"]
    assert port == "127.0.0.1:7001:6379"


def test_cpu_profile_runs_cpu_workers_from_the_cpu_image() -> None:
    services = active_services(load_project(BASE_FILE), "cpu")
    assert set(services) == {"redis", "prometheus", "worker-cpu"}
    assert not any(gpu_devices(service) or "gpus" in service for service in services.values())
    worker = services["worker-cpu"]
    assert worker["build"] == {"context": ".", "dockerfile": "Dockerfile"}
    command = worker["command"]
    assert command[0] == "worker" and command[command.index("--device") + 1] == "cpu"
    assert "container_name" not in worker and "hostname" not in worker  # --scale worker-cpu=N
    assert worker["depends_on"]["redis"]["condition"] == "service_healthy"


@pytest.mark.parametrize("env, cores", [({}, 2.0), ({"RADIXQ_WORKER_CPUS": "3"}, 3.0)])
def test_each_cpu_worker_has_a_cpu_quota_and_as_many_threads(env: dict[str, str], cores: float) -> None:
    """Issue 32, defect 5: `--scale worker-cpu=N` runs N containers of RADIXQ_WORKER_CPUS cores
    each, whose engine and OpenMP runtime run that many threads (not every core of the host)."""
    worker = active_services(load_project(BASE_FILE, env=env), "cpu")["worker-cpu"]
    assert float(worker["deploy"]["resources"]["limits"]["cpus"]) == cores
    assert {name: float(worker["environment"][name]) for name in CPU_THREAD_VARIABLES} == dict.fromkeys(
        CPU_THREAD_VARIABLES, cores
    )
    assert "cpus" not in worker  # one place for the quota: deploy.resources.limits


@pytest.mark.parametrize("count", [1, 2, 4, 8])
def test_each_generated_gpu_worker_reserves_its_own_gpu(tmp_path: Path, count: int) -> None:
    project = load_project(BASE_FILE, generate_gpu_override(tmp_path, str(count)))
    workers = {name: s for name, s in active_services(project).items() if name.startswith("worker")}
    assert set(workers) == {f"worker-gpu{i}" for i in range(count)}
    assigned = []
    for name, worker in workers.items():
        (device,) = gpu_devices(worker)
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
        assert "count" not in device  # count and device_ids exclude each other
        (gpu,) = device["device_ids"]
        assert name == f"worker-gpu{gpu}"
        assigned.append(gpu)
        command = worker["command"]
        assert command[0] == "worker" and command[command.index("--device") + 1] == "cuda"
        assert worker["build"] == {"context": ".", "dockerfile": "docker/Dockerfile.gpu"}
    assert sorted(assigned, key=int) == [str(i) for i in range(count)]  # all different, all there


def test_gpu_ids_can_be_chosen_and_bad_ones_are_one_line_errors(tmp_path: Path) -> None:
    project = load_project(BASE_FILE, generate_gpu_override(tmp_path, "--ids", "0,2,5"))
    workers = [s for name, s in project["services"].items() if name.startswith("worker-gpu")]
    ids = {gpu_devices(worker)[0]["device_ids"][0] for worker in workers}
    assert ids == {"0", "2", "5"}
    for args in (["--ids", "1,1"], ["0"], [], ["2", "--ids", "3"], ["--ids", "a"]):
        done = subprocess.run(
            [sys.executable, str(GPU_SERVICES), *args, "-o", str(tmp_path / "x.yml")],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 2 and done.stderr.startswith("error: "), args
        assert len(done.stderr.splitlines()) == 1, done.stderr
        assert not (tmp_path / "x.yml").exists()


CPU_THREAD_VARIABLES = ("RADIXQ_CPU_THREADS", "OMP_NUM_THREADS")  # the CPU worker's alone


def test_gpu_and_cpu_workers_agree_on_everything_but_device_image_and_caches(tmp_path: Path) -> None:
    project = load_project(BASE_FILE, generate_gpu_override(tmp_path, "1"))
    cpu, gpu = project["services"]["worker-cpu"], project["services"]["worker-gpu0"]
    cpu_env = {k: v for k, v in cpu["environment"].items() if k not in CPU_THREAD_VARIABLES}
    assert cpu_env == gpu["environment"]
    for dotted in WORKER_SETTINGS_SHARED:
        if dotted != "environment":
            assert setting(cpu, dotted) == setting(gpu, dotted), dotted
    assert set(mounts(cpu)) <= set(mounts(gpu))  # the GPU adds its compile caches


def test_every_build_dockerfile_volume_and_dependency_exists(tmp_path: Path) -> None:
    # NOTE: Compose creates a missing bind source (short syntax); ./data is where the producer
    # writes, so it may not exist yet. Sources under ~ are the user's host paths.
    created_by_compose = {"./data"}
    for variant, (project, services) in projects(tmp_path).items():
        declared_volumes = set(project.get("volumes") or {})
        for name, service in services.items():
            where = f"{variant}: {name}"
            if "build" in service:
                context = REPO_ROOT / service["build"]["context"]
                assert context.is_dir(), where
                assert (context / service["build"].get("dockerfile", "Dockerfile")).is_file(), where
                assert service.get("image", "").startswith("radixq:"), where
            for mount in mounts(service):
                if mount.is_named_volume:
                    assert mount.source in declared_volumes, f"{where}: {mount.source}"
                elif mount.source.startswith("."):
                    assert mount.source in created_by_compose or (REPO_ROOT / mount.source).exists(), where
            for dependency in service.get("depends_on", {}):
                assert dependency in project["services"], f"{where}: {dependency}"
        # services that share an image tag build it from the same Dockerfile
        built = {}
        for service in project["services"].values():
            if "build" in service:
                spec = (service["build"]["context"], service["build"]["dockerfile"])
                assert built.setdefault(service["image"], spec) == spec, variant


def test_durations_are_go_durations(tmp_path: Path) -> None:
    project = load_project(BASE_FILE, generate_gpu_override(tmp_path, "1"))
    checked = 0
    for name, service in project["services"].items():
        for dotted in DURATION_FIELDS:
            try:
                value = setting(service, dotted)
            except KeyError:
                continue
            assert GO_DURATION.fullmatch(value), f"{name}.{dotted}: {value!r}"
            checked += 1
    assert checked >= 10
    assert not GO_DURATION.fullmatch("5 seconds") and not GO_DURATION.fullmatch("90")


def radixq_commands() -> dict[str, Any]:
    """The radixq CLI's commands, as the console script (ENTRYPOINT radixq) registers them."""
    import radixq.cli

    return typer.main.get_command(radixq.cli.build_app()).commands  # type: ignore[attr-defined]


def copied_paths(dockerfile: Path) -> dict[str, Path]:
    """Image path -> repository path of every COPY (WORKDIR-relative destinations resolved)."""
    workdir, copied = "/", {}
    for instruction in parse_dockerfile(dockerfile):
        if instruction.keyword == "WORKDIR":
            workdir = instruction.args
        elif instruction.keyword == "COPY":
            *sources, destination = instruction.args.split()
            target = destination if destination.startswith("/") else f"{workdir}/{destination}"
            for source in sources:
                into = target.rstrip("/") + "/" + Path(source).name if target.endswith("/") else target
                copied[into.replace("/./", "/")] = REPO_ROOT / source
    return copied


def test_service_commands_are_radixq_commands_with_real_options(tmp_path: Path) -> None:
    commands = radixq_commands()
    project = load_project(BASE_FILE, generate_gpu_override(tmp_path, "1"))
    for name, service in project["services"].items():
        if "build" not in service:
            continue
        dockerfile = REPO_ROOT / service["build"]["context"] / service["build"]["dockerfile"]
        entrypoint = next(i for i in parse_dockerfile(dockerfile) if i.keyword == "ENTRYPOINT")
        assert entrypoint.exec_form() == ["radixq"], name
        subcommand, *args = service["command"]
        assert subcommand in commands, name
        options = {opt for param in commands[subcommand].params for opt in param.opts}
        assert {arg for arg in args if arg.startswith("--")} <= options, name
        files = [arg for arg in args if arg.startswith("/app/")]
        image_files = copied_paths(dockerfile)
        for path in files:  # e.g. the producer's /app/examples/prompts.jsonl
            folder = next(p for p in image_files if path.startswith(p + "/"))
            assert (image_files[folder] / path[len(folder) + 1 :]).is_file(), f"{name}: {path}"


def test_worker_healthcheck_runs_a_script_the_worker_image_holds(tmp_path: Path) -> None:
    project = load_project(BASE_FILE, generate_gpu_override(tmp_path, "1"))
    for name in ("worker-cpu", "worker-gpu0"):
        service = project["services"][name]
        check = service["healthcheck"]
        assert check["test"] == ["CMD", "python", "/app/docker/healthcheck.py"], name
        assert "start_period" in check  # the first start loads (and compiles) before any heartbeat
        dockerfile = REPO_ROOT / service["build"]["context"] / service["build"]["dockerfile"]
        assert copied_paths(dockerfile)["/app/docker/healthcheck.py"] == REPO_ROOT / "docker/healthcheck.py"
        instructions = parse_dockerfile(dockerfile)
        base = next(i.args for i in instructions if i.keyword == "FROM")
        # `python` is on PATH: the official Python image has it; the GPU image's venv provides it
        if base.startswith("python:"):
            continue
        assert any(i.keyword == "RUN" and "python3 -m venv /opt/venv" in i.args for i in instructions)
        assert any(i.keyword == "ENV" and i.args.startswith("PATH=/opt/venv/bin:") for i in instructions)


def test_healthcheck_script_imports_only_what_the_images_install() -> None:
    tree = ast.parse((REPO_ROOT / "docker" / "healthcheck.py").read_text())
    top_level = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            top_level |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            top_level.add(node.module.split(".")[0])
    third_party = top_level - set(sys.stdlib_module_names) - {"__future__"}
    assert third_party == {"redis", "wire"}  # a project dependency and the project itself


def test_docker_folder_ignores_the_generated_file() -> None:
    assert "compose.gpus.yml" in (REPO_ROOT / "docker" / ".gitignore").read_text().split()
    assert CPU_DOCKERFILE.is_file() and GPU_DOCKERFILE.is_file()


def prometheus_targets() -> tuple[set[str], int]:
    """(DNS names, port) that docker/prometheus.yml discovers its scrape targets by."""
    config = yaml.safe_load((REPO_ROOT / "docker" / "prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    (discovery,) = job["dns_sd_configs"]
    assert discovery["type"] == "A" and job.get("metrics_path", "/metrics") == "/metrics"
    return set(discovery["names"]), int(discovery["port"])


@pytest.mark.parametrize("how", ["cpu", "gpus"])
def test_prometheus_scrapes_every_worker_on_its_metrics_port(tmp_path: Path, how: str) -> None:
    """Issue 17, item 6: each worker serves /metrics (RADIXQ_METRICS_PORT) on the port the
    Prometheus service scrapes, under the network alias its DNS discovery asks for (one A
    record per container, replicas included); Prometheus mounts that config."""
    project, services = projects(tmp_path)[how]
    names, port = prometheus_targets()
    workers = {name: service for name, service in services.items() if name.startswith("worker")}
    assert workers and "prometheus" in services
    for name, service in workers.items():
        assert service["environment"]["RADIXQ_METRICS_PORT"] == str(port), name
        aliases = set(service["networks"]["default"]["aliases"])
        assert names <= aliases, name
    prometheus = services["prometheus"]
    config = next(m for m in mounts(prometheus) if m.target == "/etc/prometheus/prometheus.yml")
    assert (REPO_ROOT / config.source).resolve() == (REPO_ROOT / "docker" / "prometheus.yml").resolve()
    assert f"--config.file={config.target}" in prometheus["command"]


def first_compose_block(page: str) -> list[str]:
    """The command lines of the first code block of ``page`` that runs `docker compose`."""
    fences = re.findall(r"^```(\w*)\n(.*?)^```", (REPO_ROOT / page).read_text(), re.S | re.M)
    block = next(b for lang, b in fences if lang in ("", "sh", "bash") and "docker compose" in b)
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


@pytest.mark.parametrize("page", ["README.md", "docs/operations.md"])
def test_the_first_compose_command_of_the_docs_starts_one_worker_per_gpu(page: str, tmp_path: Path) -> None:
    """Issue 17, item 10: the first `docker compose` command the README (and the operations
    page) gives, with the steps of its line before it, starts a pool: one worker per GPU, each
    reserving its own GPU, all scraped by Prometheus; the project it starts is valid against
    the Compose schema."""
    from tests.unit.test_compose_schema import errors

    first = next(line for line in first_compose_block(page) if "docker compose" in line)
    steps = [step.strip() for step in first.split("&&")]
    generate = next(step for step in steps if step.startswith("python3 docker/gpu-services.py"))
    count = int(generate.split()[2])
    override = generate_gpu_override(tmp_path, *generate.split()[2:])
    up = next(step for step in steps if step.startswith("docker compose"))
    files = re.findall(r"-f (\S+)", up)
    assert up.endswith("up -d") and files == ["docker-compose.yml", "docker/compose.gpus.yml"], up
    project = load_project(BASE_FILE, override)
    assert errors(project) == []
    services = active_services(project)
    workers = {name: s for name, s in services.items() if name.startswith("worker")}
    ids = [gpu_devices(service)[0]["device_ids"] for service in workers.values()]
    assert sorted(ids) == [[str(i)] for i in range(count)] and count >= 2
    assert {"redis", "prometheus"} <= set(services)


def test_the_api_profile_serves_the_batch_api_on_loopback_with_keys_and_a_volume() -> None:
    """radixq serve (profile api): the workers' queue and Redis, the keys from RADIXQ_API_KEYS,
    its port on loopback, its files on a named volume, healthy while /health answers."""
    project = load_project(BASE_FILE, env={"RADIXQ_API_KEYS": "sk-one,sk-two"})
    services = active_services(project, "api")
    assert set(services) == {"redis", "prometheus", "api"}  # not started without the profile
    api = services["api"]
    assert api["command"][0] == "serve" and api["environment"]["RADIXQ_API_KEYS"] == "sk-one,sk-two"
    workers = project["services"]["worker-cpu"]["environment"]
    assert all(api["environment"][name] == workers[name] for name in ("RADIXQ_REDIS_URL", "RADIXQ_QUEUE"))
    assert api["ports"] == ["127.0.0.1:8000:8000"]
    (volume,) = mounts(api)
    assert volume.is_named_volume and volume.target == api["command"][api["command"].index("--data-dir") + 1]
    assert "/health" in " ".join(api["healthcheck"]["test"])
    assert api["depends_on"]["redis"]["condition"] == "service_healthy"
