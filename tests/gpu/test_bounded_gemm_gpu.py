"""worker.kernels.bounded_gemm on CUDA: the persistent GEMM at Llama-3.1-8B's decode shapes,
bf16 against float32 torch and FP8 against worker.models.fp8's emulation of the same e4m3
values and scales, on a few SMs (each program walking many tiles) and on all of them, with
per-thread loads and with TMA."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", autouse=True)
def cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")


def relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm())


@pytest.mark.parametrize("tma", [False, True])
@pytest.mark.parametrize("programs", [8, 66, 132])
@pytest.mark.parametrize("shape", [(1024, 6144, 4096), (512, 4096, 14336), (37, 28672, 4096)])
def test_matches_torch_and_the_fp8_emulation(shape: tuple[int, int, int], programs: int, tma: bool):
    from worker.kernels.bounded_gemm import bounded_linear
    from worker.kernels.ops import quantize_fp8_rows
    from worker.models.fp8 import emulated_fp8_matmul, quantize_channels

    rows, cols, depth = shape
    gen = torch.Generator(device="cuda").manual_seed(programs)
    x = torch.randn(rows, depth, device="cuda", generator=gen).bfloat16()
    w = (torch.randn(cols, depth, device="cuda", generator=gen) / depth**0.5).bfloat16()
    got = bounded_linear(x, w, programs=programs, tma=tma)
    assert relative(got, x.float() @ w.float().t()) < 1e-2
    q = quantize_fp8_rows(x)
    w_q, w_scale = quantize_channels(w)
    got8 = bounded_linear(
        q.data, w_q, programs=programs, tma=tma, x_scale=q.scale, w_scale=w_scale, out_dtype=torch.bfloat16
    )
    assert relative(got8, emulated_fp8_matmul(q, w_q, w_scale)) < 1e-2
