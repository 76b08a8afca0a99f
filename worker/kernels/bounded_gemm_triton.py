"""The Triton kernel behind worker.kernels.bounded_gemm (imported lazily, on CUDA or under
TRITON_INTERPRET=1): a persistent GEMM whose grid is the number of SMs it may hold.

Each program walks the output tiles ``pid, pid + P, pid + 2P, ...`` (P programs in all), so the
GEMM occupies at most P SMs however large it is, and the rest of the GPU stays free for a
kernel on another stream (issue 31 item 2: a decode step's attention beside its GEMMs). Tiles
are numbered column block by column block, the row blocks of one column block together
(GROUP_M of them), so a weight tile read from HBM is reused from L2 by the rows' blocks.

FP8: x is e4m3 with one float32 scale per row, w e4m3 with one per output row (worker.models.fp8's
layout); each BLOCK_K step's product is added to a float32 accumulator (``acc += dot``: Hopper's
FP8 tensor cores keep ~13 bits of the sum, see moe_triton's docstring), the scales applied once
at the end, as ``torch._scaled_mm`` with row-wise scales computes it.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _tile_of(tile, num_m, num_n, GROUP_M: tl.constexpr):
    """(row block, column block) of output tile ``tile``: GROUP_M row blocks per column block."""
    per_group = GROUP_M * num_n
    first_m = tile // per_group * GROUP_M
    group_rows = tl.minimum(num_m - first_m, GROUP_M)
    return first_m + tile % per_group % group_rows, tile % per_group // group_rows


@triton.jit
def _accumulate(acc, a, b, FP8: tl.constexpr, DOT_F32: tl.constexpr):
    """acc + a . b: FP8 products added in float32 (not folded into the tensor core's sum);
    DOT_F32: bf16 operands widened first (triton's interpreter multiplies bf16 wrongly)."""
    if FP8:
        acc += tl.dot(a, b)
    elif DOT_F32:
        acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    else:
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def _store(acc, x_scale_ptr, w_scale_ptr, out_ptr, pid_m, pid_n, rows, cols, stride_out, FP8: tl.constexpr):
    """Tile (pid_m, pid_n) of the output, its rows and columns inside it, scaled by
    x_scale[m] w_scale[n] when FP8."""
    ms = pid_m * acc.shape[0] + tl.arange(0, acc.shape[0])
    ns = pid_n * acc.shape[1] + tl.arange(0, acc.shape[1])
    in_m, in_n = ms < rows, ns < cols
    if FP8:
        acc = acc * tl.load(x_scale_ptr + ms, mask=in_m, other=0.0)[:, None]
        acc = acc * tl.load(w_scale_ptr + ns, mask=in_n, other=0.0)[None, :]
    out_ptrs = out_ptr + ms.to(tl.int64)[:, None] * stride_out + ns[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=in_m[:, None] & in_n[None, :])


@triton.jit(do_not_specialize=["rows"])
def bounded_gemm_kernel(
    x_ptr, x_scale_ptr, w_ptr, w_scale_ptr, out_ptr, rows, cols, depth, stride_x, stride_w, stride_out,
    FP8: tl.constexpr, DOT_F32: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """out[m, n] = sum_k x[m, k] w[n, k] (times x_scale[m] w_scale[n] when FP8) for every tile
    this program owns; x [rows, depth], w [cols, depth], out [rows, cols], unit last strides.
    DOT_F32: bf16 operands widened to float32 (triton's interpreter multiplies bf16 wrongly)."""
    num_m = tl.cdiv(rows, BLOCK_M)
    num_n = tl.cdiv(cols, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    for tile in range(tl.program_id(0), num_m * num_n, tl.num_programs(0)):
        pid_m, pid_n = _tile_of(tile, num_m, num_n, GROUP_M)
        ms = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        ns = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        in_m = ms < rows
        wrapped = ns % cols  # in-bounds loads for the last column block; its stores are masked
        a_ptrs = x_ptr + ms.to(tl.int64)[:, None] * stride_x + ks[None, :]
        b_ptrs = w_ptr + wrapped.to(tl.int64)[None, :] * stride_w + ks[:, None]  # [K, N]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, depth, BLOCK_K):
            if EVEN_K:
                a = tl.load(a_ptrs, mask=in_m[:, None], other=0.0)
                b = tl.load(b_ptrs)
            else:
                in_k = ks < depth - k0
                a = tl.load(a_ptrs, mask=in_m[:, None] & in_k[None, :], other=0.0)
                b = tl.load(b_ptrs, mask=in_k[:, None], other=0.0)
            acc = _accumulate(acc, a, b, FP8, DOT_F32)
            a_ptrs += BLOCK_K
            b_ptrs += BLOCK_K
        _store(acc, x_scale_ptr, w_scale_ptr, out_ptr, pid_m, pid_n, rows, cols, stride_out, FP8)


@triton.jit(do_not_specialize=["rows"])
def bounded_gemm_tma_kernel(
    x_desc, x_scale_ptr, w_desc, w_scale_ptr, out_ptr, rows, cols, depth, stride_out,
    FP8: tl.constexpr, DOT_F32: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """bounded_gemm_kernel's product with both operands read by the tensor memory accelerator
    (host-built descriptors of x [rows, depth] and w [cols, depth], blocks [BLOCK_M, BLOCK_K]
    and [BLOCK_N, BLOCK_K]; reads past an edge are zeros), the epilogue as there."""
    num_m = tl.cdiv(rows, BLOCK_M)
    num_n = tl.cdiv(cols, BLOCK_N)
    for tile in range(tl.program_id(0), num_m * num_n, tl.num_programs(0)):
        pid_m, pid_n = _tile_of(tile, num_m, num_n, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, depth, BLOCK_K):
            a = x_desc.load([pid_m * BLOCK_M, k0])
            b = w_desc.load([pid_n * BLOCK_N, k0]).T
            acc = _accumulate(acc, a, b, FP8, DOT_F32)
        _store(acc, x_scale_ptr, w_scale_ptr, out_ptr, pid_m, pid_n, rows, cols, stride_out, FP8)
