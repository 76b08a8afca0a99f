"""Write a Compose override with one radixq worker per GPU, each reserving only its own GPU.

    python3 docker/gpu-services.py 4            # worker-gpu0..worker-gpu3 on GPUs 0..3
    python3 docker/gpu-services.py --ids 0,2    # worker-gpu0 and worker-gpu2 on GPUs 0 and 2
    python3 docker/gpu-services.py 4 --tp 2     # worker-gpu0-1 and worker-gpu2-3: two TP=2 workers
    export COMPOSE_FILE=docker-compose.yml:docker/compose.gpus.yml    # or -f each file
    docker compose up -d

Why a generated file: ``--scale worker=N`` with a ``count: 1`` reservation gives every replica
the same GPU (Compose does not spread replicas over a host's GPUs), so each GPU gets a service
of its own whose reservation names it in ``device_ids``; inside its container that GPU is
``cuda:0``. With ``--tp N`` each service reserves N consecutive GPUs of the list and runs one
tensor-parallel group on them (``cuda:0..N-1`` inside). The workers run the GPU image (docker/Dockerfile.gpu) and share three named
volumes: converted models (~/.cache/radixq) and the FlashInfer and Triton compile caches, so
kernels are compiled once per host, not once per container start.

Standard library only, for the host's python3. The file is JSON (JSON is YAML) after a comment
line. Its relative paths resolve against the first -f file's folder (the repository root), as
Compose resolves every file of a project.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, NoReturn

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUTPUT = REPO_ROOT / "docker" / "compose.gpus.yml"

# Container paths of the caches; docker/Dockerfile.gpu declares the same VOLUMEs.
CACHE_VOLUMES = {
    "radixq-cache": "/root/.cache/radixq",  # converted models (worker.models.aliases.cache_root)
    "flashinfer-cache": "/root/.cache/flashinfer",  # FlashInfer's JIT modules ($HOME/.cache/flashinfer)
    "triton-cache": "/root/.triton",  # Triton's kernel cache ($HOME/.triton/cache)
}
# The model's own first start converts it and compiles every kernel: minutes on a fresh host.
START_PERIOD = "20m"
# What docker/prometheus.yml scrapes: every worker's /metrics port under one network alias.
METRICS_PORT = 9400
WORKER_ALIAS = "worker"


def gpu_worker(gpu_ids: list[int]) -> dict[str, Any]:
    """One worker service reserving the GPUs ``gpu_ids`` alone (a TP group when several)."""
    tp = ["--tensor-parallel-size", str(len(gpu_ids))] if len(gpu_ids) > 1 else []
    return {
        "build": {"context": ".", "dockerfile": "docker/Dockerfile.gpu"},
        "image": "radixq:gpu",
        "command": ["worker", "--model", "${RADIXQ_MODEL:-smollm2-135m}", "--device", "cuda", *tp],
        "environment": {
            "RADIXQ_REDIS_URL": "redis://redis:6379/0",
            "RADIXQ_QUEUE": "${RADIXQ_QUEUE:-default}",
            "RADIXQ_DRAIN_TIMEOUT_S": "60",
            "RADIXQ_METRICS_PORT": str(METRICS_PORT),
        },
        "networks": {"default": {"aliases": [WORKER_ALIAS]}},
        "init": True,
        "depends_on": {"redis": {"condition": "service_healthy"}},
        "healthcheck": {
            "test": ["CMD", "python", "/app/docker/healthcheck.py"],
            "interval": "10s",
            "timeout": "5s",
            "retries": 3,
            "start_period": START_PERIOD,
        },
        "stop_signal": "SIGTERM",
        "stop_grace_period": "90s",
        "restart": "unless-stopped",
        "volumes": [f"{name}:{path}" for name, path in CACHE_VOLUMES.items()]
        + ["${HF_HOME:-~/.cache/huggingface}:/root/.cache/huggingface"],
        "deploy": {
            "resources": {
                "reservations": {
                    "devices": [
                        {"driver": "nvidia", "device_ids": [str(g) for g in gpu_ids], "capabilities": ["gpu"]}
                    ]
                }
            }
        },
    }


def compose_override(gpu_ids: list[int], tp: int = 1) -> dict[str, Any]:
    """The override: services ``worker-gpu<i>`` for each id (``worker-gpu<i>-<j>`` for each
    group of ``tp`` consecutive ids), and the volumes they use."""
    if not gpu_ids or len(set(gpu_ids)) != len(gpu_ids) or min(gpu_ids) < 0:
        raise ValueError(f"GPU ids must be distinct and non-negative, at least one: {gpu_ids}")
    if tp < 1 or len(gpu_ids) % tp != 0:
        raise ValueError(f"--tp {tp}: the {len(gpu_ids)} GPUs do not split into groups of {tp}")
    groups = [gpu_ids[i : i + tp] for i in range(0, len(gpu_ids), tp)]
    return {
        "services": {"worker-gpu" + "-".join(map(str, group)): gpu_worker(group) for group in groups},
        "volumes": {name: {} for name in CACHE_VOLUMES},
    }


class OneLineErrors(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see --help)\n")


def parse_ids(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of GPU indices: {text!r}") from None


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrors(description=__doc__.splitlines()[0])
    parser.add_argument("count", nargs="?", type=int, help="GPUs 0..COUNT-1 (see nvidia-smi -L)")
    parser.add_argument("--ids", type=parse_ids, help="GPU indices instead of COUNT, e.g. 0,2,3")
    parser.add_argument("--tp", type=int, default=1, help="GPUs per worker (tensor-parallel size)")
    parser.add_argument("-o", "--output", type=Path, default=DEFAULT_OUTPUT, help="default: %(default)s")
    args = parser.parse_args(argv)
    if (args.count is None) == (args.ids is None):
        parser.error("give COUNT or --ids, one of them")
    if args.count is not None and args.count < 1:
        parser.error(f"COUNT must be at least 1, not {args.count}")
    gpu_ids = args.ids if args.ids is not None else list(range(args.count))
    try:
        override = compose_override(gpu_ids, args.tp)
    except ValueError as exc:
        parser.error(str(exc))
    command = " ".join(sys.argv[1:] if argv is None else argv)
    args.output.write_text(
        f"# Generated by docker/gpu-services.py {command}; run it again to change the GPUs.\n"
        + json.dumps(override, indent=2)
        + "\n"
    )
    names = ", ".join(override["services"])
    print(f"wrote {args.output}: {names}")
    print(f"then: docker compose -f docker-compose.yml -f {display_path(args.output)} up -d")
    return 0


def display_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


if __name__ == "__main__":
    sys.exit(main())
