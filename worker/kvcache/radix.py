"""A radix tree over token ids whose values are KV locations (whole pages), shared by all jobs.

Every edge holds a whole number of pages; children are keyed by their first page of tokens,
so a split always falls on a page boundary. ``ref_count`` of a node counts the locks on it
or on any descendant: a node with ref_count 0 may be evicted once it is a leaf. ``wanted``
counts the same way the prefixes waiting requests want: they are evicted last.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Any

import torch

from worker.kvcache.prefix import Match, PrefixCache

_EMPTY = torch.empty(0, dtype=torch.int32)


class _Node:
    __slots__ = ("key", "value", "parent", "children", "ref_count", "wanted", "last_access")

    def __init__(self, key: list[int], value: torch.Tensor, parent: _Node | None) -> None:
        self.key = key
        self.value = value  # int32 locations, len(value) == len(key)
        self.parent = parent
        self.children: dict[tuple[int, ...], _Node] = {}
        self.ref_count = 0
        self.wanted = 0  # wants on this node or a descendant (waiting requests' prefixes)
        self.last_access = 0


def _order(node: _Node) -> tuple[bool, int, int, _Node]:
    """Eviction order: unwanted before wanted, then least recently used."""
    return (node.wanted > 0, node.last_access, id(node), node)


class RadixCache(PrefixCache):
    def __init__(self, page_size: int) -> None:
        super().__init__(page_size)
        self._root = _Node([], _EMPTY, None)
        self._root.ref_count = 1  # NOTE: the root is never evictable
        self._clock = itertools.count(1)
        self._num_cached = 0
        self._num_evictable = 0

    def _common_len(self, key: list[int], token_ids: list[int], start: int) -> int:
        limit = min(len(key), len(token_ids) - start)
        n = 0
        while n < limit and key[n] == token_ids[start + n]:
            n += 1
        return n - n % self.page_size

    def _split(self, node: _Node, at: int) -> _Node:
        """Cut ``node``'s edge after ``at`` tokens; return the new upper node."""
        parent = node.parent
        assert parent is not None and 0 < at < len(node.key) and at % self.page_size == 0
        upper = _Node(node.key[:at], node.value[:at], parent)
        upper.ref_count = node.ref_count
        upper.wanted = node.wanted
        upper.last_access = node.last_access
        parent.children[tuple(node.key[: self.page_size])] = upper
        node.key = node.key[at:]
        node.value = node.value[at:]
        node.parent = upper
        upper.children[tuple(node.key[: self.page_size])] = node
        return upper

    def _walk(self, token_ids: list[int]) -> tuple[_Node, int, list[torch.Tensor]]:
        """Deepest node on ``token_ids``' path (splitting an edge if the path ends inside it)."""
        node, pos, values = self._root, 0, []
        now = next(self._clock)
        node.last_access = now
        while pos + self.page_size <= len(token_ids):
            child = node.children.get(tuple(token_ids[pos : pos + self.page_size]))
            if child is None:
                break
            common = self._common_len(child.key, token_ids, pos)
            if common < len(child.key):
                child = self._split(child, common)
            child.last_access = now
            values.append(child.value)
            node, pos = child, pos + common
        return node, pos, values

    def match(self, token_ids: list[int]) -> Match:
        node, length, values = self._walk(token_ids)
        locations = torch.cat(values) if values else _EMPTY
        return Match(handle=node, length=length, locations=locations)

    def lock(self, handle: Any) -> None:
        node: _Node | None = handle
        while node is not None:
            if node.ref_count == 0:
                self._num_evictable -= len(node.key)
            node.ref_count += 1
            node = node.parent

    def unlock(self, handle: Any) -> None:
        node: _Node | None = handle
        while node is not None:
            assert node.ref_count > 0, "unlock without lock"
            node.ref_count -= 1
            if node.ref_count == 0:
                self._num_evictable += len(node.key)
            node = node.parent

    def want(self, handle: Any) -> None:
        node: _Node | None = handle
        while node is not None:
            node.wanted += 1
            node = node.parent

    def unwant(self, handle: Any) -> None:
        node: _Node | None = handle
        while node is not None:
            assert node.wanted > 0, "unwant without want"
            node.wanted -= 1
            node = node.parent

    def insert(self, token_ids: list[int], locations: torch.Tensor) -> int:
        assert len(token_ids) % self.page_size == 0 and len(locations) == len(token_ids)
        node, existing, _ = self._walk(token_ids)
        if existing < len(token_ids):
            leaf = _Node(list(token_ids[existing:]), locations[existing:].clone(), node)
            leaf.last_access = node.last_access
            node.children[tuple(leaf.key[: self.page_size])] = leaf
            self._num_cached += len(leaf.key)
            self._num_evictable += len(leaf.key)
        return existing

    def evict(self, num_tokens: int) -> torch.Tensor:
        if num_tokens <= 0:
            return _EMPTY
        heap = [_order(n) for n in self._nodes() if not n.children and n.ref_count == 0]
        heapq.heapify(heap)
        evicted: list[torch.Tensor] = []
        count = 0
        while heap and count < num_tokens:
            node = heapq.heappop(heap)[-1]
            parent = node.parent
            assert parent is not None
            del parent.children[tuple(node.key[: self.page_size])]
            evicted.append(node.value)
            count += len(node.key)
            self._num_cached -= len(node.key)
            self._num_evictable -= len(node.key)
            if parent is not self._root and not parent.children and parent.ref_count == 0:
                heapq.heappush(heap, _order(parent))
        return torch.cat(evicted) if evicted else _EMPTY

    def insertable_len(self, num_tokens: int) -> int:
        return num_tokens - num_tokens % self.page_size

    @property
    def num_cached_tokens(self) -> int:
        return self._num_cached

    @property
    def num_evictable_tokens(self) -> int:
        return self._num_evictable

    def _nodes(self) -> list[_Node]:
        out, stack = [], list(self._root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def all_locations(self) -> torch.Tensor:
        values = [n.value for n in self._nodes()]
        return torch.cat(values) if values else _EMPTY
