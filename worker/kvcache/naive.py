"""The no-sharing cache: never matches, never keeps anything (ablation baseline)."""

from __future__ import annotations

from typing import Any

import torch

from worker.kvcache.prefix import Match, PrefixCache

_EMPTY = torch.empty(0, dtype=torch.int32)


class NaiveCache(PrefixCache):
    def match(self, token_ids: list[int]) -> Match:
        return Match(handle=None, length=0, locations=_EMPTY)

    def lock(self, handle: Any) -> None:
        pass

    def unlock(self, handle: Any) -> None:
        pass

    def want(self, handle: Any) -> None:
        pass

    def unwant(self, handle: Any) -> None:
        pass

    def insert(self, token_ids: list[int], locations: torch.Tensor) -> int:
        assert not token_ids, "the naive cache takes nothing (insertable_len is 0)"
        return 0

    def evict(self, num_tokens: int) -> torch.Tensor:
        return _EMPTY

    def insertable_len(self, num_tokens: int) -> int:
        return 0

    @property
    def num_cached_tokens(self) -> int:
        return 0

    @property
    def num_evictable_tokens(self) -> int:
        return 0

    def all_locations(self) -> torch.Tensor:
        return _EMPTY
