"""Tensor parallelism's process group: which rank this process is, and the collectives it needs.

One process per rank; rank 0 schedules and the others follow (worker.scheduler.tp). The group
is torch.distributed over NCCL on CUDA and gloo on CPU (so the CPU tests run the real
collective path). A process that never calls ``init_tp`` is rank 0 of a group of one, where
every collective is the identity.
"""

from __future__ import annotations

import datetime
import os
import socket
from dataclasses import dataclass

import torch

# NOTE: NVLink multicast stays off in every process of a group (issue 19: NVLS hangs seen on the device)
NVLS_OFF_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


@dataclass(frozen=True)
class TPInfo:
    rank: int = 0
    size: int = 1

    @property
    def leader(self) -> bool:
        return self.rank == 0


_tp = TPInfo()


def tp_info() -> TPInfo:
    """This process's place in its tensor-parallel group (rank 0 of 1 unless ``init_tp`` ran)."""
    return _tp


def free_loopback_address() -> str:
    """``tcp://127.0.0.1:PORT`` on a port free now (the group's rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def backend_for(device: str) -> str:
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def init_tp(rank: int, size: int, init_method: str, device: str, timeout_s: float = 600.0) -> TPInfo:
    """Join the group (blocks until all ``size`` ranks have called it with ``init_method``)."""
    global _tp
    if size > 1:
        import torch.distributed as dist

        for name, value in NVLS_OFF_ENV.items():
            os.environ.setdefault(name, value)
        backend = backend_for(device)
        options: dict = {}
        if backend == "nccl":
            options["device_id"] = torch.device(device)
        dist.init_process_group(
            backend,
            init_method=init_method,
            rank=rank,
            world_size=size,
            timeout=datetime.timedelta(seconds=timeout_s),
            **options,
        )
    _tp = TPInfo(rank, size)
    return _tp


def close_tp() -> None:
    global _tp
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _tp = TPInfo()


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """The sum of ``x`` over the group, in place (returned for chaining)."""
    if _tp.size > 1:
        import torch.distributed as dist

        dist.all_reduce(x)
    return x


def broadcast(x: torch.Tensor) -> torch.Tensor:
    """Rank 0's ``x`` on every rank, in place."""
    if _tp.size > 1:
        import torch.distributed as dist

        dist.broadcast(x, src=0)
    return x


def all_reduce_min(value: int, device: str | torch.device) -> int:
    """The smallest ``value`` over the group (e.g. num_pages: every rank can hold that many)."""
    if _tp.size == 1:
        return value
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())
