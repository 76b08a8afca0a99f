"""How many torch threads a CPU engine runs: the ``cpu_threads`` setting and the cores it may use.

One engine per core set, never more threads than cores: OpenMP threads that outnumber the
cores they share wait on each other at every parallel region (a matmul, a copy), and a
decode step runs thousands of those. ``radixq run --workers N`` hands each worker
``cores // N`` threads (radixq.cli.run); a lone engine takes every core it may use.

The scheduler process also starts with ``GOMP_SPINCOUNT=10000`` (``openmp_env``): an idle
OpenMP thread spins for about 10k iterations (microseconds) waiting for its next region, then
sleeps, where libgomp's default spins 300k. On a machine whose cores other processes share,
a long-spinning thread takes the core that the thread doing the work needs: decode steps up to 4x
faster than the default at load 6-7 on the dev box, and as fast at load 1.5-2.5, where sleeping
at once (``OMP_WAIT_POLICY=PASSIVE``) costs 35% but wins again under heavy load
(docs/performance.md, CPU engine).
"""

from __future__ import annotations

import functools
import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
SPIN_COUNT = "10000"  # GOMP_SPINCOUNT of an engine process (module docstring)


def available_cpus(cgroup_root: Path | None = None) -> int:
    """Cores this process may use: its CPU affinity, capped by a cgroup CPU quota (a
    container's ``--cpus``, read under ``cgroup_root``, default CGROUP_ROOT), rounded up; at least 1."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    quota = _cgroup_quota(cgroup_root or CGROUP_ROOT)
    if quota is not None:
        cores = min(cores, math.ceil(quota))
    return max(1, cores)


def _cgroup_quota(root: Path) -> float | None:
    """The CPU quota in cores (cgroup v2 ``cpu.max``, else v1 ``cpu.cfs_quota_us``), None if unlimited."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if quota_us <= 0 or period_us <= 0 else quota_us / period_us


@functools.cache
def _torch_default_threads() -> int:
    """torch's own choice, read once, before any engine of this process changed it
    (OMP_NUM_THREADS when set, else the physical cores)."""
    import torch

    return torch.get_num_threads()


def engine_threads(cpu_threads: int) -> int:
    """The thread count for the setting: ``cpu_threads``; when 0, every available core, but no
    more than torch's own default (which honours OMP_NUM_THREADS)."""
    if cpu_threads < 0:
        raise ValueError(f"cpu_threads={cpu_threads}: must be >= 0 (0: every core this process may use)")
    return cpu_threads or min(available_cpus(), _torch_default_threads())


def share_per_worker(num_workers: int) -> int:
    """Threads for each of ``num_workers`` engines on this host's available cores (at least 1)."""
    return max(1, available_cpus() // max(1, num_workers))


def openmp_env(environ: dict[str, str]) -> dict[str, str]:
    """Variables for a new engine process's OpenMP runtime (torch's libgomp reads them once,
    when it loads): idle threads spin briefly, then sleep, unless the user chose a policy."""
    if "OMP_WAIT_POLICY" in environ or "GOMP_SPINCOUNT" in environ:
        return {}
    return {"GOMP_SPINCOUNT": SPIN_COUNT}


def apply_cpu_threads(cpu_threads: int) -> int:
    """Set this process's torch intra-op threads from the setting; returns the count set."""
    import torch

    threads = engine_threads(cpu_threads)
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads
