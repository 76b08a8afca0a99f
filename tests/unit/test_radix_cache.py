"""Radix prefix cache: matches what was inserted, never loses or double-owns a page.

The oracle is a plain dict from every inserted page-aligned prefix to the locations it was
first inserted with; the cache must agree with it for every prefix it still holds.
"""

from __future__ import annotations

import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from worker.kvcache.allocator import PageAllocator
from worker.kvcache.prefix import create_prefix_cache
from worker.kvcache.radix import RadixCache

NUM_PAGES = 24


def _insert_fresh(cache: RadixCache, alloc: PageAllocator, tokens: list[int]) -> torch.Tensor:
    locs = alloc.allocate(len(tokens) // cache.page_size)
    existing = cache.insert(tokens, locs)
    alloc.free(locs[:existing])
    return locs


def test_match_split_and_shared_prefix() -> None:
    cache, alloc = RadixCache(2), PageAllocator(16, 2)
    a = _insert_fresh(cache, alloc, [1, 2, 3, 4, 5, 6])
    b_locs = alloc.allocate(3)
    existing = cache.insert([1, 2, 3, 4, 9, 9], b_locs)
    assert existing == 4  # two shared pages; the caller frees its duplicates
    alloc.free(b_locs[:existing])
    m = cache.match([1, 2, 3, 4, 9, 9, 7])
    assert m.length == 6 and m.locations[:4].tolist() == a[:4].tolist()
    assert m.locations[4:].tolist() == b_locs[4:].tolist()
    assert cache.match([1, 2, 3, 5]).length == 2  # only whole pages match
    assert cache.num_cached_tokens == 8


def test_lock_protects_from_eviction_and_lru_order() -> None:
    cache, alloc = RadixCache(1), PageAllocator(16, 1)
    _insert_fresh(cache, alloc, [1, 2, 3])
    _insert_fresh(cache, alloc, [7, 8])
    _insert_fresh(cache, alloc, [9])
    cache.match([9])  # touch: [7, 8] is now the least recently used unlocked leaf
    m = cache.match([1, 2, 3])
    cache.lock(m.handle)
    assert cache.num_evictable_tokens == 3
    evicted = cache.evict(1)
    assert evicted.numel() == 2  # the [7, 8] leaf (older than [9]); [1, 2, 3] is locked
    assert cache.match([7, 8]).length == 0 and cache.match([9]).length == 1
    assert cache.evict(100).numel() == 1
    assert cache.match([1, 2, 3]).length == 3
    cache.unlock(m.handle)
    assert cache.evict(100).numel() == 3 and cache.num_cached_tokens == 0


def test_wanted_leaves_go_last_and_in_lru_order_once_unwanted() -> None:
    """A wanted leaf outlives older unwanted ones; unwanted again, it is evicted by its age."""
    cache, alloc = RadixCache(1), PageAllocator(16, 1)
    _insert_fresh(cache, alloc, [1, 2])
    _insert_fresh(cache, alloc, [3, 4])
    wanted = cache.match([1, 2]).handle
    cache.want(wanted)  # [1, 2] is now the most recently used, and wanted
    cache.match([3, 4])  # [3, 4] is the most recently used
    assert cache.evict(1).numel() == 2 and cache.match([3, 4]).length == 0  # the unwanted one first
    _insert_fresh(cache, alloc, [5, 6])
    cache.unwant(wanted)  # [1, 2] is older than [5, 6]: it goes first now
    assert cache.evict(1).numel() == 2 and cache.match([1, 2]).length == 0
    assert cache.match([5, 6]).length == 2


def test_naive_cache_never_shares() -> None:
    cache = create_prefix_cache("naive", 4)
    assert cache.match([1, 2, 3, 4, 5]).length == 0
    assert cache.insertable_len(100) == 0 and cache.num_cached_tokens == 0


def lru_eviction(cache: RadixCache, num_tokens: int) -> list[int]:
    """The locations ``evict(num_tokens)`` must return, by brute force over the whole tree: the
    unlocked leaf that is unwanted before wanted, then least recently used, again and again
    (a parent whose children are all gone is a leaf), until ``num_tokens`` are out."""
    nodes, stack = [], list(cache._root.children.values())
    while stack:
        node = stack.pop()
        nodes.append(node)
        stack.extend(node.children.values())
    gone: set[int] = set()
    out: list[int] = []
    while len(out) < num_tokens:
        leaves = [
            n
            for n in nodes
            if id(n) not in gone and n.ref_count == 0 and all(id(c) in gone for c in n.children.values())
        ]
        if not leaves:
            break
        oldest = min(leaves, key=lambda n: (n.wanted > 0, n.last_access))
        gone.add(id(oldest))
        out += oldest.value.tolist()
    return out


class RadixMachine(RuleBasedStateMachine):
    """Random match/insert/lock/unlock/want/unwant/evict/free sequences against a dict oracle
    (what is cached) and a brute-force LRU (what is evicted)."""

    def __init__(self) -> None:
        super().__init__()
        self.page_size = 2
        self.cache = RadixCache(self.page_size)
        self.alloc = PageAllocator(NUM_PAGES, self.page_size)
        self.oracle: dict[tuple[int, ...], list[int]] = {}  # page-aligned prefix -> its locations
        self.locks: list[tuple[object, tuple[int, ...]]] = []
        self.wants: list[object] = []
        self.private: list[torch.Tensor] = []  # pages a "request" holds outside the cache

    @rule(tokens=st.lists(st.integers(0, 2), min_size=2, max_size=10))
    def insert(self, tokens: list[int]) -> None:
        tokens = tokens[: len(tokens) - len(tokens) % self.page_size]
        need = len(tokens) // self.page_size
        if need > self.alloc.num_free_pages:
            self.alloc.free(self.cache.evict((need - self.alloc.num_free_pages) * self.page_size))
        if need > self.alloc.num_free_pages:
            return
        locs = self.alloc.allocate(need)
        existing = self.cache.insert(tokens, locs)
        m = self.cache.match(tokens)
        assert m.length == len(tokens)
        assert m.locations[existing:].tolist() == locs[existing:].tolist()
        self.alloc.free(locs[:existing])
        for end in range(self.page_size, len(tokens) + 1, self.page_size):
            key = tuple(tokens[:end])
            if end > existing:
                self.oracle[key] = m.locations[:end].tolist()

    @rule(tokens=st.lists(st.integers(0, 2), max_size=10))
    def match_and_lock(self, tokens: list[int]) -> None:
        m = self.cache.match(tokens)
        assert m.length % self.page_size == 0 and m.length <= len(tokens)
        prefix = tuple(tokens[: m.length])
        if m.length:
            assert self.oracle[prefix] == m.locations.tolist()
        self.cache.lock(m.handle)
        self.locks.append((m.handle, prefix))

    @precondition(lambda self: self.locks)
    @rule(which=st.integers(0, 100))
    def unlock(self, which: int) -> None:
        handle, _ = self.locks.pop(which % len(self.locks))
        self.cache.unlock(handle)

    @rule(tokens=st.lists(st.integers(0, 2), max_size=10))
    def want(self, tokens: list[int]) -> None:
        handle = self.cache.match(tokens).handle
        self.cache.want(handle)
        self.wants.append(handle)

    @precondition(lambda self: self.wants)
    @rule(which=st.integers(0, 100))
    def unwant(self, which: int) -> None:
        self.cache.unwant(self.wants.pop(which % len(self.wants)))

    @rule(n=st.integers(0, 12))
    def evict(self, n: int) -> None:
        before = self.cache.num_cached_tokens
        expected = lru_eviction(self.cache, n)
        evicted = self.cache.evict(n)
        assert evicted.tolist() == expected, "not the least recently used unlocked leaves, unwanted first"
        assert before - self.cache.num_cached_tokens == evicted.numel()
        self.alloc.free(evicted)
        for key in [k for k in self.oracle if self.cache.match(list(k)).length < len(k)]:
            del self.oracle[key]

    @rule(n=st.integers(1, 3))
    def hold_private(self, n: int) -> None:
        if n <= self.alloc.num_free_pages:
            self.private.append(self.alloc.allocate(n))

    @precondition(lambda self: self.private)
    @rule()
    def free_private(self) -> None:
        self.alloc.free(self.private.pop())

    @invariant()
    def pages_partitioned(self) -> None:
        ps = self.page_size
        parts = [self.alloc.free_pages(), self.cache.all_locations()[::ps] // ps]
        parts += [p[::ps] // ps for p in self.private]
        everything = torch.cat(parts).tolist()
        assert sorted(everything) == list(range(NUM_PAGES)), "a page leaked or is in two places"
        assert self.cache.num_cached_tokens == self.cache.all_locations().numel()

    @invariant()
    def locked_paths_survive(self) -> None:
        for _, prefix in self.locks:
            m = self.cache.match(list(prefix))
            assert m.length == len(prefix), "a locked prefix was evicted"
        evictable = self.cache.num_evictable_tokens
        assert 0 <= evictable <= self.cache.num_cached_tokens


RadixMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestRadixMachine = RadixMachine.TestCase
