"""The prefix cache interface and its registry (radix tree, or naive: no sharing)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, NamedTuple

import torch

from worker.kvcache.names import PREFIX_CACHES
from worker.lazy import load_callable


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
    def want(self, handle: Any) -> None:
        """Mark the matched path as wanted by waiting requests: evicted after unwanted entries
        (counted like ``lock``)."""

    @abstractmethod
    def unwant(self, handle: Any) -> None:
        """Undo one ``want`` (the path may have been evicted meanwhile)."""

    @abstractmethod
    def insert(self, token_ids: list[int], locations: torch.Tensor) -> int:
        """Cache ``token_ids`` (a whole number of pages) at ``locations``.

        Returns how many leading tokens were already cached: the caller still owns its
        locations for that range (duplicates, to be freed); the cache owns the rest.
        """

    @abstractmethod
    def evict(self, num_tokens: int) -> torch.Tensor:
        """Drop at least ``num_tokens`` unlocked tokens if possible, unwanted ones first, least
        recently used first; return their locations."""

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


def create_prefix_cache(kind: str, page_size: int) -> PrefixCache:
    """The prefix cache called ``kind`` ("radix" or "naive")."""
    if kind not in PREFIX_CACHES:
        raise ValueError(f"cache={kind!r}: unknown prefix cache (known: {sorted(PREFIX_CACHES)})")
    cache: PrefixCache = load_callable(kind, PREFIX_CACHES, "prefix cache")(page_size)
    return cache
