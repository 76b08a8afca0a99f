"""Fused ops for the decoder: one Triton kernel each on CUDA, the plain torch code elsewhere.

    rms_norm(x, w, eps)                  x [T, D] or [T, H, D] -> same shape
    add_rms_norm(x, residual, w, eps)    -> (norm(x + residual), x + residual)
    norm_rope(x, positions, cos, sin, w, eps)   [T, H, D] -> contiguous [T, H, D]
    silu_and_mul(x)                      [T, 2I] -> [T, I]

The torch paths are the reference semantics (HF's): norms in float32, cast to the model dtype
before the weight; rope in float32 on neox halves. ``use_triton(False)`` (the engine setting
``triton = false``) forces the torch paths (ablation, debugging); with triton's own
``TRITON_INTERPRET=1`` the kernels run on CPU tensors in its interpreter
(tests/unit/test_kernels_interpret.py).
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch
import torch.nn.functional as F

_ENABLED = [True]  # NOTE: one switch per process, set by the engine from its config


def use_triton(enabled: bool) -> None:
    """Switch the fused kernels on or off for this process (the engine does, at start)."""
    _ENABLED[0] = enabled


@functools.cache
def _import_kernels() -> Any:
    try:
        from worker.kernels import triton_kernels
    except ImportError:
        return None
    return triton_kernels


def _triton() -> Any:
    """The kernels module, or None when Triton is unavailable or switched off."""
    return _import_kernels() if _ENABLED[0] else None


def _kernels_for(x: torch.Tensor) -> Any:
    if x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1":  # triton's own variable
        return _triton()
    return None


def _rows_heads(x: torch.Tensor) -> tuple[int, int, int, int]:
    """(rows, heads, row stride, head stride) of a [T, D] or [T, H, D] tensor with unit last stride."""
    if x.dim() == 2:
        return x.shape[0], 1, x.stride(0), 0
    return x.shape[0], x.shape[1], x.stride(0), x.stride(1)


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    k = _kernels_for(x)
    if k is None or x.stride(-1) != 1 or x.dim() not in (2, 3) or x.dtype != weight.dtype:
        return rms_norm_ref(x, weight, eps)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rows, heads, sx_row, sx_head = _rows_heads(x)
    so_row, so_head = (out.stride(0), 0) if x.dim() == 2 else (out.stride(0), out.stride(1))
    n = x.shape[-1]
    k.rms_norm_kernel[(rows, heads)](
        x, x, out, out, weight, sx_row, sx_head, 0, so_row, so_head, n, eps,
        HAS_RES=False, BLOCK=triton_block(n),
    )  # fmt: skip
    return out


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual) for [T, D] tensors; the sum rounds to x.dtype."""
    k = _kernels_for(x)
    if (
        k is None
        or x.dim() != 2
        or x.stride(-1) != 1
        or not residual.is_contiguous()
        or x.dtype != weight.dtype
    ):
        total = residual + x
        return rms_norm_ref(total, weight, eps), total
    x = x.contiguous()
    total = torch.empty_like(residual)
    out = torch.empty_like(residual)
    n = x.shape[-1]
    k.rms_norm_kernel[(x.shape[0], 1)](
        x, residual, out, total, weight, x.stride(0), 0, residual.stride(0), out.stride(0), 0, n, eps,
        HAS_RES=True, BLOCK=triton_block(n),
    )  # fmt: skip
    return out, total


def rope_ref(
    x: torch.Tensor, positions: torch.Tensor, cos_cache: torch.Tensor, sin_cache: torch.Tensor
) -> torch.Tensor:
    cos = cos_cache[positions].unsqueeze(1)
    sin = sin_cache[positions].unsqueeze(1)
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


