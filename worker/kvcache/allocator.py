"""Free-list allocator of KV pages; hands out KV locations (page_size consecutive rows a page)."""

from __future__ import annotations

import torch


def pages_to_locations(pages: torch.Tensor, page_size: int) -> torch.Tensor:
    """Page indices [P] -> int32 locations [P * page_size], page by page."""
    offsets = torch.arange(page_size, dtype=torch.int32)
    return (pages.to(torch.int32).view(-1, 1) * page_size + offsets).view(-1)


def locations_to_pages(locations: torch.Tensor, page_size: int) -> torch.Tensor:
    """The pages of a page-aligned run of locations (every page_size-th entry starts a page)."""
    return (locations[::page_size] // page_size).to(torch.int32)


class PageAllocator:
    """Owns the free pages of the KV pool. Pages are never handed out twice before being freed."""

    def __init__(self, num_pages: int, page_size: int) -> None:
        if num_pages <= 0 or page_size <= 0:
            raise ValueError(f"num_pages={num_pages}, page_size={page_size}: both must be > 0")
        self.num_pages = num_pages
        self.page_size = page_size
        self._free_pages = torch.arange(num_pages, dtype=torch.int32)

    @property
    def num_free_pages(self) -> int:
        return int(self._free_pages.numel())

    def allocate(self, num_pages: int) -> torch.Tensor:
        """Take ``num_pages`` free pages and return their locations (int32, CPU)."""
        if num_pages > self.num_free_pages:
            raise MemoryError(f"asked for {num_pages} KV pages, {self.num_free_pages} free")
        pages = self._free_pages[:num_pages]
        self._free_pages = self._free_pages[num_pages:]
        return pages_to_locations(pages, self.page_size)

    def free(self, locations: torch.Tensor) -> None:
        """Give back the pages of a page-aligned run of locations."""
        if locations.numel() == 0:
            return
        assert locations.numel() % self.page_size == 0, "free takes whole pages"
        pages = locations_to_pages(locations.cpu(), self.page_size)
        self._free_pages = torch.cat([self._free_pages, pages])

    def free_pages(self) -> torch.Tensor:
        """A copy of the free page indices (for integrity checks)."""
        return self._free_pages.clone()
