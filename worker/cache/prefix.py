"""The prefix cache interface and its registry (radix tree, or naive: no sharing)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, NamedTuple

import torch


class Match(NamedTuple):
    """A matched prefix: ``length`` tokens whose KV lives at ``locations`` (int32, CPU).

    ``handle`` pins the matched path: lock it before using the locations, unlock when done.
    """

    handle: Any
    length: int
    locations: torch.Tensor


class PrefixCache(ABC):
    """Maps token-id prefixes to KV locations it owns; evicts unlocked entries on demand.

    Contract: every location the cache owns came from ``insert`` and leaves it only through
    ``evict`` (the caller then frees it). Lengths are multiples of ``page_size``.
    """

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size

    @abstractmethod
    def match(self, token_ids: list[int]) -> Match:
        """Longest cached prefix of ``token_ids`` (whole pages only)."""

    @abstractmethod
    def lock(self, handle: Any) -> None:
        """Protect the matched path from eviction (counted: lock twice, unlock twice)."""

    @abstractmethod
    def unlock(self, handle: Any) -> None:
        """Undo one ``lock``."""

    @abstractmethod
    def insert(self, token_ids: list[int], locations: torch.Tensor) -> int:
        """Cache ``token_ids`` (a whole number of pages) at ``locations``.

        Returns how many leading tokens were already cached: the caller still owns its
        locations for that range (duplicates, to be freed); the cache owns the rest.
        """

    @abstractmethod
    def evict(self, num_tokens: int) -> torch.Tensor:
        """Drop at least ``num_tokens`` unlocked tokens if possible (LRU); return their locations."""

    @abstractmethod
    def insertable_len(self, num_tokens: int) -> int:
        """How many of ``num_tokens`` computed tokens ``insert`` would take."""

    @property
    @abstractmethod
    def num_cached_tokens(self) -> int:
        """Tokens the cache owns, locked or not."""

    @property
    @abstractmethod
    def num_evictable_tokens(self) -> int:
        """Tokens the cache owns that no lock protects."""

    @abstractmethod
    def all_locations(self) -> torch.Tensor:
        """Every location the cache owns (computed from the structure, for integrity checks)."""


_REGISTRY: dict[str, Callable[[int], PrefixCache]] = {}


def register(name: str) -> Callable[[Callable[[int], PrefixCache]], Callable[[int], PrefixCache]]:
    def wrap(factory: Callable[[int], PrefixCache]) -> Callable[[int], PrefixCache]:
        _REGISTRY[name] = factory
        return factory

    return wrap


@register("radix")
def _radix(page_size: int) -> PrefixCache:
    from worker.cache.radix import RadixCache

    return RadixCache(page_size)


@register("naive")
def _naive(page_size: int) -> PrefixCache:
    from worker.cache.naive import NaiveCache

    return NaiveCache(page_size)


def create_prefix_cache(kind: str, page_size: int) -> PrefixCache:
    """The prefix cache called ``kind`` ("radix" or "naive")."""
    if kind not in _REGISTRY:
        raise ValueError(f"cache={kind!r}: unknown prefix cache (known: {sorted(_REGISTRY)})")
    return _REGISTRY[kind](page_size)
