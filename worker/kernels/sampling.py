"""Fused sampling for rows without top-k/top-p/min-p filters: one Triton kernel on CUDA.

It draws what worker.engine.sampler's inverse-CDF path draws (same uniforms from (seed, step),
same softmax(logits / T) mass, same "first token whose running mass exceeds u * total"
rule), reading the logits three times instead of materialising probabilities and a float64
cumulative sum; greedy rows take the argmax (first on ties). Sums run in a different order
than torch's, so a draw can differ from the torch path only when u lands within float
rounding of a token boundary.
"""

from __future__ import annotations

import torch

from worker.kernels.ops import _kernels_for

_BLOCK = 4096


def sample_unfiltered(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    steps: torch.Tensor,
    greedy: torch.Tensor,
) -> torch.Tensor | None:
    """int32 [B] tokens, or None when the kernel cannot run here (the caller falls back).

    Row i draws with the uniform ``row_uniforms(seeds, steps)[i]`` of worker.engine.sampler,
    which the kernel computes itself (the torch version is ~30 tiny kernels)."""
    k = _kernels_for(logits)
    if k is None or logits.dim() != 2 or logits.stride(-1) != 1:
        return None
    rows, vocab = logits.shape
    out = torch.empty(rows, dtype=torch.int32, device=logits.device)
    if rows:
        k.sample_rows_kernel[(rows,)](
            logits, logits.stride(0), temperature.float().contiguous(), seeds.long().contiguous(),
            steps.long().contiguous(), greedy.contiguous(), out, vocab, BLOCK=_BLOCK, num_warps=8,
        )  # fmt: skip
    return out
