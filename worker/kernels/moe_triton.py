"""Triton kernels behind worker.kernels.fused_moe (imported lazily, on CUDA or under
TRITON_INTERPRET=1): the router's softmax and top-k in one kernel, then the layer's.

Entries are the flattened (token, slot) pairs of ``topk_ids`` [T, k]: entry ``r`` is token
``r // k``'s slot ``r % k``. The align kernels (count, scan, place) lay the entries out by
expert, each expert's run padded to a whole number of ``BLOCK_M`` rows:

    sorted rows   | e0 e0 e0 -- | e1 e1 e1 e1 | e1 -- -- -- | e3 -- -- -- | (unused) ...
    block_expert  |      0      |      1      |      1      |      3      |   -1 ...

``--`` is the sentinel ``num_entries`` (a padding row), ``-1`` a block past the last expert.
Within an expert, entries keep their order (no atomics: the layout, and so every result, is the
same run to run). The two grouped GEMMs then run one program per (row block, column block),
reading their expert from ``block_expert``; programs of unused blocks return at once, so the
grid may be sized by a static upper bound (CUDA-graph capturable, no host sync). Arguments that
change with the number of tokens are not specialised on (``do_not_specialize``): a new batch
size never compiles a kernel again in the middle of a run.

FP8 products, ``FP8_SUMS`` (fused_moe's ``fp8_sums``): Hopper's FP8 tensor cores (wgmma,
which Triton uses for tiles of 64 rows or more) keep about 13 bits of mantissa in their
accumulator and truncate, and Triton on sm90 never moves a float8 ``tl.dot``'s sum out of it by
default (``max_num_imprecise_acc`` 2**30); tiles under 64 rows use mma.sync, which has no FP8
form on sm90 and multiplies in fp16 instead (exact in every mode). ``EXACT`` (0): the gate/up
GEMM converts its e4m3 operands to fp16 (exact: every e4m3 value is an fp16 value) and
accumulates their exact products in float32, so its output, rounded to bf16 and quantized per
row again, is the float32 expert loop's to the last bit of each e4m3 rounding (sums off by 1e-4
to 2e-3 move 0.4-13% of the intermediate's elements across an e4m3 rounding midpoint, and some
rows' maximum with their scale: benchmarks/fp8_accumulation.py). ``TILE`` (1): e4m3 operands,
each BLOCK_K step's product added into a float32 accumulator (``acc += dot``, which Triton does
not fold into the dot for float8 operands). ``FAST`` (2): e4m3 operands with the whole K loop
in the tensor core's accumulator (vLLM's per-channel path). TILE and FAST are 2-4e-2 off the
exact loop from 1,024 tokens (each flipped element moves a whole e4m3 step) while their error
against float64 is within a few percent of the loop's own (benchmarks/moe_kernel.py
``--truth``). The down GEMM's output is not quantized again: it always keeps e4m3 operands
with its sum moved to float32 every BLOCK_K (one promotion per 64-256 products keeps it within
2e-4 of the exact sum even at K = 14,336; without: 1e-2).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["num_entries", "num_chunks"])
def moe_count_kernel(
    ids_ptr, counts_ptr, num_entries, num_chunks,
    NUM_EXPERTS: tl.constexpr, EXPERTS_PAD: tl.constexpr, CHUNK: tl.constexpr,
):  # fmt: skip
    """counts[e, c] = how many entries of chunk c (CHUNK entries) are routed to expert e."""
    chunk = tl.program_id(0)
    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    ids = tl.load(ids_ptr + offs, mask=offs < num_entries, other=-1)
    experts = tl.arange(0, EXPERTS_PAD)
    hits = (ids[:, None] == experts[None, :]).to(tl.int32)
    tl.store(counts_ptr + experts * num_chunks + chunk, tl.sum(hits, axis=0), mask=experts < NUM_EXPERTS)


@triton.jit(do_not_specialize=["num_chunks"])
def moe_scan_kernel(counts_ptr, totals_ptr, num_chunks, SCAN_BLOCK: tl.constexpr):
    """Program e: counts[e, c] becomes the entries of expert e in chunks before c (an exclusive
    prefix sum along the row); totals[e] = all entries of expert e."""
    row = counts_ptr + tl.program_id(0) * num_chunks
    carry = tl.zeros((), dtype=tl.int32)
    for start in range(0, num_chunks, SCAN_BLOCK):
        offs = start + tl.arange(0, SCAN_BLOCK)
        mask = offs < num_chunks
        counts = tl.load(row + offs, mask=mask, other=0)
        tl.store(row + offs, carry + tl.cumsum(counts, axis=0) - counts, mask=mask)
        carry += tl.sum(counts, axis=0)
    tl.store(totals_ptr + tl.program_id(0), carry)


@triton.jit(do_not_specialize=["num_entries", "num_chunks", "num_blocks"])
def moe_place_kernel(
    ids_ptr, counts_ptr, totals_ptr, sorted_ptr, block_expert_ptr,
    num_entries, num_chunks, num_blocks,
    NUM_EXPERTS: tl.constexpr, EXPERTS_PAD: tl.constexpr, CHUNK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCKS_PER_PROGRAM: tl.constexpr,
):  # fmt: skip
    """Program p writes the sorted rows of chunk p's entries (p < num_chunks), and the expert of
    blocks [p * BLOCKS_PER_PROGRAM, ...) with the sentinel in their padding rows. The two
    writes touch disjoint rows, so no program waits for another."""
    pid = tl.program_id(0)
    experts = tl.arange(0, EXPERTS_PAD)
    real = experts < NUM_EXPERTS
    totals = tl.load(totals_ptr + experts, mask=real, other=0)
    padded = (totals + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, axis=0)  # expert e's rows: [ends[e] - padded[e], ends[e])
    starts = ends - padded
    if pid < num_chunks:
        offs = pid * CHUNK + tl.arange(0, CHUNK)
        ids = tl.load(ids_ptr + offs, mask=offs < num_entries, other=-1)
        hits = (ids[:, None] == experts[None, :]).to(tl.int32)  # [CHUNK, EXPERTS_PAD]
        rank = tl.sum(tl.cumsum(hits, axis=0) * hits, axis=1) - 1  # among its expert's in the chunk
        before = tl.load(counts_ptr + experts * num_chunks + pid, mask=real, other=0)
        base = tl.sum(hits * (starts + before)[None, :], axis=1)
        tl.store(sorted_ptr + base + rank, offs, mask=tl.sum(hits, axis=1) > 0)
    blocks = pid * BLOCKS_PER_PROGRAM + tl.arange(0, BLOCKS_PER_PROGRAM)
    first_row = blocks * BLOCK_M
    # a block's expert: how many experts end at or before its first row (NUM_EXPERTS: unused)
    ends_real = tl.where(real, ends, 2147483647)
    expert = tl.sum((ends_real[None, :] <= first_row[:, None]).to(tl.int32), axis=1)
    used = expert < NUM_EXPERTS
    tl.store(block_expert_ptr + blocks, tl.where(used, expert, -1), mask=blocks < num_blocks)
    pick = (expert[:, None] == experts[None, :]).to(tl.int32)  # [BLOCKS, EXPERTS_PAD]
    start = tl.sum(pick * starts[None, :], axis=1)
    total = tl.sum(pick * totals[None, :], axis=1)
    rows = first_row[:, None] + tl.arange(0, BLOCK_M)[None, :]
    padding = used[:, None] & (rows - start[:, None] >= total[:, None])
    tl.store(sorted_ptr + rows, tl.full(rows.shape, 0, tl.int32) + num_entries, mask=padding)


@triton.jit
def _block(sorted_ptr, block_expert_ptr, num_entries, num_m_blocks, num_n_blocks, BLOCK_M: tl.constexpr,
           GROUP_M: tl.constexpr):  # fmt: skip
    """(expert, sorted rows, which rows are entries, column block) of this program's tile; the
    expert is -1 for an unused block. Programs run GROUP_M row blocks across the columns together."""
    pid = tl.program_id(0)
    per_group = GROUP_M * num_n_blocks
    first_m = pid // per_group * GROUP_M
    group_rows = tl.minimum(num_m_blocks - first_m, GROUP_M)
    pid_m = first_m + pid % per_group % group_rows
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    rows = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    return expert, rows, rows < num_entries, pid % per_group // group_rows


@triton.jit
def _zeros(BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SWAP_AB: tl.constexpr):
    """A float32 accumulator for a [BLOCK_M, BLOCK_N] tile, held as [BLOCK_N, BLOCK_M] when SWAP_AB."""
    if SWAP_AB:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    return acc


@triton.jit
def _dot(a, b, acc, SWAP_AB: tl.constexpr, PROMOTE: tl.constexpr):
    """acc + a . b for a [M, K] and b [K, N]; SWAP_AB: acc is held transposed ([N, M]) and gets
    b^T . a^T, so the weights' columns are the tensor core's rows (wgmma takes 64 of them, and
    e4m3 operands, where a block of 16-32 tokens would fall back to mma.sync and fp16).
    PROMOTE: the product is added to acc in float32 (not folded into the tensor core's sum)."""
    if SWAP_AB:
        a, b = tl.trans(b), tl.trans(a)
    if PROMOTE:
        acc += tl.dot(a, b)
    else:
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def _unswap(acc, SWAP_AB: tl.constexpr):
    """The accumulator as [M, N] (see _dot)."""
    if SWAP_AB:
        acc = tl.trans(acc)
    return acc


@triton.jit(do_not_specialize=["num_entries", "num_m_blocks"])
def moe_gate_up_kernel(
    x_ptr, x_scale_ptr, w_ptr, w_scale_ptr, out_ptr, sorted_ptr, block_expert_ptr,
    num_entries, hidden, inter, stride_x, stride_we, stride_wn, stride_se, stride_out,
    num_m_blocks, num_n_blocks,
    TOP_K: tl.constexpr, FP8: tl.constexpr, FP8_SUMS: tl.constexpr, DOT_F32: tl.constexpr,
    EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, SWAP_AB: tl.constexpr,
):  # fmt: skip
    """out[r, n] = silu(x[r // k] . gate_e[n]) * (x[r // k] . up_e[n]) for the sorted rows r of a
    block of expert e, where w[e] = [gate (inter rows); up (inter rows)] of [hidden] each. Gate
    and up are rounded to the output dtype before the SiLU-mul, as two linear layers would be.
    FP8: x is e4m3 with one scale per token, w e4m3 with one scale per output row, multiplied
    and summed as FP8_SUMS says (module docstring)."""
    expert, rows, valid, pid_n = _block(
        sorted_ptr, block_expert_ptr, num_entries, num_m_blocks, num_n_blocks, BLOCK_M, GROUP_M
    )
    if expert < 0:
        return
    tokens = tl.where(valid, rows // TOP_K, 0).to(tl.int64)  # NOTE: padding rows read token 0
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    wrapped = cols % inter  # in-bounds loads for the last column block; its stores are masked
    ks = tl.arange(0, BLOCK_K)
    a_ptrs = x_ptr + tokens[:, None] * stride_x + ks[None, :]
    gate_ptrs = w_ptr + expert * stride_we + wrapped[None, :] * stride_wn + ks[:, None]  # [K, N]
    up_ptrs = gate_ptrs + inter * stride_wn
    acc_gate = _zeros(BLOCK_M, BLOCK_N, SWAP_AB)
    acc_up = _zeros(BLOCK_M, BLOCK_N, SWAP_AB)
    for k0 in range(0, hidden, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs)
            gate = tl.load(gate_ptrs)
            up = tl.load(up_ptrs)
        else:
            in_k = ks < hidden - k0
            a = tl.load(a_ptrs, mask=in_k[None, :], other=0.0)
            gate = tl.load(gate_ptrs, mask=in_k[:, None], other=0.0)
            up = tl.load(up_ptrs, mask=in_k[:, None], other=0.0)
        if DOT_F32:
            a, gate, up = a.to(tl.float32), gate.to(tl.float32), up.to(tl.float32)
        elif FP8 and FP8_SUMS == 0:
            a, gate, up = a.to(tl.float16), gate.to(tl.float16), up.to(tl.float16)
        if FP8 and FP8_SUMS == 1:  # NOTE: the sum promoted, not folded into the dot: see moe_down_kernel
            acc_gate = _dot(a, gate, acc_gate, SWAP_AB, True)
            acc_up = _dot(a, up, acc_up, SWAP_AB, True)
        else:
            acc_gate = _dot(a, gate, acc_gate, SWAP_AB, False)
            acc_up = _dot(a, up, acc_up, SWAP_AB, False)
        a_ptrs += BLOCK_K
        gate_ptrs += BLOCK_K
        up_ptrs += BLOCK_K
    acc_gate = _unswap(acc_gate, SWAP_AB)
    acc_up = _unswap(acc_up, SWAP_AB)
    if FP8:
        x_scale = tl.load(x_scale_ptr + tokens)[:, None]
        scales = w_scale_ptr + expert * stride_se + wrapped
        acc_gate = acc_gate * x_scale * tl.load(scales)[None, :]
        acc_up = acc_up * x_scale * tl.load(scales + inter)[None, :]
    dtype = out_ptr.dtype.element_ty
    gate32 = acc_gate.to(dtype).to(tl.float32)
    silu = (gate32 / (1.0 + tl.exp(-gate32))).to(dtype).to(tl.float32)
    y = (silu * acc_up.to(dtype).to(tl.float32)).to(dtype)
    mask = valid[:, None] & (cols < inter)[None, :]
    tl.store(out_ptr + rows.to(tl.int64)[:, None] * stride_out + cols[None, :], y, mask=mask)


@triton.jit(do_not_specialize=["num_entries", "num_m_blocks"])
def moe_down_kernel(
    a_ptr, a_scale_ptr, w_ptr, w_scale_ptr, topk_weights_ptr, out_ptr, sorted_ptr, block_expert_ptr,
    num_entries, inter, hidden, stride_a, stride_we, stride_wn, stride_se, stride_out,
    num_m_blocks, num_n_blocks,
    FP8: tl.constexpr, DOT_F32: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SWAP_AB: tl.constexpr,
):  # fmt: skip
    """out[r, n] = topk_weights[r] * (a[r] . w_e[n]) for the sorted rows r of a block of expert e
    (a [entries, inter], w[e] [hidden, inter]); the product is rounded to the output dtype before
    the routing weight, as the expert's down projection would be. FP8: scales as in
    moe_gate_up_kernel with a quantized per entry, e4m3 products moved to the float32
    accumulator every BLOCK_K (module docstring)."""
    expert, rows, valid, pid_n = _block(
        sorted_ptr, block_expert_ptr, num_entries, num_m_blocks, num_n_blocks, BLOCK_M, GROUP_M
    )
    if expert < 0:
        return
    entries = tl.where(valid, rows, 0).to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    wrapped = cols % hidden
    ks = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + entries[:, None] * stride_a + ks[None, :]
    w_ptrs = w_ptr + expert * stride_we + wrapped[None, :] * stride_wn + ks[:, None]
    acc = _zeros(BLOCK_M, BLOCK_N, SWAP_AB)
    for k0 in range(0, inter, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs)
            w = tl.load(w_ptrs)
        else:
            in_k = ks < inter - k0
            a = tl.load(a_ptrs, mask=in_k[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=in_k[:, None], other=0.0)
        if DOT_F32:
            a, w = a.to(tl.float32), w.to(tl.float32)
        # NOTE: FP8 promotes: a sum folded into the dot would stay in the tensor core
        acc = _dot(a, w, acc, SWAP_AB, FP8)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    acc = _unswap(acc, SWAP_AB)
    if FP8:
        acc = acc * tl.load(a_scale_ptr + entries)[:, None]
        acc = acc * tl.load(w_scale_ptr + expert * stride_se + wrapped)[None, :]
    dtype = out_ptr.dtype.element_ty
    y = acc.to(dtype).to(tl.float32) * tl.load(topk_weights_ptr + entries)[:, None]
    mask = valid[:, None] & (cols < hidden)[None, :]
    tl.store(out_ptr + entries[:, None] * stride_out + cols[None, :], y.to(dtype), mask=mask)


@triton.jit
def moe_sum_kernel(
    parts_ptr, ids_ptr, out_ptr, hidden, stride_parts, stride_out,
    NUM_EXPERTS: tl.constexpr, TOP_K: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """out[t] = sum over slots j of parts[t * k + j], in float32, rounded once; a slot whose
    expert id is outside [0, NUM_EXPERTS) was never computed and adds nothing."""
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_row = cols < hidden
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        expert = tl.load(ids_ptr + token * TOP_K + j)
        width = tl.where((expert >= 0) & (expert < NUM_EXPERTS), hidden, 0)  # a dropped slot: none
        part = tl.load(parts_ptr + (token * TOP_K + j) * stride_parts + cols, mask=cols < width, other=0.0)
        acc += part.to(tl.float32)
    tl.store(out_ptr + token * stride_out + cols, acc.to(out_ptr.dtype.element_ty), mask=in_row)


@triton.jit
def moe_route_kernel(
    logits_ptr, weights_ptr, ids_ptr, stride_logits,
    NUM_EXPERTS: tl.constexpr, EXPERTS_PAD: tl.constexpr, TOP_K: tl.constexpr, K_PAD: tl.constexpr,
    RENORMALIZE: tl.constexpr,
):  # fmt: skip
    """Token t: the softmax of its router logits in float32, its TOP_K largest probabilities in
    descending order (the lowest expert first among equal ones), divided by their sum when
    RENORMALIZE, into weights[t] (float32), and their experts into ids[t] (int32)."""
    token = tl.program_id(0).to(tl.int64)
    experts = tl.arange(0, EXPERTS_PAD)
    real = experts < NUM_EXPERTS
    logits = tl.load(logits_ptr + token * stride_logits + experts, mask=real, other=float("-inf"))
    logits = logits.to(tl.float32)
    probs = tl.exp(logits - tl.max(logits, axis=0))
    probs = probs / tl.sum(probs, axis=0)
    left = tl.where(real, probs, -1.0)  # probabilities not chosen yet (padding never is)
    slots = tl.arange(0, K_PAD)
    chosen = tl.zeros((K_PAD,), dtype=tl.float32)
    chosen_ids = tl.zeros((K_PAD,), dtype=tl.int32)
    for j in tl.static_range(TOP_K):
        best = tl.max(left, axis=0)
        pick = tl.min(tl.where(left == best, experts, EXPERTS_PAD), axis=0)
        chosen = tl.where(slots == j, best, chosen)
        chosen_ids = tl.where(slots == j, pick, chosen_ids)
        left = tl.where(experts == pick, -1.0, left)
    if RENORMALIZE:
        chosen = chosen / tl.sum(chosen, axis=0)  # slots past TOP_K hold 0
    tl.store(weights_ptr + token * TOP_K + slots, chosen, mask=slots < TOP_K)
    tl.store(ids_ptr + token * TOP_K + slots, chosen_ids, mask=slots < TOP_K)
