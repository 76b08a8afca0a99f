"""A radix tree over token ids whose values are KV locations (whole pages), shared by all jobs.

Every edge holds a whole number of pages; children are keyed by their first page of tokens,
so a split always falls on a page boundary. ``ref_count`` of a node counts the locks on it
or on any descendant: a node with ref_count 0 may be evicted once it is a leaf. ``wanted``
counts the same way the prefixes waiting requests want: they are evicted last.

Eviction candidates wait in a heap keyed (wanted > 0, last_access), kept lazily: an entry is
pushed when a node becomes an evictable leaf (inserted, unlocked, its last child evicted) or
its key drops (unwanted), and checked when popped (gone, locked, grown a child: dropped; key
grown since: pushed again). Invariant: every evictable leaf has an entry whose key is at most
its current one, so the first valid entry popped is the least recently used leaf, and
eviction costs what it evicts, not the size of the tree.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Any

import torch

from worker.kvcache.prefix import Match, PrefixCache

_EMPTY = torch.empty(0, dtype=torch.int32)


class _Node:
    __slots__ = ("key", "value", "parent", "children", "ref_count", "wanted", "last_access", "evicted")

    def __init__(self, key: list[int], value: torch.Tensor, parent: _Node | None) -> None:
        self.key = key
        self.value = value  # int32 locations, len(value) == len(key)
        self.parent = parent
        self.children: dict[tuple[int, ...], _Node] = {}
        self.ref_count = 0
        self.wanted = 0  # wants on this node or a descendant (waiting requests' prefixes)
        self.last_access = 0
        self.evicted = False  # NOTE: its parent link stays, for unwant of a stale handle


def _order(node: _Node, seq: int) -> tuple[bool, int, int, int, _Node]:
    """Eviction order: unwanted before wanted, then least recently used (``seq`` keeps a
    node's stale entries apart from its current one)."""
    return (node.wanted > 0, node.last_access, id(node), seq, node)


class RadixCache(PrefixCache):
    def __init__(self, page_size: int) -> None:
        super().__init__(page_size)
        self._root = _Node([], _EMPTY, None)
        self._root.ref_count = 1  # NOTE: the root is never evictable
        self._clock = itertools.count(1)
        self._num_cached = 0
        self._num_evictable = 0
        self._num_nodes = 0  # below the root
        self._candidates: list[tuple[bool, int, int, int, _Node]] = []  # the eviction heap
        self._seq = itertools.count()

    def _evictable_leaf(self, node: _Node) -> bool:
        return node.ref_count == 0 and not node.children and not node.evicted and node is not self._root

    def _offer(self, node: _Node) -> None:
        """Push ``node`` as an eviction candidate if it is an evictable leaf now. When stale
        entries outnumber the nodes, the heap is rebuilt in place from the evictable leaves."""
        if not self._evictable_leaf(node):
            return
        heap = self._candidates
        heapq.heappush(heap, _order(node, next(self._seq)))
        if len(heap) > 2 * self._num_nodes + 1024:
            heap[:] = [_order(n, next(self._seq)) for n in self._nodes() if self._evictable_leaf(n)]
            heapq.heapify(heap)

    def _common_len(self, key: list[int], token_ids: list[int], start: int) -> int:
        limit = min(len(key), len(token_ids) - start)
        if token_ids[start : start + limit] == key[:limit]:  # NOTE: the whole edge, compared in C
            return limit - limit % self.page_size
        n = 0
        while n < limit and key[n] == token_ids[start + n]:
            n += 1
        return n - n % self.page_size

    def _split(self, node: _Node, at: int) -> _Node:
        """Cut ``node``'s edge after ``at`` tokens; return the new upper node."""
        parent = node.parent
        assert parent is not None and 0 < at < len(node.key) and at % self.page_size == 0
        upper = _Node(node.key[:at], node.value[:at], parent)
        self._num_nodes += 1
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
                self._offer(node)
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
            if node.wanted == 0:
                self._offer(node)  # its key dropped
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
            self._num_nodes += 1
            self._offer(leaf)
        return existing

    def evict(self, num_tokens: int) -> torch.Tensor:
        if num_tokens <= 0:
            return _EMPTY
        heap = self._candidates
        evicted: list[torch.Tensor] = []
        count = 0
        while heap and count < num_tokens:
            wanted, last_access, _, _, node = heapq.heappop(heap)
            if node.evicted or node.children or node.ref_count:
                continue  # pushed again when it is an evictable leaf again
            if (node.wanted > 0, node.last_access) != (wanted, last_access):
                self._offer(node)  # touched since: its current key
                continue
            parent = node.parent
            assert parent is not None
            del parent.children[tuple(node.key[: self.page_size])]
            node.evicted = True
            evicted.append(node.value)
            count += len(node.key)
            self._num_cached -= len(node.key)
            self._num_evictable -= len(node.key)
            self._num_nodes -= 1
            self._offer(parent)
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
