"""FP8 checkpoints as published on the GPU (worker.models.fp8_checkpoint): a compressed-tensors
per-channel checkpoint and a block-wise one (quant_method fp8, 128 x 128 blocks), written by the
test from a tiny trained model (tests/fp8_checkpoints.py), loaded on CUDA (bf16, torch._scaled_mm,
the fused MoE kernel for experts, CUDA graphs); the engine's greedy continuations against the
CPU FP8 emulation of the same checkpoint (float32), teacher-forced argmax agreement >= 99%, as
tests/gpu/test_families_gpu.py checks quantization = "fp8".
Run: pytest -m gpu tests/gpu/test_fp8_checkpoint_gpu.py
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from tests.fp8_checkpoints import write_fp8_checkpoint
from tests.gpu.test_families_gpu import AGREEMENT, agreement, gpu_continuations, prompts, trained_dir
from tests.model_fixtures import PagedRunner
from worker.models.fp8 import Fp8Linear
from worker.models.loader import load_model

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", autouse=True)
def cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")


@pytest.fixture(scope="module", params=["mistral", "qwen3_moe", "phi3"])
def trained(request, tmp_path_factory) -> tuple[str, Path]:
    path = tmp_path_factory.mktemp(request.param)
    trained_dir(request.param, path)
    return request.param, path


@pytest.mark.parametrize("kind", ["channel", "block"])
def test_fp8_checkpoint_on_the_gpu_agrees_with_the_cpu_emulation(trained, kind: str, tmp_path: Path) -> None:
    family, original = trained
    path = tmp_path / "fp8"
    shutil.copytree(original, path)
    write_fp8_checkpoint(path, kind, block=(128, 128))
    cpu = load_model(str(path), device="cpu", dtype=torch.float32)
    assert any(isinstance(m, Fp8Linear) for m in cpu.model.modules())

    def oracle(seq: list[int]) -> list[int]:
        runner = PagedRunner(cpu, page_size=4, max_reqs=1, max_len=len(seq) + 4)
        return [int(runner.step([(0, j, [seq[j]])])[0].argmax()) for j in range(len(seq))]

    share = agreement(gpu_continuations(path, dtype="bfloat16"), [len(p) for p in prompts()], oracle)
    print(
        f"{family} {kind} FP8 checkpoint: teacher-forced argmax agreement against the CPU emulation {share:.4f}"
    )
    assert share >= AGREEMENT
