"""Fused sampling for rows without top-k/top-p/min-p filters: two Triton kernels on CUDA.

It draws what worker.engine.sampler's inverse-CDF path draws (same uniforms from (seed, step),
same softmax(logits / T) mass, same "first token whose running mass exceeds u * total"
rule) without materialising probabilities or a float64 cumulative sum: the first kernel
summarises each row's chunks of ``_CHUNK`` columns in parallel, reading each once (max, and
its first column for a greedy row or the mass relative to it for a row that samples), the second combines a row's summaries (greedy rows take the argmax, first
on ties) and scans only the chunk where the draw falls. Sums run in a different order than
torch's, so a draw can differ from the torch path only when u lands within float rounding of
a token boundary.
"""

from __future__ import annotations

import torch

from worker.kernels.ops import _kernels_for

_CHUNK = 8192  # columns per summarising program: a 152k vocabulary is 19 chunks a row
_BLOCK = 2048


def sample_unfiltered(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    steps: torch.Tensor,
    greedy: torch.Tensor,
    two_pass: bool = False,
) -> torch.Tensor | None:
    """int32 [B] tokens, or None when the kernel cannot run here (the caller falls back).

    Row i draws with the uniform ``row_uniforms(seeds, steps)[i]`` of worker.engine.sampler,
    which the kernel computes itself (the torch version is ~30 tiny kernels). ``two_pass``: the
    chunk summaries' old schedule (each chunk read twice where a row samples), for
    benchmarks/sampling.py to time against."""
    if _kernels_for(logits) is None or logits.dim() != 2 or logits.stride(-1) != 1:
        return None
    from worker.kernels import sampling_triton as k

    rows, vocab = logits.shape
    out = torch.empty(rows, dtype=torch.int32, device=logits.device)
    if rows:
        chunks = -(-vocab // _CHUNK)
        chunk_max = torch.empty((rows, chunks), dtype=torch.float32, device=logits.device)
        chunk_idx = torch.empty((rows, chunks), dtype=torch.int32, device=logits.device)
        chunk_mass = torch.empty((rows, chunks), dtype=torch.float64, device=logits.device)
        temperature, greedy = temperature.float().contiguous(), greedy.contiguous()
        shape = dict(vocab=vocab, num_chunks=chunks, CHUNK=_CHUNK, BLOCK=_BLOCK, num_warps=4)
        k.sample_chunks_kernel[(rows, chunks)](
            logits, logits.stride(0), temperature, greedy, chunk_max, chunk_idx, chunk_mass, **shape,
            TWO_PASS=two_pass,
        )  # fmt: skip
        k.sample_pick_kernel[(rows,)](
            logits, logits.stride(0), temperature, seeds.long().contiguous(), steps.long().contiguous(),
            greedy, chunk_max, chunk_idx, chunk_mass, out, **shape,
        )  # fmt: skip
    return out
