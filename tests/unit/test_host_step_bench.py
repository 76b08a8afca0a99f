"""benchmarks/host_step.py on a small workload: the stub engine still gives the real Scheduler
everything it reads, and every request is answered with all its tokens (run_once checks)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

from host_step import run_once, summary, workload  # noqa: E402


def test_workload_is_the_standard_distribution_scaled() -> None:
    prompts, max_tokens = workload(256, 1.0)
    assert sum(map(len, prompts)) == 142_827 and sum(max_tokens) == 133_966  # GPU.md's totals
    small, small_tokens = workload(256, 0.1)
    assert [len(p) for p in small] == [max(1, int(len(p) * 0.1)) for p in prompts]
    assert small_tokens == [max(1, int(n * 0.1)) for n in max_tokens]


def test_a_small_run_answers_everything_and_profiles_each_decode_step() -> None:
    args = argparse.Namespace(requests=32, length_scale=0.05, pool_share=0.8, full_share=0.98)
    run = run_once(args)  # raises unless every request got all its tokens and pages add up
    result = summary(run)
    assert run["decode_steps"] > 0 and len(run["all_ms"]) == run["decode_steps"]
    assert 0 < len(run["full_ms"]) <= run["decode_steps"]
    assert result["full_cpu_p50"] > 0 and result["full_p50"] > 0
