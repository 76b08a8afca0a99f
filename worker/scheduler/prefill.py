"""PrefillManager: the pending queue, admission (slot + pages + prefix match) and chunking."""

from __future__ import annotations

from collections import deque

from worker.engine.penalties import needs_token_history
from worker.scheduler.cache import CacheManager
from worker.scheduler.req import ChunkedReq, PendingReq, Req, RequestGroup, output_reserve
from worker.scheduler.table import TableManager

_SHARE_PROBE_TOKENS = 32


class _BatchPrefixes:
    """Prefixes (at multiples of ``probe`` tokens) of the prompts admitted in this batch, as
    chained hashes: O(prompt length) per prompt. A hash collision only delays a request a step."""

    def __init__(self, probe: int) -> None:
        self.probe = probe
        self._hashes: set[int] = set()

    def _chain(self, input_ids: list[int], end: int) -> list[int]:
        hashes, h = [], 0
        for stop in range(self.probe, end + 1, self.probe):
            h = hash((h, tuple(input_ids[stop - self.probe : stop])))
            hashes.append(h)
        return hashes

    def add(self, input_ids: list[int]) -> None:
        self._hashes.update(self._chain(input_ids, len(input_ids) - 1))

    def extends(self, input_ids: list[int], matched_len: int) -> bool:
        """Whether a batch member shares at least the next probe boundary past ``matched_len``."""
        end = (matched_len // self.probe + 1) * self.probe
        return end < len(input_ids) and self._chain(input_ids, end)[-1] in self._hashes


class PrefillManager:
    """Picks this step's prefill batch under a token budget, oldest first.

    Admission reserves KV for the whole prompt plus ``output_reserve_ratio`` of its output,
    on top of what running requests already reserve; a prompt larger than the remaining
    budget is cut into ChunkedReqs, one chunk a step, until its last chunk.
    """

    def __init__(self, cache: CacheManager, tables: TableManager, output_reserve_ratio: float) -> None:
        self.cache = cache
        self.tables = tables
        self.output_reserve_ratio = output_reserve_ratio
        self.pending: deque[PendingReq] = deque()

    @property
    def runnable(self) -> bool:
        return len(self.pending) > 0

    def add(self, req: PendingReq) -> None:
        self.pending.append(req)

    def add_front(self, reqs: list[PendingReq]) -> None:
        self.pending.extendleft(reversed(reqs))

    def remove(self, group: RequestGroup) -> list[PendingReq]:
        """Drop the pending requests of ``group``; return them."""
        gone = [p for p in self.pending if p.group is group]
        self.pending = deque(p for p in self.pending if p.group is not group)
        return gone

    def schedule(self, token_budget: int, reserved_tokens: int) -> list[Req]:
        """This step's prefill requests (possibly empty); admitted ones leave the queue."""
        batch: list[Req] = []
        shared = _BatchPrefixes(max(_SHARE_PROBE_TOKENS, self.cache.page_size))
        while self.pending and token_budget > 0:
            pending = self.pending[0]
            if pending.chunk is not None:
                req = self._continue(pending, token_budget)
                if not self.cache.can_allocate([*batch, req]):
                    break  # NOTE: a continuing chunk waits until its pages can be had
            else:
                admitted = self._admit(pending, token_budget, reserved_tokens, shared)
                if admitted is None:
                    break
                req, reserved_tokens = admitted
            shared.add(pending.input_ids)
            batch.append(req)
            token_budget -= req.extend_len
            if isinstance(req, ChunkedReq):
                pending.chunk = req
                break  # the budget is spent: a chunk takes all that is left
            self.pending.popleft()
        return batch

    def _make(
        self,
        pending: PendingReq,
        token_budget: int,
        *,
        slot: int,
        cached_len: int,
        handle: object,
        matched_len: int,
        alloc_len: int,
    ) -> Req:
        prompt_end = len(pending.input_ids)
        chunk_end = min(prompt_end, cached_len + token_budget)
        cls = ChunkedReq if chunk_end < prompt_end else Req
        return cls(
            pending=pending,
            slot=slot,
            cached_len=cached_len,
            device_len=chunk_end,
            max_device_len=pending.max_device_len,
            handle=handle,
            matched_len=matched_len,
            alloc_len=alloc_len,
        )

    def _continue(self, pending: PendingReq, token_budget: int) -> Req:
        chunk = pending.chunk
        assert chunk is not None
        return self._make(
            pending,
            token_budget,
            slot=chunk.slot,
            cached_len=chunk.cached_len,
            handle=chunk.handle,
            matched_len=chunk.matched_len,
            alloc_len=chunk.alloc_len,
        )

    def _admit(
        self, pending: PendingReq, token_budget: int, reserved_tokens: int, shared: _BatchPrefixes
    ) -> tuple[Req, int] | None:
        """Promote to a Req: take a slot, match and lock the prefix; None if it does not fit
        or if a request of this batch is computing more of its prefix (it waits one step,
        then matches that prefix in the cache)."""
        if self.tables.num_free_slots == 0:
            return None
        match = self.cache.match(pending.input_ids)
        if self.cache.shares_prefixes and shared.extends(pending.input_ids, match.length):
            return None
        remain = pending.max_device_len - len(pending.input_ids)
        reserve = output_reserve(remain, self.output_reserve_ratio)
        need = len(pending.input_ids) - match.length + reserve + self.cache.page_size
        self.cache.lock(match)
        if need + reserved_tokens > self.cache.available_pages * self.cache.page_size:
            self.cache.unlock(match)
            return None
        slot = self.tables.allocate()
        self.tables.write_locations(slot, 0, match.locations)
        # NOTE: penalties read a request's whole history from the token pool (worker.engine.penalties)
        written = 0 if needs_token_history(pending.sampling) else match.length
        self.tables.write_tokens(slot, written, pending.input_ids[written:])
        group = pending.group
        if group.cached_tokens is None:
            group.cached_tokens = min(match.length, group.prompt_len)
        req = self._make(
            pending,
            token_budget,
            slot=slot,
            cached_len=match.length,
            handle=match.handle,
            matched_len=match.length,
            alloc_len=match.length,
        )
        return req, reserved_tokens + need
