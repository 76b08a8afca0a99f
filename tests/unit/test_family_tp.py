"""Tensor parallelism (CPU, gloo) for the new families' sharded parts: TP=2 generates what
TP=1 generates (tokens equal, logprobs within 1e-4: tests/unit/test_tensor_parallel.py says
why) for Qwen3-MoE (experts' intermediate rows split, router replicated, a dense layer
between) and Gemma 3 (sliding/global layers, q/k norms, pre/post norms), through chunked
prefill and the radix cache; and TP=1 is transformers (tests/unit/test_families.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.family_fixtures import family_dir, family_prompts
from tests.tp_harness import assert_same_generation, greedy, run_workload
from worker.scheduler.config import SchedulerProcessConfig
from worker.scheduler.messages import GenerateRequest


def config(model_dir: Path, tp: int) -> SchedulerProcessConfig:
    return SchedulerProcessConfig.from_options(
        str(model_dir), device="cpu", tensor_parallel_size=tp, page_size=4, max_running_reqs=8,
        max_prefill_tokens=16, cpu_threads=1,
    )  # fmt: skip


@pytest.mark.parametrize("kind", ["qwen3_moe", "gemma3_text"])
def test_tp2_generates_what_tp1_generates(kind: str, tmp_path: Path) -> None:
    family_dir(kind, tmp_path)
    prompts = family_prompts(seed=5, window=8)
    requests = [GenerateRequest(uid=f"r{i}", input_ids=p, sampling=greedy(12)) for i, p in enumerate(prompts)]
    want = run_workload(config(tmp_path, 1), requests)
    assert want.chunked and want.cached_tokens > 0
    got = run_workload(config(tmp_path, 2), requests)
    assert_same_generation(got, want, logprob_atol=1e-4)
    assert len(got.follower_pids) == 1
