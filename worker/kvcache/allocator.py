"""Free-list allocator of KV pages; hands out KV locations (page_size consecutive rows a page)."""

from __future__ import annotations

import numpy as np
import torch


def pages_to_locations(pages: torch.Tensor, page_size: int) -> torch.Tensor:
    """Page indices [P] -> int32 locations [P * page_size], page by page."""
    offsets = torch.arange(page_size, dtype=torch.int32)
    return (pages.to(torch.int32).view(-1, 1) * page_size + offsets).view(-1)


def locations_to_pages(locations: torch.Tensor, page_size: int) -> torch.Tensor:
    """The pages of a page-aligned run of locations (every page_size-th entry starts a page)."""
    return (locations[::page_size] // page_size).to(torch.int32)


class PageAllocator:
    """Owns the free pages of the KV pool. Pages are never handed out twice before being freed.

    The free pages sit in a ring (a preallocated array as long as the pool): ``allocate`` takes
    from its head, ``free`` appends at its tail, so pages go out in the order they came back
    (first the pool in index order) and neither costs more than the pages it moves.
    """

    def __init__(self, num_pages: int, page_size: int) -> None:
        if num_pages <= 0 or page_size <= 0:
            raise ValueError(f"num_pages={num_pages}, page_size={page_size}: both must be > 0")
        self.num_pages = num_pages
        self.page_size = page_size
        self._ring = np.arange(num_pages, dtype=np.int32)  # free pages at [head, head + count), wrapped
        self._head = 0
        self._count = num_pages
        self._offsets = np.arange(page_size, dtype=np.int32)

    @property
    def num_free_pages(self) -> int:
        return self._count

    def allocate(self, num_pages: int) -> torch.Tensor:
        """Take ``num_pages`` free pages and return their locations (int32, CPU)."""
        if num_pages > self._count:
            raise MemoryError(f"asked for {num_pages} KV pages, {self._count} free")
        pages = self._ring.take(np.arange(self._head, self._head + num_pages), mode="wrap")
        self._head = (self._head + num_pages) % self.num_pages
        self._count -= num_pages
        return torch.from_numpy((pages[:, None] * self.page_size + self._offsets).reshape(-1))

    def free(self, locations: torch.Tensor) -> None:
        """Give back the pages of a page-aligned run of locations."""
        if locations.numel() == 0:
            return
        assert locations.numel() % self.page_size == 0, "free takes whole pages"
        pages = locations.cpu().numpy()[:: self.page_size] // self.page_size
        assert self._count + len(pages) <= self.num_pages, "more pages freed than the pool holds"
        tail = np.arange(self._head + self._count, self._head + self._count + len(pages)) % self.num_pages
        self._ring[tail] = pages
        self._count += len(pages)

    def free_pages(self) -> torch.Tensor:
        """A copy of the free page indices (for integrity checks)."""
        held = np.arange(self._head, self._head + self._count) % self.num_pages
        return torch.from_numpy(self._ring[held].copy())
