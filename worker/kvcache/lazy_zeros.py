"""Zero-filled host tensors whose memory is committed page by page, as it is first written."""

from __future__ import annotations

import math

import torch

ALIGN_BYTES = 64  # a cache line


def lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """``torch.zeros(shape, dtype, device)``; on the CPU from calloc'd memory (numpy's zeros).

    NOTE: ``torch.zeros`` writes every byte, so a 1 GiB CPU KV pool is 1 GiB resident from the
    start. calloc of a large block maps the kernel's zero pages instead: reading them costs
    nothing and a page becomes resident only when first written, so the pool's resident size
    follows the KV actually stored (the pages the allocator has handed out so far).
    """
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    import numpy as np

    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    raw = np.zeros(nbytes + ALIGN_BYTES, dtype=np.uint8)
    start = -raw.ctypes.data % ALIGN_BYTES  # calloc aligns to 16 bytes; vector loads like 64
    return torch.from_numpy(raw[start : start + nbytes]).view(dtype).view(shape)
