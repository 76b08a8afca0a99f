"""Triton kernels behind worker.kernels.sampling (imported only on CUDA, lazily): the fused
sampler's chunk summaries and its per-row draw (that module's docstring says what they draw)."""

from __future__ import annotations

import triton
import triton.language as tl

from worker.kernels.triton_kernels import _jit_any_alignment


@triton.jit
def _mix32(x):
    """worker.engine.sampler._mix32 on int64 values in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x = x ^ (x >> 15)
    x = (x * 0x68E31DA5) & 0xFFFFFFFF
    return x ^ (x >> 16)


@_jit_any_alignment("temperature_ptr", "greedy_ptr")
def sample_chunks_kernel(
    logits_ptr,
    stride_row,
    temperature_ptr,
    greedy_ptr,
    max_ptr,
    idx_ptr,
    mass_ptr,
    vocab: tl.constexpr,
    num_chunks: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCK: tl.constexpr,
    TWO_PASS: tl.constexpr = False,
):
    """Program (row, c) summarises columns [c * CHUNK, (c + 1) * CHUNK) of its row: their max,
    and for a greedy row its first column, for a row that samples their mass
    sum(exp(x / T - max / T)) (0 when every logit there is -inf: a masked-out chunk), in one
    pass over the logits: the mass is kept relative to the running max and rescaled when it
    rises. ``TWO_PASS`` is the schedule it replaced (benchmarks/sampling.py's "before"): every
    row takes the greedy pass, then a row that samples reads its chunk again for the mass.
    sample_pick_kernel combines the chunks."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    base = logits_ptr + row * stride_row
    cols = tl.arange(0, BLOCK)
    start = chunk * CHUNK
    best = float("-inf")
    best_idx = tl.zeros((), dtype=tl.int32) + start  # read for greedy rows only
    mass = tl.zeros((), dtype=tl.float64)
    greedy = tl.load(greedy_ptr + row)
    if (greedy != 0) | TWO_PASS:
        for off in range(start, start + CHUNK, BLOCK):
            x = tl.load(base + off + cols, mask=off + cols < vocab, other=float("-inf")).to(tl.float32)
            block_max = tl.max(x, axis=0)
            better = block_max > best
            best_idx = tl.where(better, off + tl.argmax(x, axis=0, tie_break_left=True), best_idx)
            best = tl.where(better, block_max, best)
        if (greedy == 0) & (best > float("-inf")):
            t = tl.load(temperature_ptr + row)
            for off in range(start, start + CHUNK, BLOCK):
                x = tl.load(base + off + cols, mask=off + cols < vocab, other=float("-inf")).to(tl.float32)
                mass += tl.sum(tl.exp(x / t - best / t), axis=0).to(tl.float64)
    else:
        t = tl.load(temperature_ptr + row)
        for off in range(start, start + CHUNK, BLOCK):
            x = tl.load(base + off + cols, mask=off + cols < vocab, other=float("-inf")).to(tl.float32)
            top = tl.maximum(best, tl.max(x, axis=0))
            ref = tl.where(top > float("-inf"), top, 0.0)  # NOTE: -inf - -inf would be nan
            rescale = tl.exp(best / t - ref / t)  # 1 while the max holds, 0 before the first logit
            block = tl.sum(tl.exp(x / t - ref / t), axis=0)
            mass = mass * rescale.to(tl.float64) + block.to(tl.float64)
            best = top
    slot = row * num_chunks + chunk
    tl.store(max_ptr + slot, best)
    tl.store(idx_ptr + slot, best_idx)
    tl.store(mass_ptr + slot, mass)


@triton.jit
def _chunk_mass(max_ptr, mass_ptr, slot, t, peak):
    """A chunk's mass relative to the row's peak (float64; 0 for a chunk of -inf logits)."""
    return tl.load(mass_ptr + slot) * tl.exp(tl.load(max_ptr + slot) / t - peak).to(tl.float64)


@_jit_any_alignment("temperature_ptr", "seed_ptr", "step_ptr", "greedy_ptr")
def sample_pick_kernel(
    logits_ptr,
    stride_row,
    temperature_ptr,
    seed_ptr,
    step_ptr,
    greedy_ptr,
    max_ptr,
    idx_ptr,
    mass_ptr,
    out_ptr,
    vocab: tl.constexpr,
    num_chunks: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One row per program: argmax for greedy rows (first on ties: the first chunk holding the
    max, its first column), else the inverse-CDF draw of softmax(logits / T) at the row's
    uniform u (worker.engine.sampler.row_uniforms of its seed and step, computed here): the
    first token whose running mass exceeds u * total. The total and the mass before each chunk
    come from the chunks' summaries (rescaled to the row's max); only the chunk where the
    target falls is scanned, token by token, from there."""
    row = tl.program_id(0)
    first = row * num_chunks
    best = float("-inf")
    best_idx = tl.zeros((), dtype=tl.int32)
    for c in range(num_chunks):
        chunk_max = tl.load(max_ptr + first + c)
        better = chunk_max > best
        best_idx = tl.where(better, tl.load(idx_ptr + first + c), best_idx)
        best = tl.where(better, chunk_max, best)
    if tl.load(greedy_ptr + row) != 0:
        tl.store(out_ptr + row, best_idx.to(tl.int32))
    else:
        t = tl.load(temperature_ptr + row)
        peak = best / t  # division is monotonic: max(x / t) == max(x) / t
        total = tl.zeros((), dtype=tl.float64)
        for c in range(num_chunks):
            total += _chunk_mass(max_ptr, mass_ptr, first + c, t, peak)
        seed = tl.load(seed_ptr + row)
        step = tl.load(step_ptr + row)
        key = _mix32((seed & 0xFFFFFFFF) ^ _mix32(((seed >> 32) & 0xFFFFFFFF) ^ _mix32(step & 0xFFFFFFFF)))
        high = _mix32(key ^ 0x27D4EB2F)
        low = _mix32(high ^ key) >> 11
        u = (((high << 21) | low).to(tl.float64) + 0.5) * (2.0**-53)
        target = u * total
        # the chunk where the running mass crosses the target, and the mass before it
        carry = tl.zeros((), dtype=tl.float64)
        start = tl.zeros((), dtype=tl.int32)
        before = tl.zeros((), dtype=tl.float64)
        for c in range(num_chunks):
            mass = _chunk_mass(max_ptr, mass_ptr, first + c, t, peak)
            below = carry <= target
            start = tl.where(below & (mass > 0), c * CHUNK, start)
            before = tl.where(below & (mass > 0), carry, before)
            carry += mass
        base = logits_ptr + row * stride_row
        cols = tl.arange(0, BLOCK)
        carry = before
        found = vocab - 1
        off = start
        while off < vocab:
            x = tl.load(base + off + cols, mask=off + cols < vocab, other=float("-inf")).to(tl.float32)
            p = tl.exp(x / t - peak)
            running = carry + tl.cumsum(p, axis=0).to(tl.float64)
            crossed = (running > target) & (off + cols < vocab)
            hit = tl.min(tl.where(crossed, cols, BLOCK), axis=0)
            if hit < BLOCK:
                found = off + hit
                off = vocab
            else:
                carry += tl.sum(p, axis=0).to(tl.float64)
                off += BLOCK
        tl.store(out_ptr + row, found.to(tl.int32))
