"""The split decode path on the GPU (worker.engine.split, ``decode_split_sms``): a decode pass
cut in two halves, each half's attention on a green context of 48 SMs and its other kernels on
the rest, gives the greedy tokens the unsplit engine gives (issue 31's condition for keeping a
split), for a dense and a MoE family, bf16 and FP8 KV. The tiny models are test_families_gpu's,
trained a little so that bf16 rounding rarely decides an argmax."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.gpu.test_families_gpu import prompts, trained_dir
from wire.schema import SamplingParams
from worker.llm import LLM

pytestmark = pytest.mark.gpu
KINDS = ["mistral", "qwen3_moe"]


@pytest.fixture(scope="module", params=KINDS)
def trained(request, tmp_path_factory) -> tuple[str, Path, torch.nn.Module]:
    path = tmp_path_factory.mktemp(request.param)
    return request.param, path, trained_dir(request.param, path)


def continuations(path: Path, **options) -> tuple[list[list[int]], int]:
    """Greedy tokens of the 8 prompts, and how many decode passes were split."""
    llm = LLM(str(path), device="cuda", num_pages=1024, max_running_reqs=8, cuda_graph_max_bs=8, **options)
    results = llm.generate(prompts(), SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True))
    assert all(r.error is None for r in results)
    split = llm.engine.split
    return [r.choices[0].token_ids for r in results], split.passes if split is not None else 0


@pytest.mark.parametrize("kv", ["auto", "fp8_e4m3"])
def test_split_decode_gives_the_unsplit_tokens(trained, kv: str) -> None:
    _, path, _ = trained
    whole, none_split = continuations(path, dtype="bfloat16", kv_cache_dtype=kv)
    split, passes = continuations(
        path, dtype="bfloat16", kv_cache_dtype=kv, decode_split_sms=48, decode_split_min_batch=2
    )
    assert none_split == 0 and passes >= 25  # 31 decode passes of 8, less those riding with a prefill
    assert split == whole
