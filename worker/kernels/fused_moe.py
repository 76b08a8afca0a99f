"""The fused Mixture-of-Experts kernel: routed tokens through their experts' gated MLPs.

    fused_route(router_logits [T, E], top_k, renormalize) -> (topk_weights, topk_ids)
        worker.kernels.moe.route's values in one kernel (softmax, top-k, renormalization)
    fused_moe(x, w13, w2, topk_weights, topk_ids, *, w13_scale=None, w2_scale=None) -> [T, H]

    x             [T, H]      model dtype (bf16 on the GPU)
    w13           [E, 2I, H]  rows 0..I-1 the gate projection, I..2I-1 the up projection
    w2            [E, H, I]   the down projection
    topk_weights  [T, k]      float32, the routing weights
    topk_ids      [T, k]      int32 (int64 is converted), the experts; ids outside [0, E) add nothing
    out[t] = sum_j topk_weights[t, j] * down_e(silu(gate_e(x[t])) * up_e(x[t])), e = topk_ids[t, j]

FP8 (w13 and w2 in float8_e4m3fn): ``w13_scale`` [E, 2I] and ``w2_scale`` [E, H] float32, one
scale per output channel (as worker.models.fp8.Fp8Linear); the activations are quantized per
row before each GEMM (``max|row| / 448``, worker.kernels.ops.quantize_fp8_rows). ``fp8_sums``
(FP8_SUMS) picks the gate/up GEMM's arithmetic: ``exact`` multiplies the e4m3 values in fp16
(exact products, float32 sums: within bf16 rounding of the float32 expert loop), ``tile`` in
the FP8 tensor cores with the sum moved to float32 every K tile, ``fast`` with the whole sum in
their ~13-bit accumulator (faster prefill; both 2-4e-2 off the loop, about as far from float64
as the loop: moe_triton's module docstring). The down GEMM multiplies in e4m3 with its sum
moved to float32 every K tile in every mode.

Steps (worker.kernels.moe_triton draws the layout): the align kernels sort the T*k entries by
expert into runs padded to the tile's ``block_m``, inside buffers sized by a static bound, on the
GPU with no host sync; the gate/up GEMM writes silu(gate) * up per entry (the SiLU-mul fused in
its epilogue); FP8 quantizes that per entry; the down GEMM multiplies by the routing weight in
its epilogue; a last kernel sums each token's k rows. Nothing depends on values on the host, so
the whole call can be captured in a CUDA graph (after one eager call has compiled the kernels).
Runs on CUDA, or on CPU tensors under TRITON_INTERPRET=1 (the unit tests); a CPU engine uses a
plain loop over experts instead.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple, NoReturn

import torch

from worker.kernels.moe_tiles import FP8_SUMS, MoeTiles, moe_tiles, tile_kind
from worker.kernels.ops import quantize_fp8_rows, triton_block

_COUNT_CELLS = 4096  # entries x experts of one count/place program's one-hot tile
_SCAN_BLOCK = 1024
_SUM_BLOCK = 1024


class ExpertLayout(NamedTuple):
    """The entries sorted by expert (moe_triton's module docstring draws it)."""

    sorted_rows: torch.Tensor  # int32 [num_blocks * block_m]: entry index, or num_entries (padding)
    block_expert: torch.Tensor  # int32 [num_blocks]: the block's expert, -1 past the last one
    block_m: int

    @property
    def num_blocks(self) -> int:
        return self.block_expert.shape[0]


def _kernels() -> Any:
    from worker.kernels import moe_triton

    return moe_triton


def max_sorted_rows(num_entries: int, num_experts: int, block_m: int) -> int:
    """The static bound of the sorted layout: each expert that holds an entry (at most
    min(E, entries)) pads its run by at most block_m - 1 rows; whole blocks."""
    bound = num_entries + min(num_experts, num_entries) * (block_m - 1)
    return -(-bound // block_m) * block_m


def align_entries(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> ExpertLayout:
    """Lay the entries of ``topk_ids`` [T, k] (int32, contiguous) out by expert (three kernels)."""
    k = _kernels()
    ids = topk_ids.reshape(-1)
    num_entries = ids.numel()
    experts_pad = triton_block(num_experts)
    chunk = max(16, min(1024, _COUNT_CELLS // experts_pad))
    num_chunks = -(-num_entries // chunk)
    rows = max_sorted_rows(num_entries, num_experts, block_m)
    num_blocks = rows // block_m
    blocks_per_program = max(16, min(256, _COUNT_CELLS // max(experts_pad, block_m)))
    device = ids.device
    counts = torch.empty((num_experts, num_chunks), dtype=torch.int32, device=device)
    totals = torch.empty(num_experts, dtype=torch.int32, device=device)
    sorted_rows = torch.empty(rows, dtype=torch.int32, device=device)
    block_expert = torch.empty(num_blocks, dtype=torch.int32, device=device)
    common = dict(NUM_EXPERTS=num_experts, EXPERTS_PAD=experts_pad, CHUNK=chunk)
    k.moe_count_kernel[(num_chunks,)](ids, counts, num_entries, num_chunks, **common)
    k.moe_scan_kernel[(num_experts,)](counts, totals, num_chunks, SCAN_BLOCK=_SCAN_BLOCK)
    programs = max(num_chunks, -(-num_blocks // blocks_per_program))
    k.moe_place_kernel[(programs,)](
        ids, counts, totals, sorted_rows, block_expert, num_entries, num_chunks, num_blocks,
        BLOCK_M=block_m, BLOCKS_PER_PROGRAM=blocks_per_program, **common,
    )  # fmt: skip
    return ExpertLayout(sorted_rows, block_expert, block_m)


def fused_route(
    router_logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_weights float32 [T, k], topk_ids int32 [T, k]) of logits [T, E] (unit last stride):
    one kernel where the torch route launches six (cast, softmax, top-k, sum, divide, id cast)."""
    num_tokens, num_experts = router_logits.shape
    if router_logits.stride(-1) != 1 or not 0 < top_k <= num_experts:
        raise ValueError(
            f"fused_route: logits {tuple(router_logits.shape)} with unit last stride, top_k in [1, E]"
        )
    weights = torch.empty((num_tokens, top_k), dtype=torch.float32, device=router_logits.device)
    ids = torch.empty((num_tokens, top_k), dtype=torch.int32, device=router_logits.device)
    if num_tokens:
        _kernels().moe_route_kernel[(num_tokens,)](
            router_logits, weights, ids, router_logits.stride(0), NUM_EXPERTS=num_experts,
            EXPERTS_PAD=triton_block(num_experts), TOP_K=top_k, K_PAD=triton_block(top_k), RENORMALIZE=renormalize,
        )  # fmt: skip
    return weights, ids


def fused_moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
    tiles: MoeTiles | None = None,
    fp8_sums: str = "exact",
) -> torch.Tensor:
    """The routed experts' output [T, H] in x's dtype (module docstring); ``tiles`` overrides
    the launch configuration worker.kernels.moe_tiles picks; ``fp8_sums`` (FP8_SUMS; FP8
    experts only) the gate/up GEMM's arithmetic (benchmarks/moe_kernel.py's ``triton``,
    ``triton-tile``, ``triton-fast``)."""
    num_tokens, hidden, num_experts, inter, top_k, fp8 = _check(
        x, w13, w2, topk_weights, topk_ids, w13_scale, w2_scale
    )
    if fp8_sums not in FP8_SUMS:
        raise ValueError(f"fused_moe: fp8_sums={fp8_sums!r}, expected one of {list(FP8_SUMS)}")
    out = torch.empty((num_tokens, hidden), dtype=x.dtype, device=x.device)
    if num_tokens == 0:
        return out
    num_entries = num_tokens * top_k
    tiles = tiles or moe_tiles(num_experts, hidden, inter, num_entries, tile_kind(fp8, fp8_sums))
    ids = topk_ids.to(torch.int32).contiguous()
    weights = topk_weights.contiguous().reshape(-1)
    layout = align_entries(ids, num_experts, tiles.block_m)
    k = _kernels()
    # NOTE: triton's interpreter multiplies bf16 operands wrongly (its tl.dot, 3.9); they are
    # widened to float32 there, which changes nothing but the speed.
    dot_f32 = os.environ.get("TRITON_INTERPRET") == "1" and x.dtype == torch.bfloat16
    if fp8:
        rows = quantize_fp8_rows(x)
        a, a_scale = rows.data, rows.scale
    else:
        a, a_scale = x, x  # a_scale unused
    launch = dict(num_warps=tiles.num_warps, num_stages=tiles.num_stages)
    act = torch.empty((num_entries, inter), dtype=x.dtype, device=x.device)
    n_blocks = -(-inter // tiles.gate_up_n)
    k.moe_gate_up_kernel[(layout.num_blocks * n_blocks,)](
        a, a_scale, w13, w13_scale if fp8 else w13, act, layout.sorted_rows, layout.block_expert,
        num_entries, hidden, inter, a.stride(0), w13.stride(0), w13.stride(1),
        w13_scale.stride(0) if w13_scale is not None else 0, act.stride(0), layout.num_blocks, n_blocks,
        TOP_K=top_k, FP8=fp8, FP8_SUMS=FP8_SUMS.index(fp8_sums), DOT_F32=dot_f32, EVEN_K=hidden % tiles.block_k == 0,
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.gate_up_n, BLOCK_K=tiles.block_k, GROUP_M=tiles.group_m, SWAP_AB=tiles.swap_ab, **launch,
    )  # fmt: skip
    if fp8:
        rows = quantize_fp8_rows(act)
        b, b_scale = rows.data, rows.scale
    else:
        b, b_scale = act, act
    parts = torch.empty((num_entries, hidden), dtype=x.dtype, device=x.device)
    n_blocks = -(-hidden // tiles.down_n)
    k.moe_down_kernel[(layout.num_blocks * n_blocks,)](
        b, b_scale, w2, w2_scale if fp8 else w2, weights, parts, layout.sorted_rows, layout.block_expert,
        num_entries, inter, hidden, b.stride(0), w2.stride(0), w2.stride(1),
        w2_scale.stride(0) if w2_scale is not None else 0, parts.stride(0), layout.num_blocks, n_blocks,
        FP8=fp8, DOT_F32=dot_f32, EVEN_K=inter % tiles.block_k == 0,
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.down_n, BLOCK_K=tiles.block_k, GROUP_M=tiles.group_m, SWAP_AB=tiles.swap_ab, **launch,
    )  # fmt: skip
    block = min(_SUM_BLOCK, triton_block(hidden))
    k.moe_sum_kernel[(num_tokens, -(-hidden // block))](
        parts, ids, out, hidden, parts.stride(0), out.stride(0),
        NUM_EXPERTS=num_experts, TOP_K=top_k, BLOCK=block,
    )  # fmt: skip
    return out


def _check(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w13_scale: torch.Tensor | None,
    w2_scale: torch.Tensor | None,
) -> tuple[int, int, int, int, int, bool]:
    """(T, H, E, I, k, fp8) of a valid call; a ValueError naming the argument otherwise."""

    def fail(why: str) -> NoReturn:
        raise ValueError(f"fused_moe: {why}")

    if x.dim() != 2 or x.stride(-1) != 1:
        fail(f"x must be [T, H] with unit last stride, got shape {tuple(x.shape)} strides {x.stride()}")
    num_tokens, hidden = x.shape
    if w13.dim() != 3 or w13.shape[1] % 2 or w13.shape[2] != hidden:
        fail(f"w13 must be [E, 2I, H={hidden}], got {tuple(w13.shape)}")
    num_experts, inter = w13.shape[0], w13.shape[1] // 2
    if tuple(w2.shape) != (num_experts, hidden, inter):
        fail(f"w2 must be [E={num_experts}, H={hidden}, I={inter}], got {tuple(w2.shape)}")
    if not (w13.is_contiguous() and w2.is_contiguous()):
        fail("w13 and w2 must be contiguous")
    if (
        topk_ids.dim() != 2
        or topk_ids.shape[0] != num_tokens
        or topk_ids.dtype not in (torch.int32, torch.int64)
    ):
        fail(f"topk_ids must be int32 [T={num_tokens}, k], got {topk_ids.dtype} {tuple(topk_ids.shape)}")
    if topk_weights.shape != topk_ids.shape or topk_weights.dtype != torch.float32:
        fail(
            f"topk_weights must be float32 {tuple(topk_ids.shape)}, got {topk_weights.dtype} {tuple(topk_weights.shape)}"
        )
    fp8 = w13.dtype == torch.float8_e4m3fn
    if fp8 != (w2.dtype == torch.float8_e4m3fn):
        fail(f"w13 ({w13.dtype}) and w2 ({w2.dtype}) must both be float8_e4m3fn or neither")
    if fp8:
        if w13_scale is None or w2_scale is None:
            fail("FP8 experts need w13_scale [E, 2I] and w2_scale [E, H]")
        for name, scale, shape in (
            ("w13_scale", w13_scale, (num_experts, 2 * inter)),
            ("w2_scale", w2_scale, (num_experts, hidden)),
        ):
            if tuple(scale.shape) != shape or scale.dtype != torch.float32 or not scale.is_contiguous():
                fail(f"{name} must be contiguous float32 {shape}, got {scale.dtype} {tuple(scale.shape)}")
    elif w13.dtype != x.dtype or w2.dtype != x.dtype:
        fail(f"w13 ({w13.dtype}) and w2 ({w2.dtype}) must be x's dtype ({x.dtype}) or float8_e4m3fn")
    devices = {t.device for t in (x, w13, w2, topk_weights, topk_ids)}
    if len(devices) != 1:
        fail(f"all tensors must be on one device, got {sorted(map(str, devices))}")
    if not x.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        fail("runs on CUDA tensors (or on CPU under TRITON_INTERPRET=1); a CPU engine loops over experts")
    return num_tokens, hidden, num_experts, inter, topk_ids.shape[1], fp8
