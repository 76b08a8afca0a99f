"""Fused ops for the decoder: one Triton kernel each on CUDA, the plain torch code elsewhere.

    rms_norm(x, w, eps)                  x [T, D] or [T, H, D] -> same shape
    add_rms_norm(x, residual, w, eps)    -> (norm(x + residual), x + residual)
    norm_rope(x, positions, cos, sin, w, eps)   [T, H, D] -> contiguous [T, H, D]
    silu_and_mul(x)                      [T, 2I] -> [T, I]
    act_and_mul(x, act)                  [T, 2I] -> [T, I], SiLU or tanh-GELU (GeGLU)
    quantize_fp8_rows(x)                 [T, K] -> Fp8Rows (e4m3 [T, K], fp32 scale [T])

``rms_norm``, ``add_rms_norm`` and ``silu_and_mul`` take ``fp8=True`` to return their output
quantized for an FP8 GEMM (worker.models.fp8): the same values, then ``quantize_fp8_rows``, in
one kernel on CUDA.

The torch paths are the reference semantics (HF's): norms in float32, cast to the model dtype
before the weight; rope in float32 on neox halves. ``triton_scope(False)`` (the engine setting
``triton = false``, entered by the engine around each of its passes) forces the torch paths
(ablation, debugging); with triton's own ``TRITON_INTERPRET=1`` the kernels run on CPU tensors
in its interpreter (tests/unit/test_kernels_interpret.py).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

# NOTE: the switch the kernels read; an engine sets it for the length of each of its passes
# (triton_scope), so two engines of one process with different settings never mix.
_ENABLED = [True]
FP8_MAX = 448.0  # the largest finite float8_e4m3fn value
_FP8_MIN_SCALE = 1e-12 / FP8_MAX  # an all-zero row gets this scale, not 0 (no division by 0)
_FP8_ROWS_TILE = 4096  # values a one-pass fp8_rows_kernel program holds (rows x block)


class Fp8Rows(NamedTuple):
    """Activations quantized per row for an FP8 GEMM: ``data * scale[:, None]`` ~ the values."""

    data: torch.Tensor  # float8_e4m3fn [T, K]
    scale: torch.Tensor  # float32 [T]


@contextlib.contextmanager
def triton_scope(enabled: bool) -> Iterator[None]:
    """Run the block with the fused kernels on or off, then restore the previous setting."""
    previous, _ENABLED[0] = _ENABLED[0], enabled
    try:
        yield
    finally:
        _ENABLED[0] = previous


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


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, *, fp8: bool = False) -> Any:
    """rms_norm_ref's values; with ``fp8`` (2-D x only) quantized per row as Fp8Rows."""
    k = _kernels_for(x)
    if k is None or x.stride(-1) != 1 or x.dim() not in (2, 3) or x.dtype != weight.dtype:
        out = rms_norm_ref(x, weight, eps)
        return quantize_fp8_rows_ref(out) if fp8 else out
    if fp8:
        return _norm_fp8(k, x, None, weight, eps)[0]
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rows, heads, sx_row, sx_head = _rows_heads(x)
    so_row, so_head = (out.stride(0), 0) if x.dim() == 2 else (out.stride(0), out.stride(1))
    n = x.shape[-1]
    k.rms_norm_kernel[(rows, heads)](
        x, x, out, out, weight, out, out, sx_row, sx_head, 0, so_row, so_head, n, eps,
        HAS_RES=False, QUANT=False, FP8_MAX=FP8_MAX, MIN_SCALE=_FP8_MIN_SCALE, BLOCK=triton_block(n),
    )  # fmt: skip
    return out


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, *, fp8: bool = False
) -> tuple[Any, torch.Tensor]:
    """(rms_norm(x + residual), x + residual) for [T, D] tensors; the sum rounds to x.dtype.
    With ``fp8`` the norm comes back quantized per row (Fp8Rows)."""
    k = _kernels_for(x)
    if (
        k is None
        or x.dim() != 2
        or x.stride(-1) != 1
        or not residual.is_contiguous()
        or x.dtype != weight.dtype
    ):
        total = residual + x
        out = rms_norm_ref(total, weight, eps)
        return (quantize_fp8_rows_ref(out) if fp8 else out), total
    x = x.contiguous()
    if fp8:
        rows, total = _norm_fp8(k, x, residual, weight, eps)
        return rows, total
    total = torch.empty_like(residual)
    out = torch.empty_like(residual)
    n = x.shape[-1]
    k.rms_norm_kernel[(x.shape[0], 1)](
        x, residual, out, total, weight, out, out, x.stride(0), 0, residual.stride(0), out.stride(0), 0,
        n, eps, HAS_RES=True, QUANT=False, FP8_MAX=FP8_MAX, MIN_SCALE=_FP8_MIN_SCALE, BLOCK=triton_block(n),
    )  # fmt: skip
    return out, total


