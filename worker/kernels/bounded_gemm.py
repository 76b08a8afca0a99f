"""A GEMM that holds at most a given number of SMs (worker.kernels.bounded_gemm_triton).

cuBLAS sizes its grid to the whole GPU, so a kernel on another stream only gets SMs as the
GEMM's last wave drains; this one runs ``programs`` persistent programs (one per SM at the
tiles below), leaving the other SMs to whatever runs beside it. benchmarks/overlap_probe.py
measures whether a decode step's attention then overlaps its GEMMs (issue 31 item 2).

    y = bounded_linear(x, w, programs=66)                              # bf16: x [M, K], w [N, K]
    y = bounded_linear(rows.data, w_q, programs=66, x_scale=rows.scale,
                       w_scale=w_scale, out_dtype=torch.bfloat16)      # FP8 (worker.models.fp8)
    y = bounded_linear(x, w, programs=66, tma=True)                    # operands read by TMA

Which of per-thread loads and TMA is faster, and whether attention beside it gains, is what
the probe measures; nothing in the engine calls it yet.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import torch

from worker.kernels.ops import _kernels_for


@dataclass(frozen=True)
class GemmTiles:
    """One program's output tile and K step, its warps and pipeline depth."""

    block_m: int = 128
    block_n: int = 128
    block_k: int = 64
    group_m: int = 8
    num_warps: int = 8
    num_stages: int = 4


BF16_TILES = GemmTiles()
FP8_TILES = GemmTiles(block_k=128)  # 32 KiB a stage: four stages and the epilogue fit one SM


def gemm_tiles(rows: int, cols: int, fp8: bool) -> GemmTiles:
    """The tiles for a [rows, cols] output: 128 x 128 (64 rows when there are 64 or fewer)."""
    tiles = FP8_TILES if fp8 else BF16_TILES
    if rows <= 64:
        return replace(tiles, block_m=64, num_warps=4)
    return tiles


def bounded_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    programs: int,
    x_scale: torch.Tensor | None = None,
    w_scale: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    tiles: GemmTiles | None = None,
    tma: bool = False,
) -> torch.Tensor:
    """x [M, K] @ weight[N, K]^T on at most ``programs`` programs (SMs).

    FP8 when x is e4m3: then ``x_scale`` [M] and ``w_scale`` [N] (float32) multiply the product
    and ``out_dtype`` is required. ``tma``: the operands are read through tensor-memory
    descriptors (Hopper's TMA; K times the element size must be a multiple of 16 bytes) instead
    of per-thread loads. Raises RuntimeError where Triton cannot run (CPU without
    TRITON_INTERPRET=1)."""
    k = _kernels_for(x)
    if k is None:
        raise RuntimeError("bounded_linear runs on CUDA (or under TRITON_INTERPRET=1)")
    from worker.kernels import bounded_gemm_triton

    fp8 = x.dtype == torch.float8_e4m3fn
    if fp8 and (x_scale is None or w_scale is None or out_dtype is None):
        raise ValueError("an FP8 bounded_linear needs x_scale, w_scale and out_dtype")
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(
            f"bounded_linear takes x [M, K] and weight [N, K], got {tuple(x.shape)} and {tuple(weight.shape)}"
        )
    if programs < 1:
        raise ValueError(f"programs must be at least 1, got {programs}")
    x, weight = x.contiguous(), weight.contiguous()
    rows, depth = x.shape
    cols = weight.shape[0]
    out = torch.empty((rows, cols), dtype=out_dtype or x.dtype, device=x.device)
    if rows == 0:
        return out
    t = tiles or gemm_tiles(rows, cols, fp8)
    num_tiles = -(-rows // t.block_m) * -(-cols // t.block_n)
    grid = (min(programs, num_tiles),)
    scales = (x_scale, w_scale) if fp8 else (out, out)  # unused pointers when not FP8
    shape = dict(
        FP8=fp8, DOT_F32=os.environ.get("TRITON_INTERPRET") == "1" and x.dtype == torch.bfloat16,
        BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k, GROUP_M=t.group_m,
        num_warps=t.num_warps, num_stages=t.num_stages,
    )  # fmt: skip
    if tma:
        if depth * x.element_size() % 16:
            raise ValueError(
                f"a TMA bounded_linear needs K x element size a multiple of 16 bytes, got K={depth}"
            )
        from triton.tools.tensor_descriptor import TensorDescriptor

        x_desc = TensorDescriptor.from_tensor(x, [t.block_m, t.block_k])
        w_desc = TensorDescriptor.from_tensor(weight, [t.block_n, t.block_k])
        bounded_gemm_triton.bounded_gemm_tma_kernel[grid](
            x_desc, scales[0], w_desc, scales[1], out, rows, cols, depth, out.stride(0), **shape
        )
        return out
    bounded_gemm_triton.bounded_gemm_kernel[grid](
        x, scales[0], weight, scales[1], out, rows, cols, depth, x.stride(0), weight.stride(0), out.stride(0),
        EVEN_K=depth % t.block_k == 0, **shape,
    )  # fmt: skip
    return out
