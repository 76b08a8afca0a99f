"""worker.kernels.bounded_gemm under triton's CPU interpreter: the persistent GEMM on fewer
programs than tiles (each program walks several), on more, and on one, against torch's product
(float32, bf16) and against worker.models.fp8's emulation of the FP8 GEMM (same e4m3 values and
scales), its operands read per thread or through TMA descriptors; uneven shapes run the masked K
loop (TMA: reads past the edge are zeros), partial row blocks and the wrapped column block."""

from __future__ import annotations

import os

import pytest
import torch

from tests.triton_interpret import interpreted_test_module

interpreted_test_module(
    "worker.kernels.bounded_gemm_triton",
    "worker.kernels.triton_kernels",
    native_tests="tests/gpu/test_bounded_gemm_gpu.py",
)

from tests.moe_oracle import relative_error  # noqa: E402
from worker.kernels.bounded_gemm import GemmTiles, bounded_linear, gemm_tiles  # noqa: E402
from worker.kernels.ops import quantize_fp8_rows_ref  # noqa: E402
from worker.models.fp8 import emulated_fp8_matmul, quantize_channels  # noqa: E402

TILES = GemmTiles(block_m=16, block_n=16, block_k=32, group_m=2, num_warps=4, num_stages=2)


@pytest.fixture(autouse=True)
def interpret():
    os.environ["TRITON_INTERPRET"] = "1"
    yield
    os.environ.pop("TRITON_INTERPRET", None)


def operands(rows: int, cols: int, depth: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, depth, generator=gen), torch.randn(cols, depth, generator=gen) / depth**0.5


# 37 x 50 with 16 x 16 tiles: 3 x 4 = 12 tiles, the last row block and column block partial
@pytest.mark.parametrize("programs", [1, 5, 12, 40])
@pytest.mark.parametrize("depth", [64, 72])
@pytest.mark.parametrize("tma", [False, True])
def test_float32_matches_torch(programs: int, depth: int, tma: bool):
    x, w = operands(37, 50, depth, seed=programs + depth)
    got = bounded_linear(x, w, programs=programs, tiles=TILES, tma=tma)
    assert got.shape == (37, 50) and got.dtype == torch.float32
    assert relative_error(got, x @ w.t()) < 1e-5


@pytest.mark.parametrize("tma", [False, True])
def test_bf16_matches_torch(tma: bool):
    x, w = operands(37, 50, 72, seed=1)
    got = bounded_linear(x.bfloat16(), w.bfloat16(), programs=3, tiles=TILES, tma=tma)
    # NOTE: the interpreter rounds the float32 sums to bf16 by truncation (torch: to nearest)
    assert got.dtype == torch.bfloat16
    assert relative_error(got, x.bfloat16().float() @ w.bfloat16().float().t()) < 1e-2


@pytest.mark.parametrize("programs", [1, 7])
@pytest.mark.parametrize("tma", [False, True])
def test_fp8_matches_the_emulated_gemm(programs: int, tma: bool):
    """Same e4m3 values, each K step's product summed in float32, the row and channel scales
    applied at the end: the emulation's float32 product to rounding."""
    x, w = operands(37, 50, 96, seed=programs)
    rows = quantize_fp8_rows_ref(x)
    w_q, w_scale = quantize_channels(w)
    got = bounded_linear(rows.data, w_q, programs=programs, x_scale=rows.scale, w_scale=w_scale,
                         out_dtype=torch.float32, tiles=TILES, tma=tma)  # fmt: skip
    want = emulated_fp8_matmul(rows, w_q, w_scale)
    assert relative_error(got, want) < 1e-5
    # and it is the quantized product, not the plain one
    assert relative_error(got, x @ w.t()) > 10 * relative_error(got, want)


def test_default_tiles_on_a_small_batch():
    """The tiles chosen for 8 rows (64-row blocks) over 300 columns (a wrapped last block)."""
    x, w = operands(8, 300, 128, seed=4)
    assert gemm_tiles(8, 300, fp8=False).block_m == 64
    assert relative_error(bounded_linear(x, w, programs=2), x @ w.t()) < 1e-5


def test_empty_batch_and_bad_arguments():
    x, w = operands(0, 50, 64, seed=0)
    assert bounded_linear(x, w, programs=4).shape == (0, 50)
    x, w = operands(4, 50, 64, seed=0)
    with pytest.raises(ValueError, match="x \\[M, K\\] and weight \\[N, K\\]"):
        bounded_linear(x, w[:, :32], programs=4)
    with pytest.raises(ValueError, match="programs must be at least 1"):
        bounded_linear(x, w, programs=0)
    rows = quantize_fp8_rows_ref(x)
    with pytest.raises(ValueError, match="needs x_scale, w_scale and out_dtype"):
        bounded_linear(rows.data, quantize_channels(w)[0], programs=4)
    x, w = operands(4, 50, 66, seed=0)  # 66 bf16 values: 132 bytes a row, not whole 16-byte units
    with pytest.raises(ValueError, match="multiple of 16 bytes, got K=66"):
        bounded_linear(x.bfloat16(), w.bfloat16(), programs=4, tma=True)