def norm_rope(
    x: torch.Tensor,
    positions: torch.Tensor,
    cos_cache: torch.Tensor,
    sin_cache: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """rope(rms_norm(x, weight)) (norm skipped when weight is None) for x [T, H, D]."""
    k = _kernels_for(x)
    half = x.shape[-1] // 2
    usable = (
        k is not None
        and x.dim() == 3
        and x.stride(-1) == 1
        and half & (half - 1) == 0
        and cos_cache.is_contiguous()
        and sin_cache.is_contiguous()
        and (weight is None or weight.dtype == x.dtype)
    )
    if not usable:
        normed = x if weight is None else rms_norm_ref(x, weight, eps)
        return rope_ref(normed, positions, cos_cache, sin_cache)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    k.norm_rope_kernel[(x.shape[0], x.shape[1])](
        x, out, x if weight is None else weight, positions, cos_cache, sin_cache,
        x.stride(0), x.stride(1), out.stride(0), out.stride(1), cos_cache.stride(0), eps,
        HAS_NORM=weight is not None, HALF=half,
    )  # fmt: skip
    return out


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(x[:, :I]) * x[:, I:] for x [T, 2I]."""
    k = _kernels_for(x)
    if k is None or x.dim() != 2 or x.stride(-1) != 1:
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up
    n = x.shape[-1] // 2
    out = torch.empty((x.shape[0], n), dtype=x.dtype, device=x.device)
    block = min(1024, triton_block(n))
    k.silu_and_mul_kernel[(x.shape[0], -(-n // block))](x, out, x.stride(0), out.stride(0), n, BLOCK=block)
    return out


def triton_block(n: int) -> int:
    """The smallest power of two >= n."""
    return 1 << max(0, (n - 1).bit_length())


def qk_norm_rope_store(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos_cache: torch.Tensor,
    sin_cache: torch.Tensor,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    eps: float,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    out_loc: torch.Tensor,
    num_q_heads: int,
    num_kv_heads: int,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor | None:
    """One kernel for a layer's qkv [T, (Hq + 2 Hkv) * D]: q = rope(norm(q)) returned as a
    contiguous [T, Hq, D]; rope(norm(k)) and v written to the layer's KV pages
    ([num_pages, Hkv, page_size, D], worker.engine.kv_pool) at out_loc, divided by k_scale
    and v_scale when the pages are FP8. None when it cannot run here: the caller takes the
    unfused path."""
    k = _kernels_for(qkv)
    head_dim = k_buffer.shape[-1]
    half = head_dim // 2
    usable = (
        k is not None
        and qkv.dim() == 2
        and qkv.stride(-1) == 1
        and qkv.shape[1] == (num_q_heads + 2 * num_kv_heads) * head_dim
        and half & (half - 1) == 0
        and k_buffer.dim() == 4
        and k_buffer.dtype in (qkv.dtype, torch.float8_e4m3fn)
        and k_buffer.stride() == v_buffer.stride()
        and k_buffer.stride(-1) == 1
        and cos_cache.is_contiguous()
        and sin_cache.is_contiguous()
        and (q_weight is None or q_weight.dtype == qkv.dtype)
    )
    if not usable:
        return None
    rows = qkv.shape[0]
    q = torch.empty((rows, num_q_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    if rows:
        stride_page, stride_head, stride_tok = k_buffer.stride()[:3]
        k.qk_norm_rope_store_kernel[(rows,)](
            qkv, q, k_buffer, v_buffer,
            qkv if q_weight is None else q_weight, qkv if k_weight is None else k_weight,
            positions, out_loc, cos_cache, sin_cache,
            qkv.stride(0), q.stride(0), stride_page, stride_head, stride_tok, k_buffer.shape[2],
            cos_cache.stride(0), eps, 1.0 / k_scale, 1.0 / v_scale,
            NUM_Q_HEADS=num_q_heads, NUM_KV_HEADS=num_kv_heads, HAS_NORM=q_weight is not None, HALF=half,
            HEADS_PAD=triton_block(num_q_heads + num_kv_heads), KV_HEADS_PAD=triton_block(num_kv_heads),
            FP8_MAX=torch.finfo(k_buffer.dtype).max if k_buffer.dtype == torch.float8_e4m3fn else 0.0,
        )  # fmt: skip
    return q
