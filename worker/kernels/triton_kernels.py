"""Triton kernels behind worker.kernels.ops (imported only on CUDA, lazily).

Each kernel reproduces the rounding of the torch code it replaces: intermediates that torch
materialises in the model dtype are rounded to it here too, so CUDA results match the
fallback up to the order of float32 summation.
"""

from __future__ import annotations

import triton
import triton.language as tl


def _jit_any_alignment(*pointers: str):
    """triton.jit, compiled once whatever the 16-byte alignment of these pointer arguments.

    Per-row parameters and token metadata arrive as views into the scheduler's packed
    buffers, whose alignment changes with the batch size; left to Triton, each new
    alignment would compile another specialisation (~0.2 s) in the middle of a run.
    """
    try:
        return triton.jit(do_not_specialize_on_alignment=list(pointers))
    except TypeError:  # a Triton without the option: no value specialisation at all
        return triton.jit(do_not_specialize=list(pointers))


@triton.jit
def rms_norm_kernel(
    x_ptr,
    res_ptr,
    out_ptr,
    res_out_ptr,
    w_ptr,
    q_ptr,
    scale_ptr,
    stride_x_row,
    stride_x_head,
    stride_res_row,
    stride_out_row,
    stride_out_head,
    n_cols,
    eps,
    HAS_RES: tl.constexpr,
    QUANT: tl.constexpr,
    FP8_MAX: tl.constexpr,
    MIN_SCALE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """out[r, h] = norm(x[r, h] (+ res[r])) * w; with HAS_RES also res_out[r] = x[r] + res[r].
    QUANT (2-D rows): the output goes to q[r] as e4m3 / scale[r] instead, scale[r] = max|out[r]| /
    FP8_MAX (at least MIN_SCALE), as worker.kernels.ops.quantize_fp8_rows_ref rounds it."""
    row = tl.program_id(0)
    head = tl.program_id(1)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x_row + head * stride_x_head + cols, mask=mask, other=0.0)
    dtype = x.dtype
    x32 = x.to(tl.float32)
    if HAS_RES:
        r = tl.load(res_ptr + row * stride_res_row + cols, mask=mask, other=0.0)
        s = (x32 + r.to(tl.float32)).to(dtype)
        tl.store(res_out_ptr + row * stride_res_row + cols, s, mask=mask)
        x32 = s.to(tl.float32)
    var = tl.sum(x32 * x32, axis=0) / n_cols
    rstd = 1.0 / tl.sqrt(var + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = ((x32 * rstd).to(dtype).to(tl.float32) * w).to(dtype)
    if QUANT:
        y32 = tl.where(mask, y.to(tl.float32), 0.0)
        scale = tl.maximum(tl.max(tl.abs(y32), axis=0) / FP8_MAX, MIN_SCALE)
        q = tl.clamp(y32 / scale, -FP8_MAX, FP8_MAX)
        tl.store(q_ptr + row * stride_out_row + cols, q.to(q_ptr.dtype.element_ty), mask=mask)
        tl.store(scale_ptr + row, scale)
    else:
        tl.store(out_ptr + row * stride_out_row + head * stride_out_head + cols, y, mask=mask)


@triton.jit
def _gate_act(g, GELU: tl.constexpr):
    """silu(g), or with GELU the tanh approximation of gelu(g) (torch's approximate="tanh"),
    on float32 values."""
    if GELU:
        inner = 0.7978845608028654 * (g + 0.044715 * g * g * g)  # sqrt(2 / pi) * (g + 0.044715 g^3)
        return 0.5 * g * (2.0 / (1.0 + tl.exp(-2.0 * inner)))  # 1 + tanh(z) = 2 / (1 + e^-2z)
    return g / (1.0 + tl.exp(-g))


@triton.jit
def _fp8_row_values(x_ptr, stride_x_row, row, cols, mask, n_cols, GATED: tl.constexpr, GELU: tl.constexpr):
    """Row ``row``'s values at ``cols`` in float32: x itself, or act(gate) * up rounded as
    act_and_mul_kernel rounds it (gate = x[:, :n], up = x[:, n:2n]; act SiLU, or GELU-tanh).
    ``row`` may be a column of row indices and ``cols`` a row of columns (a tile of rows)."""
    base = x_ptr + row * stride_x_row
    x = tl.load(base + cols, mask=mask, other=0.0)
    if GATED:
        up = tl.load(base + n_cols + cols, mask=mask, other=0.0)
        dtype = x.dtype
        act = _gate_act(x.to(tl.float32), GELU).to(dtype).to(tl.float32)
        return tl.where(mask, (act * up.to(tl.float32)).to(dtype).to(tl.float32), 0.0)
    return tl.where(mask, x.to(tl.float32), 0.0)


@triton.jit
def fp8_rows_kernel(
    x_ptr,
    q_ptr,
    scale_ptr,
    stride_x_row,
    n_rows,
    n_cols,
    GATED: tl.constexpr,
    GELU: tl.constexpr,
    FP8_MAX: tl.constexpr,
    MIN_SCALE: tl.constexpr,
    BLOCK: tl.constexpr,
    ROWS: tl.constexpr,
    ONE_PASS: tl.constexpr,
):
    """Rows of x (or of act_and_mul(x) with GATED) to e4m3 in q ([n_rows, n_cols], contiguous)
    with scale[r] = max|row r| / FP8_MAX (at least MIN_SCALE). ONE_PASS (a row fits one BLOCK):
    program p takes rows p * ROWS .. p * ROWS + ROWS - 1 and reads each value once; otherwise
    (ROWS 1) program r reads row r twice, for its maximum, then for the quantized values."""
    if ONE_PASS:
        first = tl.program_id(0) * ROWS
        rows = first + tl.arange(0, ROWS)
        cols = tl.arange(0, BLOCK)
        mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
        y = _fp8_row_values(x_ptr, stride_x_row, rows[:, None], cols[None, :], mask, n_cols, GATED, GELU)
        scales = tl.maximum(tl.max(tl.abs(y), axis=1) / FP8_MAX, MIN_SCALE)
        q = tl.clamp(y / scales[:, None], -FP8_MAX, FP8_MAX)
        tl.store(q_ptr + rows[:, None] * n_cols + cols[None, :], q.to(q_ptr.dtype.element_ty), mask=mask)
        tl.store(scale_ptr + rows, scales, mask=rows < n_rows)
    else:
        row = tl.program_id(0)
        amax = tl.zeros((), dtype=tl.float32)
        for off in range(0, n_cols, BLOCK):
            cols = off + tl.arange(0, BLOCK)
            mask = cols < n_cols
            y = _fp8_row_values(x_ptr, stride_x_row, row, cols, mask, n_cols, GATED, GELU)
            amax = tl.maximum(amax, tl.max(tl.abs(y), axis=0))
        scale = tl.maximum(amax / FP8_MAX, MIN_SCALE)
        for off in range(0, n_cols, BLOCK):
            cols = off + tl.arange(0, BLOCK)
            mask = cols < n_cols
            y = _fp8_row_values(x_ptr, stride_x_row, row, cols, mask, n_cols, GATED, GELU)
            q = tl.clamp(y / scale, -FP8_MAX, FP8_MAX)
            tl.store(q_ptr + row * n_cols + cols, q.to(q_ptr.dtype.element_ty), mask=mask)
        tl.store(scale_ptr + row, scale)


@_jit_any_alignment("pos_ptr")
def norm_rope_kernel(
    x_ptr,
    out_ptr,
    w_ptr,
    pos_ptr,
    cos_ptr,
    sin_ptr,
    stride_x_row,
    stride_x_head,
    stride_out_row,
    stride_out_head,
    stride_table_row,
    eps,
    HAS_NORM: tl.constexpr,
    HALF: tl.constexpr,
):
    """out[t, h] = rope(rms_norm(x[t, h]) if HAS_NORM else x[t, h]) at position pos[t] (neox halves)."""
    row = tl.program_id(0)
    head = tl.program_id(1)
    cols = tl.arange(0, HALF)
    base = x_ptr + row * stride_x_row + head * stride_x_head
    x1 = tl.load(base + cols)
    x2 = tl.load(base + HALF + cols)
    dtype = x1.dtype
    a = x1.to(tl.float32)
    b = x2.to(tl.float32)
    if HAS_NORM:
        var = (tl.sum(a * a, axis=0) + tl.sum(b * b, axis=0)) / (2 * HALF)
        rstd = 1.0 / tl.sqrt(var + eps)
        w1 = tl.load(w_ptr + cols).to(tl.float32)
        w2 = tl.load(w_ptr + HALF + cols).to(tl.float32)
        a = ((a * rstd).to(dtype).to(tl.float32) * w1).to(dtype).to(tl.float32)
        b = ((b * rstd).to(dtype).to(tl.float32) * w2).to(dtype).to(tl.float32)
    pos = tl.load(pos_ptr + row)
    cos = tl.load(cos_ptr + pos * stride_table_row + cols)
    sin = tl.load(sin_ptr + pos * stride_table_row + cols)
    out = out_ptr + row * stride_out_row + head * stride_out_head
    tl.store(out + cols, (a * cos - b * sin).to(dtype))
    tl.store(out + HALF + cols, (b * cos + a * sin).to(dtype))


@triton.jit
def act_and_mul_kernel(
    x_ptr, out_ptr, stride_x_row, stride_out_row, n_cols, GELU: tl.constexpr, BLOCK: tl.constexpr
):
    """out[r] = act(x[r, :n]) * x[r, n:2n], act SiLU (or GELU-tanh with GELU), rounding act to
    the dtype first (as torch does)."""
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    gate = tl.load(x_ptr + row * stride_x_row + cols, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * stride_x_row + n_cols + cols, mask=mask, other=0.0)
    dtype = gate.dtype
    act = _gate_act(gate.to(tl.float32), GELU).to(dtype).to(tl.float32)
    tl.store(out_ptr + row * stride_out_row + cols, (act * up.to(tl.float32)).to(dtype), mask=mask)


@_jit_any_alignment("pos_ptr", "out_loc_ptr")
def qk_norm_rope_store_kernel(
    qkv_ptr,
    q_out_ptr,
    k_cache_ptr,
    v_cache_ptr,
    k_new_ptr,
    q_w_ptr,
    k_w_ptr,
    pos_ptr,
    out_loc_ptr,
    cos_ptr,
    sin_ptr,
    stride_qkv_row,
    stride_q_out_row,
    stride_k_new_row,
    stride_cache_page,
    stride_cache_head,
    stride_cache_tok,
    page_size,
    stride_table_row,
    eps,
    k_inv_scale,
    v_inv_scale,
    NUM_Q_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HAS_NORM: tl.constexpr,
    HALF: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    KV_HEADS_PAD: tl.constexpr,
    FP8_MAX: tl.constexpr,
    STORE_NEW_K: tl.constexpr,
):
    """Program t, all heads of token t at once: q heads -> q_out[t]; k heads: rope(norm(k)) -> K
    and v -> V at location out_loc[t] (the pass's KV store). A location is token
    loc % page_size of page loc // page_size (strides in elements). An FP8 cache (FP8_MAX > 0)
    gets k * k_inv_scale and v * v_inv_scale, saturated at +-FP8_MAX (worker.kvcache.pool).
    STORE_NEW_K: rope(norm(k)) also goes to k_new[t] ([T, kv heads, head_dim], row stride
    stride_k_new_row) in qkv's dtype, as it was before the store scaled and rounded it."""
    row = tl.program_id(0)
    heads = tl.arange(0, HEADS_PAD)[:, None]  # q heads, then k heads (qkv's order), then padding
    cols = tl.arange(0, HALF)[None, :]
    is_q = heads < NUM_Q_HEADS
    is_k = (heads >= NUM_Q_HEADS) & (heads < NUM_Q_HEADS + NUM_KV_HEADS)
    valid = (is_q | is_k) & (cols < HALF)
    src = qkv_ptr + row * stride_qkv_row + heads * (2 * HALF)
    x1 = tl.load(src + cols, mask=valid, other=0.0)
    x2 = tl.load(src + HALF + cols, mask=valid, other=0.0)
    dtype = x1.dtype
    a = x1.to(tl.float32)
    b = x2.to(tl.float32)
    if HAS_NORM:
        var = (tl.sum(a * a, axis=1) + tl.sum(b * b, axis=1)) / (2 * HALF)
        rstd = (1.0 / tl.sqrt(var + eps))[:, None]
        w1 = tl.where(is_q, tl.load(q_w_ptr + cols), tl.load(k_w_ptr + cols)).to(tl.float32)
        w2 = tl.where(is_q, tl.load(q_w_ptr + HALF + cols), tl.load(k_w_ptr + HALF + cols)).to(tl.float32)
        a = ((a * rstd).to(dtype).to(tl.float32) * w1).to(dtype).to(tl.float32)
        b = ((b * rstd).to(dtype).to(tl.float32) * w2).to(dtype).to(tl.float32)
    pos = tl.load(pos_ptr + row)
    cos = tl.load(cos_ptr + pos * stride_table_row + cols)
    sin = tl.load(sin_ptr + pos * stride_table_row + cols)
    r1 = (a * cos - b * sin).to(dtype)
    r2 = (b * cos + a * sin).to(dtype)
    q_mask = is_q & (cols < HALF)
    q_dst = q_out_ptr + row * stride_q_out_row + heads * (2 * HALF)
    tl.store(q_dst + cols, r1, mask=q_mask)
    tl.store(q_dst + HALF + cols, r2, mask=q_mask)
    loc = tl.load(out_loc_ptr + row)
    slot = (loc // page_size) * stride_cache_page + (loc % page_size) * stride_cache_tok
    k_mask = is_k & (cols < HALF)
    k_dst = k_cache_ptr + slot + (heads - NUM_Q_HEADS) * stride_cache_head
    if STORE_NEW_K:
        k_new_dst = k_new_ptr + row * stride_k_new_row + (heads - NUM_Q_HEADS) * (2 * HALF)
        tl.store(k_new_dst + cols, r1, mask=k_mask)
        tl.store(k_new_dst + HALF + cols, r2, mask=k_mask)
    k1, k2 = r1, r2
    if FP8_MAX > 0:
        k1 = tl.clamp(r1.to(tl.float32) * k_inv_scale, -FP8_MAX, FP8_MAX)
        k2 = tl.clamp(r2.to(tl.float32) * k_inv_scale, -FP8_MAX, FP8_MAX)
    tl.store(k_dst + cols, k1.to(k_cache_ptr.dtype.element_ty), mask=k_mask)
    tl.store(k_dst + HALF + cols, k2.to(k_cache_ptr.dtype.element_ty), mask=k_mask)
    kv_heads = tl.arange(0, KV_HEADS_PAD)[:, None]
    dims = tl.arange(0, 2 * HALF)[None, :]
    v_mask = (kv_heads < NUM_KV_HEADS) & (dims < 2 * HALF)
    v_src = qkv_ptr + row * stride_qkv_row + (NUM_Q_HEADS + NUM_KV_HEADS + kv_heads) * (2 * HALF) + dims
    v = tl.load(v_src, mask=v_mask, other=0.0)
    if FP8_MAX > 0:
        v = tl.clamp(v.to(tl.float32) * v_inv_scale, -FP8_MAX, FP8_MAX)
    v_dst = v_cache_ptr + slot + kv_heads * stride_cache_head + dims
    tl.store(v_dst, v.to(v_cache_ptr.dtype.element_ty), mask=v_mask)
