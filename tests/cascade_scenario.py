"""Cascade-attention test data: a KV pool whose groups share prefix pages (import from tests)."""

from __future__ import annotations

import torch

from worker.forward import BatchLayout, PrefixGroups
from worker.kvcache.pool import KVPool

A, B = 0, 1  # group ids
PREFIX_PAGES = {A: 3, B: 1}
# (group or None, cached tokens past the group's prefix, extend_len); batch order interleaves groups
DECODE = [(A, 0, 1), (A, 5, 1), (None, 9, 1), (B, 2, 1), (A, 17, 1), (B, 0, 1), (None, 0, 1)]
PREFILL = [(A, 0, 6), (B, 3, 4), (None, 0, 5), (A, 2, 1), (B, 0, 1), (A, 9, 3), (None, 4, 2)]


def scenario(
    requests,
    page_size: int,
    num_q_heads: int,
    num_kv_heads: int,
    seed: int,
    *,
    prefix_pages: dict[int, int] | None = None,
    head_dim: int = 16,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
):
    """KV pool + page table where each group's members share their prefix pages; queries.

    ``requests``: (group or None, cached tokens past the group's prefix, extend_len) each;
    ``prefix_pages``: pages of each group's prefix (PREFIX_PAGES by default). Returns
    (kv, page_table, plain layout, the same layout with its PrefixGroups, queries, layer)."""
    prefix_pages = PREFIX_PAGES if prefix_pages is None else prefix_pages
    gen = torch.Generator().manual_seed(seed)
    num_layers, layer = 2, 1
    max_len = max((prefix_pages[g] * page_size if g is not None else 0) + x + e for g, x, e in requests)
    row_pages = -(-max_len // page_size)
    num_pages = len(requests) * row_pages + sum(prefix_pages.values()) + 1
    kv = KVPool(num_layers, num_pages, page_size, num_kv_heads, head_dim, dtype, device)
    page_table = torch.zeros(len(requests) + 1, row_pages * page_size, dtype=torch.int32)
    free_pages = torch.randperm(num_pages, generator=gen).tolist()

    def locs_of(pages: list[int], n: int) -> torch.Tensor:
        return torch.tensor([pages[i // page_size] * page_size + i % page_size for i in range(n)])

    def store(locs: torch.Tensor) -> None:
        k, v = (torch.randn(len(locs), num_kv_heads, head_dim, generator=gen) for _ in "kv")
        kv.store(layer, locs.to(device), k.to(device), v.to(device))

    shared = {g: [free_pages.pop() for _ in range(n)] for g, n in prefix_pages.items()}
    for pages in shared.values():
        store(locs_of(pages, len(pages) * page_size))
    slots, cached, extend, group_ids, prefix_lens, queries = [], [], [], [], [], []
    for i, (g, extra, extend_len) in enumerate(requests):
        slot = len(requests) - i  # rows not in batch order
        prefix_len = prefix_pages[g] * page_size if g is not None else 0
        seq_len = prefix_len + extra + extend_len
        own = [free_pages.pop() for _ in range(-(-(seq_len - prefix_len) // page_size))]
        pages = (shared[g] if g is not None else []) + own
        locs = locs_of(pages, seq_len)
        page_table[slot, :seq_len] = locs.int()
        store(locs[prefix_len:])
        slots.append(slot), cached.append(prefix_len + extra), extend.append(extend_len)
        group_ids.append(-1 if g is None else g), prefix_lens.append(prefix_len)
        queries.append(torch.randn(extend_len, num_q_heads, head_dim, generator=gen))
    i32 = torch.int32
    plain = BatchLayout(
        torch.tensor(slots, dtype=i32), torch.tensor(cached, dtype=i32), torch.tensor(extend, dtype=i32)
    )
    groups = PrefixGroups(torch.tensor(group_ids, dtype=i32), torch.tensor(prefix_lens, dtype=i32))
    grouped = BatchLayout(plain.slots_cpu, plain.cached_lens_cpu, plain.extend_lens_cpu, groups)
    q = torch.cat(queries).to(dtype).to(device)
    return kv, page_table.to(device), plain, grouped, q, layer
