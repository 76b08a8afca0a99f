"""`radixq run --workers 2` with real CPU engines: each engine runs its share of the host's
cores (one thread each on 2 cores), not every core each, and its idle OpenMP threads spin
only briefly."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.integration.procs import REPO_ROOT, radixq, subprocess_env
from worker.engine.threads import share_per_worker

pytestmark = pytest.mark.integration
THREADS_LINE = re.compile(
    r"CPU engine: torch threads (\d+) \(cpu_threads (\d+)\), OMP_WAIT_POLICY (\w+), GOMP_SPINCOUNT (\w+)"
)


def _run(tmp_path: Path, workers: int, **env: str) -> list[tuple[int, int, str, str]]:
    """Run 4 token-id jobs on dummy tiny-llama engines; (threads, setting, OpenMP wait policy,
    spin count) each engine logged."""
    config = tmp_path / "worker.toml"
    config.write_text(
        f'[engine]\nmodel = "{REPO_ROOT / "configs" / "tiny-llama.json"}"\nload_format = "dummy"\ndevice = "cpu"\n'
    )
    source = tmp_path / "jobs.jsonl"
    source.write_text(
        "".join(
            json.dumps({"id": f"j{i}", "input_ids": [1, 2, i + 3], "max_tokens": 2}) + "\n" for i in range(4)
        )
    )
    out = tmp_path / f"out-{workers}.jsonl"
    base = subprocess_env()
    for name in ("RADIXQ_CPU_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        base.pop(name, None)  # only what the test gives
    done = radixq(
        "run", str(source), "-o", str(out), "--workers", str(workers), "--config", str(config),
        "--timeout", "120", env={**base, **env},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == [f"j{i}" for i in range(4)]
    return [(int(a), int(b), policy, spin) for a, b, policy, spin in THREADS_LINE.findall(done.stderr)]


def test_run_gives_each_worker_its_share_of_the_cores(tmp_path: Path) -> None:
    share = share_per_worker(2)
    assert _run(tmp_path, 2) == [(share, share, "unset", "10000")] * 2


def test_the_users_settings_are_left_alone(tmp_path: Path) -> None:
    asked = share_per_worker(2) + 1  # not what run would have chosen
    got = _run(tmp_path, 2, RADIXQ_CPU_THREADS=str(asked), OMP_WAIT_POLICY="PASSIVE")
    assert got == [(asked, asked, "PASSIVE", "unset")] * 2  # the user's policy too
