"""CacheManager: KV pages (allocator) + prefix cache, on behalf of requests.

A page is in exactly one of three places: free (allocator), owned by the prefix cache
(locked or evictable), or private to one running request (its row of the page table past
``matched_len``, up to ``alloc_len``). ``check_integrity`` asserts free + cached + private == total.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import torch

from worker.kvcache.allocator import PageAllocator
from worker.kvcache.prefix import Match, create_prefix_cache
from worker.kvcache.table import TableManager


class Req(Protocol):
    """What the cache reads and writes of a request (worker.scheduler.req.Req is one)."""

    slot: int  # its row of the page table
    device_len: int  # tokens its row must back
    cached_len: int  # tokens whose KV is computed
    alloc_len: int  # tokens its row holds pages for (a multiple of page_size)
    matched_len: int  # tokens at the head of its row owned by the prefix cache (locked)
    handle: Any  # the prefix cache's handle of that locked prefix

    @property
    def input_ids(self) -> list[int]: ...


class CacheManager:
    def __init__(self, num_pages: int, page_size: int, kind: str, tables: TableManager) -> None:
        self.page_size = page_size
        self.num_pages = num_pages
        self.allocator = PageAllocator(num_pages, page_size)
        self.prefix = create_prefix_cache(kind, page_size)
        self.tables = tables
        self.num_private_pages = 0

    @property
    def shares_prefixes(self) -> bool:
        """Whether the prefix cache ever serves one request's KV to another."""
        return self.prefix.insertable_len(self.page_size) > 0

    def pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    @property
    def available_pages(self) -> int:
        """Pages obtainable now: free ones plus evictable cached ones."""
        return self.allocator.num_free_pages + self.prefix.num_evictable_tokens // self.page_size

    def match(self, input_ids: list[int]) -> Match:
        """Longest cached prefix, keeping at least one token to compute (cached_len < device_len)."""
        return self.prefix.match(input_ids[: len(input_ids) - 1])

    def lock(self, match: Match) -> None:
        self.prefix.lock(match.handle)

    def unlock(self, match: Match) -> None:
        self.prefix.unlock(match.handle)

    def allocate(self, slots: np.ndarray, device_lens: np.ndarray, alloc_lens: np.ndarray) -> np.ndarray:
        """Back rows ``slots`` of the page table with pages up to ``device_lens`` (evicting cached
        pages if needed): one allocator call and one table write for all of them. Takes and
        returns the rows' alloc_lens (int64 arrays aligned with ``slots``; a slot once)."""
        ps = self.page_size
        grow = self.pages_to_grow(device_lens, alloc_lens)
        grown = np.flatnonzero(grow)
        if not len(grown):
            return alloc_lens
        counts = grow[grown]
        total = int(counts.sum())
        short = total - self.allocator.num_free_pages
        if short > 0:
            self.allocator.free(self.prefix.evict(short * ps))
        locations = self.allocator.allocate(total)
        entries = counts * ps  # page-table entries each grown row gains
        first = np.cumsum(entries) - entries  # index of each row's first new entry
        starts = alloc_lens[grown]
        positions = np.arange(total * ps, dtype=np.int64) + np.repeat(starts - first, entries)
        self.tables.write_location_entries(np.repeat(slots[grown], entries), positions, locations)
        self.num_private_pages += total
        grown_lens = alloc_lens.copy()
        grown_lens[grown] += entries
        return grown_lens

    def pages_to_grow(self, device_lens: np.ndarray, alloc_lens: np.ndarray) -> np.ndarray:
        """Per row, the pages ``allocate`` adds to back ``device_lens`` (0 where it holds them)."""
        return np.maximum(-(-device_lens // self.page_size) - alloc_lens // self.page_size, 0)

    def cache_req(self, req: Req, *, finished: bool) -> None:
        """Insert the request's computed KV into the prefix cache.

        finished: give everything back (cached pages stay in the cache, unlocked; the rest is
        freed). Otherwise the request keeps running on the cached prefix, now locked in its
        place, and keeps its private tail.
        """
        valid_len = min(req.cached_len, len(req.input_ids))
        insert_len = max(self.prefix.insertable_len(valid_len), req.matched_len)
        row = torch.from_numpy(self.tables.page_table_np[req.slot, : req.alloc_len].copy())
        existing = req.matched_len
        if insert_len > req.matched_len:
            existing = self.prefix.insert(req.input_ids[:insert_len], row[:insert_len])
        assert existing >= req.matched_len, "the request's own locked prefix must be cached"
        self.allocator.free(row[req.matched_len : existing])  # NOTE: duplicates of cached pages
        self.prefix.unlock(req.handle)
        if finished:
            self.allocator.free(row[insert_len:])
            self.num_private_pages -= (req.alloc_len - req.matched_len) // self.page_size
            return
        match = self.prefix.match(req.input_ids[:insert_len])
        assert match.length == insert_len
        self.prefix.lock(match.handle)
        self.tables.write_locations(req.slot, req.matched_len, match.locations[req.matched_len : existing])
        self.num_private_pages -= (insert_len - req.matched_len) // self.page_size
        req.handle, req.matched_len = match.handle, insert_len

    def check_integrity(self, running: Sequence[Req] | None = None) -> None:
        """Assert free + cached + private == total with no page in two places.

        ``running``: requests holding private pages (their rows are checked page by page).
        """
        free = self.allocator.free_pages()
        cached = self.prefix.all_locations()[:: self.page_size] // self.page_size
        parts = [free, cached.to(torch.int32)]
        private = 0
        for req in running or []:
            row = self.tables.page_table_cpu[req.slot, req.matched_len : req.alloc_len]
            parts.append((row[:: self.page_size] // self.page_size).to(torch.int32))
            private += (req.alloc_len - req.matched_len) // self.page_size
        assert private == self.num_private_pages, (
            f"private pages: counted {self.num_private_pages}, running requests hold {private}"
        )
        assert len(cached) * self.page_size == self.prefix.num_cached_tokens, "cache size counter drifted"
        everything = torch.cat(parts)
        total = int(everything.numel())
        assert total == self.num_pages, (
            f"free {len(free)} + cached {len(cached)} + private {private} != {self.num_pages}"
        )
        assert int(torch.unique(everything).numel()) == total, "a KV page is in two places"
