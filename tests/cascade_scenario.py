"""Cascade-attention test data: a KV pool whose groups share prefix pages (import from tests)."""

from __future__ import annotations

import torch

from worker.attention.base import BatchLayout, PrefixGroups
from worker.engine.kv_pool import KVPool

A, B = 0, 1  # group ids
PREFIX_PAGES = {A: 3, B: 1}
# (group or None, cached tokens past the group's prefix, extend_len); batch order interleaves groups
DECODE = [(A, 0, 1), (A, 5, 1), (None, 9, 1), (B, 2, 1), (A, 17, 1), (B, 0, 1), (None, 0, 1)]
PREFILL = [(A, 0, 6), (B, 3, 4), (None, 0, 5), (A, 2, 1), (B, 0, 1), (A, 9, 3), (None, 4, 2)]


def scenario(requests, page_size: int, num_q_heads: int, num_kv_heads: int, seed: int):
    """KV pool + page table where each group's members share their prefix pages; queries."""
    gen = torch.Generator().manual_seed(seed)
    head_dim, num_layers, layer = 16, 2, 1
    max_len = 80
    num_pages = (len(requests) + 2) * (-(-max_len // page_size)) + 1
    kv = KVPool(num_layers, num_pages, page_size, num_kv_heads, head_dim, torch.float32, "cpu")
    page_table = torch.zeros(len(requests) + 1, -(-max_len // page_size) * page_size, dtype=torch.int32)
    free_pages = torch.randperm(num_pages, generator=gen).tolist()

    def locs_of(pages: list[int], n: int) -> torch.Tensor:
        return torch.tensor([pages[i // page_size] * page_size + i % page_size for i in range(n)])

    shared = {g: [free_pages.pop() for _ in range(n)] for g, n in PREFIX_PAGES.items()}
    for pages in shared.values():
        locs = locs_of(pages, len(pages) * page_size)
        kv.store(layer, locs, *(torch.randn(len(locs), num_kv_heads, head_dim, generator=gen) for _ in "kv"))
    slots, cached, extend, group_ids, prefix_lens, queries = [], [], [], [], [], []
    for i, (g, extra, extend_len) in enumerate(requests):
        slot = len(requests) - i  # rows not in batch order
        prefix_len = PREFIX_PAGES[g] * page_size if g is not None else 0
        seq_len = prefix_len + extra + extend_len
        own = [free_pages.pop() for _ in range(-(-(seq_len - prefix_len) // page_size))]
        pages = (shared[g] if g is not None else []) + own
        locs = locs_of(pages, seq_len)
        page_table[slot, :seq_len] = locs.int()
        new = locs[prefix_len:]
        kv.store(layer, new, *(torch.randn(len(new), num_kv_heads, head_dim, generator=gen) for _ in "kv"))
        slots.append(slot), cached.append(prefix_len + extra), extend.append(extend_len)
        group_ids.append(-1 if g is None else g), prefix_lens.append(prefix_len)
        queries.append(torch.randn(extend_len, num_q_heads, head_dim, generator=gen))
    i32 = torch.int32
    plain = BatchLayout(
        torch.tensor(slots, dtype=i32), torch.tensor(cached, dtype=i32), torch.tensor(extend, dtype=i32)
    )
    groups = PrefixGroups(torch.tensor(group_ids, dtype=i32), torch.tensor(prefix_lens, dtype=i32))
    grouped = BatchLayout(plain.slots_cpu, plain.cached_lens_cpu, plain.extend_lens_cpu, groups)
    return kv, page_table, plain, grouped, torch.cat(queries), layer
