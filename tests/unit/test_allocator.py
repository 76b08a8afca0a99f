"""PageAllocator: pages are handed out at most once until freed, locations are whole pages."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.kvcache.allocator import PageAllocator, locations_to_pages, pages_to_locations


def test_locations_are_runs_of_page_size() -> None:
    locs = pages_to_locations(torch.tensor([3, 0], dtype=torch.int32), 4)
    assert locs.tolist() == [12, 13, 14, 15, 0, 1, 2, 3]
    assert locations_to_pages(locs, 4).tolist() == [3, 0]


def test_over_allocation_raises_and_loses_nothing() -> None:
    alloc = PageAllocator(4, 2)
    alloc.allocate(3)
    with pytest.raises(MemoryError):
        alloc.allocate(2)
    assert alloc.num_free_pages == 1


@settings(max_examples=60, deadline=None)
@given(
    page_size=st.sampled_from([1, 2, 16]),
    ops=st.lists(st.tuples(st.booleans(), st.integers(0, 5)), max_size=40),
)
def test_no_page_is_handed_out_twice(page_size: int, ops: list[tuple[bool, int]]) -> None:
    num_pages = 12
    alloc = PageAllocator(num_pages, page_size)
    held: list[torch.Tensor] = []
    for is_alloc, n in ops:
        if is_alloc:
            if n <= alloc.num_free_pages:
                held.append(alloc.allocate(n))
        elif held:
            alloc.free(held.pop(n % len(held)))
        in_use = torch.cat(held) if held else torch.empty(0, dtype=torch.int32)
        in_use_pages = locations_to_pages(in_use, page_size) if in_use.numel() else in_use
        everything = torch.cat([alloc.free_pages(), in_use_pages])
        assert sorted(everything.tolist()) == list(range(num_pages))
        for locs in held:
            assert (locs % page_size == torch.arange(len(locs)) % page_size).all()