def _norm_fp8(
    k: Any, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[Fp8Rows, torch.Tensor]:
    """One kernel: the norm of x (+ residual) quantized per row, and the sum when residual is given."""
    rows, n = x.shape
    data = torch.empty((rows, n), dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty(rows, dtype=torch.float32, device=x.device)
    has_res = residual is not None
    total = torch.empty_like(x) if has_res else x
    res = residual if residual is not None else x
    k.rms_norm_kernel[(rows, 1)](
        x, res, data, total, weight, data, scale, x.stride(0), 0, res.stride(0), n, 0, n, eps,
        HAS_RES=has_res, QUANT=True, FP8_MAX=FP8_MAX, MIN_SCALE=_FP8_MIN_SCALE, BLOCK=triton_block(n),
    )  # fmt: skip
    return Fp8Rows(data, scale), total


def quantize_fp8_rows_ref(x: torch.Tensor) -> Fp8Rows:
    """Per row: scale = max|x| / 448 (at least _FP8_MIN_SCALE), data = x / scale rounded to e4m3
    (nearest even, saturated). The reference for the kernels and the CPU emulation of FP8 GEMMs."""
    x32 = x.float()
    scale = (x32.abs().amax(dim=-1) / FP8_MAX).clamp_(min=_FP8_MIN_SCALE)
    data = (x32 / scale[:, None]).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return Fp8Rows(data, scale)


def quantize_fp8_rows(x: torch.Tensor) -> Fp8Rows:
    """x [T, K] (model dtype) quantized per row for an FP8 GEMM (quantize_fp8_rows_ref's values)."""
    k = _kernels_for(x)
    if k is None or x.dim() != 2 or x.stride(-1) != 1:
        return quantize_fp8_rows_ref(x)
    return _fp8_rows(k, x, x.shape[1], act=None)


def _fp8_rows(k: Any, x: torch.Tensor, n: int, *, act: str | None, two_pass: bool = False) -> Fp8Rows:
    """fp8_rows_kernel over x's rows: x itself (n columns, act None), or act_and_mul(x, act)
    (x has 2n). Rows of at most 4,096 values are read once, several a program (MoE
    intermediates of 768: four); longer ones twice, one a program (every row with
    ``two_pass``: the schedule benchmarks/fp8_rows.py compares against)."""
    rows = x.shape[0]
    data = torch.empty((rows, n), dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty(rows, dtype=torch.float32, device=x.device)
    block = min(_FP8_ROWS_TILE, triton_block(n))
    one_pass = n <= block and not two_pass
    per_program = max(1, min(16, _FP8_ROWS_TILE // block)) if one_pass else 1
    if rows:
        k.fp8_rows_kernel[(-(-rows // per_program),)](
            x, data, scale, x.stride(0), rows, n, GATED=act is not None, GELU=act == "gelu_pytorch_tanh",
            FP8_MAX=FP8_MAX, MIN_SCALE=_FP8_MIN_SCALE, BLOCK=block, ROWS=per_program, ONE_PASS=one_pass,
        )  # fmt: skip
    return Fp8Rows(data, scale)


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


GATED_ACTIVATIONS = ("silu", "gelu_pytorch_tanh")  # HF's hidden_act names


def silu_and_mul(x: torch.Tensor, *, fp8: bool = False) -> Any:
    """silu(x[:, :I]) * x[:, I:] for x [T, 2I]; with ``fp8`` quantized per row (Fp8Rows)."""
    return act_and_mul(x, "silu", fp8=fp8)


def act_and_mul(x: torch.Tensor, act: str, *, fp8: bool = False) -> Any:
    """act(x[:, :I]) * x[:, I:] for x [T, 2I], act one of GATED_ACTIVATIONS (SiLU: SwiGLU;
    "gelu_pytorch_tanh": GeGLU, the tanh approximation); with ``fp8`` quantized per row."""
    if act not in GATED_ACTIVATIONS:
        raise ValueError(f"gated activation {act!r}: expected one of {GATED_ACTIVATIONS}")
    k = _kernels_for(x)
    if k is None or x.dim() != 2 or x.stride(-1) != 1:
        gate, up = x.chunk(2, dim=-1)
        out = (F.silu(gate) if act == "silu" else F.gelu(gate, approximate="tanh")) * up
        return quantize_fp8_rows_ref(out) if fp8 else out
    n = x.shape[-1] // 2
    if fp8:
        return _fp8_rows(k, x, n, act=act)
    out = torch.empty((x.shape[0], n), dtype=x.dtype, device=x.device)
    block = min(1024, triton_block(n))
    k.act_and_mul_kernel[(x.shape[0], -(-n // block))](
        x, out, x.stride(0), out.stride(0), n, GELU=act != "silu", BLOCK=block
    )
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
    new_k: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """One kernel for a layer's qkv [T, (Hq + 2 Hkv) * D]: q = rope(norm(q)) returned as a
    contiguous [T, Hq, D]; rope(norm(k)) and v written to the layer's KV pages
    ([num_pages, Hkv, page_size, D], worker.kvcache.pool) at out_loc, divided by k_scale
    and v_scale when the pages are FP8. With ``new_k`` ([T, Hkv, D] in qkv's dtype, heads
    contiguous) rope(norm(k)) is also written there as computed, before any FP8 rounding (the
    pass's own keys for an attention that reads them unrounded; v needs no copy: it is
    qkv's last Hkv * D columns). None when it cannot run here: the caller takes the unfused
    path."""
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
        and (
            new_k is None
            or (
                new_k.shape == (qkv.shape[0], num_kv_heads, head_dim)
                and new_k.dtype == qkv.dtype
                and new_k.stride()[1:] == (head_dim, 1)
            )
        )
    )
    if not usable:
        return None
    rows = qkv.shape[0]
    q = torch.empty((rows, num_q_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    if rows:
        stride_page, stride_head, stride_tok = k_buffer.stride()[:3]
        k.qk_norm_rope_store_kernel[(rows,)](
            qkv, q, k_buffer, v_buffer, q if new_k is None else new_k,
            qkv if q_weight is None else q_weight, qkv if k_weight is None else k_weight,
            positions, out_loc, cos_cache, sin_cache,
            qkv.stride(0), q.stride(0), 0 if new_k is None else new_k.stride(0),
            stride_page, stride_head, stride_tok, k_buffer.shape[2],
            cos_cache.stride(0), eps, 1.0 / k_scale, 1.0 / v_scale,
            NUM_Q_HEADS=num_q_heads, NUM_KV_HEADS=num_kv_heads, HAS_NORM=q_weight is not None, HALF=half,
            HEADS_PAD=triton_block(num_q_heads + num_kv_heads), KV_HEADS_PAD=triton_block(num_kv_heads),
            FP8_MAX=torch.finfo(k_buffer.dtype).max if k_buffer.dtype == torch.float8_e4m3fn else 0.0,
            STORE_NEW_K=new_k is not None,
        )  # fmt: skip
    return q
