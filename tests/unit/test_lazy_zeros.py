"""A CPU KV pool is resident only as its pages are written (worker.kvcache.lazy_zeros), and
reads as zeros like torch.zeros, for every cache dtype."""

from __future__ import annotations

import pytest
import torch

from worker.kvcache.lazy_zeros import ALIGN_BYTES, lazy_zeros
from worker.kvcache.pool import KVPool

MIB = 2**20


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn])
def test_lazy_zeros_is_a_zero_tensor(dtype: torch.dtype) -> None:
    t = lazy_zeros((3, 5, 7), dtype, "cpu")
    assert t.shape == (3, 5, 7) and t.dtype == dtype and t.is_contiguous()
    assert t.data_ptr() % ALIGN_BYTES == 0
    assert torch.equal(t.float(), torch.zeros(3, 5, 7))


def test_a_cpu_pool_is_resident_only_where_written() -> None:
    """512 MiB of K/V pages: well under 64 MiB more resident at creation; writing 100 pages
    of one layer commits about those pages, and what was written reads back."""
    before = resident_bytes()
    pool = KVPool(8, 2048, 16, 4, 64, torch.float32, "cpu")  # 2 x 8 x 2048 x 16 KiB
    total = 2 * pool.k_buffer(0).numel() * 4 * pool.num_layers
    assert total == 512 * MIB
    assert resident_bytes() - before < 64 * MIB
    locs = torch.arange(100 * 16)
    k = torch.randn(len(locs), 4, 64)
    pool.store(3, locs, k, -k)
    page_bytes = 16 * 4 * 64 * 4
    grown = resident_bytes() - before
    assert 2 * 100 * page_bytes <= grown < 64 * MIB
    got_k, got_v = pool.gather(3, locs)
    assert torch.equal(got_k, k) and torch.equal(got_v, -k)
    assert not pool.k_buffer(2).any() and not pool.v_buffer(3)[100:].any()
