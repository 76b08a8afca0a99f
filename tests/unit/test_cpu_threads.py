"""One CPU engine per core set: the ``cpu_threads`` setting, the cores a process may use
(affinity, cgroup quota), and ``radixq run --workers N``'s share of them for each worker."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from radixq import cli
from worker.engine import threads
from worker.llm import LLM

REPO_ROOT = Path(__file__).resolve().parents[2]
TINY = str(REPO_ROOT / "configs" / "tiny-llama.json")


@pytest.fixture
def two_cores(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A process allowed on cores 0 and 1, in a cgroup without a quota (v2 ``max``)."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1})
    (tmp_path / "cpu.max").write_text("max 100000\n")
    monkeypatch.setattr(threads, "CGROUP_ROOT", tmp_path)
    return tmp_path


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"cpu.max": "max 100000\n"}, 8),
        ({"cpu.max": "150000 100000\n"}, 2),  # --cpus 1.5: two threads, the second one part-time
        ({"cpu.max": "100000 100000\n"}, 1),
        ({"cpu/cpu.cfs_quota_us": "300000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 3),  # cgroup v1
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, 8),
        ({}, 8),
    ],
)
def test_available_cpus_is_affinity_capped_by_the_cgroup_quota(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, files: dict[str, str], expected: int
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(8)))
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert threads.available_cpus(tmp_path) == expected


def test_the_setting_wins_and_zero_takes_every_core(two_cores: Path) -> None:
    assert threads.engine_threads(3) == 3
    assert threads.engine_threads(0) == min(2, torch.get_num_threads())
    with pytest.raises(ValueError, match="cpu_threads=-1"):
        threads.engine_threads(-1)


def test_run_shares_the_cores_out_among_its_workers(
    two_cores: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``--workers 2`` on 2 cores: one thread each; one worker: left to its own (all cores);
    a cpu_threads count from the environment or the file: left alone; 0 there is "auto"."""
    monkeypatch.delenv("RADIXQ_CPU_THREADS", raising=False)
    assert cli._cpu_threads_args(2, None) == ["--cpu-threads", "1"]
    assert cli._cpu_threads_args(3, None) == ["--cpu-threads", "1"]  # more workers than cores
    assert cli._cpu_threads_args(1, None) == []
    file = tmp_path / "w.toml"
    file.write_text("[engine]\ncpu_threads = 2\n")
    assert cli._cpu_threads_args(2, file) == []
    file.write_text("[engine]\ncpu_threads = 0\n")  # as configs/smollm2-cpu.toml has it
    assert cli._cpu_threads_args(2, file) == ["--cpu-threads", "1"]
    monkeypatch.setenv("RADIXQ_CPU_THREADS", "2")
    assert cli._cpu_threads_args(2, None) == []


def test_a_cpu_engine_runs_the_threads_it_was_given() -> None:
    before = torch.get_num_threads()
    try:
        llm = LLM(TINY, load_format="dummy", device="cpu", cpu_threads=1, num_pages=8)
        assert llm.engine.cpu_threads == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_engine_processes_spin_idle_openmp_threads_briefly_unless_told_otherwise() -> None:
    assert threads.openmp_env({}) == {"GOMP_SPINCOUNT": "10000"}
    assert threads.openmp_env({"OMP_WAIT_POLICY": "PASSIVE"}) == {}
    assert threads.openmp_env({"OMP_WAIT_POLICY": "ACTIVE"}) == {}
    assert threads.openmp_env({"GOMP_SPINCOUNT": "10000"}) == {}
