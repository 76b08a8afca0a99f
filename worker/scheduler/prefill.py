"""PrefillManager: admission (slot + pages + prefix match) from the WaitQueue, and chunking."""

from __future__ import annotations

from contextlib import closing

from worker.engine.penalties import needs_token_history
from worker.kvcache.manager import CacheManager
from worker.kvcache.table import TableManager
from worker.scheduler.ledger import SlotLedger
from worker.scheduler.req import ChunkedReq, PendingReq, Req, RequestGroup, output_reserve
from worker.scheduler.waiting import WaitQueue

_SHARE_PROBE_TOKENS = 32  # in-batch sharing is probed, and prefix keys taken, at this granularity
_OVERTAKES_PER_SLOT = 4  # the age bound: later arrivals admitted ahead of the oldest, per slot
_DEFER = object()  # admission's answer when the request should wait one step for its prefix


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
    """Picks this step's prefill batch under a token budget, in the WaitQueue's policy order.

    Admission reserves KV for the whole prompt plus ``output_reserve_ratio`` of its output,
    on top of what running requests and a prompt being chunked already reserve, so one
    step's allocations never exceed the pages obtainable (free or evictable). A prompt larger
    than the remaining budget is cut into ChunkedReqs, one chunk a step, until its last chunk;
    at most one prompt is being chunked at a time (``chunked``) and it goes first each step.
    The requests it builds keep their lengths in ``ledger`` (worker.scheduler.ledger).
    """

    def __init__(
        self,
        cache: CacheManager,
        tables: TableManager,
        ledger: SlotLedger,
        output_reserve_ratio: float,
        policy: str = "lpm",
    ) -> None:
        self.cache = cache
        self.tables = tables
        self.ledger = ledger
        self.output_reserve_ratio = output_reserve_ratio
        self.probe = max(_SHARE_PROBE_TOKENS, cache.page_size)
        max_overtakes = _OVERTAKES_PER_SLOT * tables.max_running_reqs
        self.waiting = WaitQueue(policy, self.probe, max_overtakes, cache.prefix)
        self.chunked: PendingReq | None = None  # its ``chunk`` holds a slot and pages
        # NOTE: an n > 1 job takes at most half the slots while other jobs wait for one (an
        # n=64 job took all 32 of a CPU worker's, and short jobs waited minutes behind it)
        self.group_slots = max(1, tables.max_running_reqs // 2)

    @property
    def runnable(self) -> bool:
        return self.chunked is not None or len(self.waiting) > 0

    def add(self, req: PendingReq) -> None:
        self.waiting.add(req)

    def add_front(self, reqs: list[PendingReq]) -> None:
        self.waiting.add_requeued(reqs)

    def head(self) -> PendingReq | None:
        """The request admission would try first."""
        return self.chunked if self.chunked is not None else self.waiting.head()

    def drop_chunk(self) -> Req | None:
        """Stop chunking: requeue the prompt (its computed chunks stay cached once the caller
        releases the returned ChunkedReq)."""
        pending = self.chunked
        if pending is None:
            return None
        chunk, pending.chunk, self.chunked = pending.chunk, None, None
        self.add_front([pending])
        return chunk

    def remove(self, group: RequestGroup) -> list[PendingReq]:
        """Drop the pending requests of ``group``; return them (with their chunk, if any)."""
        gone = self.waiting.remove(lambda p: p.group is not group)
        if self.chunked is not None and self.chunked.group is group:
            gone.append(self.chunked)
            self.chunked = None
        return gone

    def cached(self, req: Req) -> None:
        """``req``'s prefill was launched and its prompt KV inserted in the prefix cache."""
        self.waiting.cached(req.pending, req.handle, req.matched_len)

    def schedule(self, token_budget: int, reserved_tokens: int, decoding_pages: int = 0) -> list[Req]:
        """This step's prefill requests (possibly empty); admitted ones leave the queue.

        ``reserved_tokens``: KV the running requests are expected to still need, this step's
        decoding batch included; ``decoding_pages``: the pages that batch takes this step.
        While others wait, a prompt being chunked takes half the budget, so short jobs are not
        held up behind a long one."""
        batch: list[Req] = []
        shared = _BatchPrefixes(self.probe)
        if self.chunked is not None:
            pending = self.chunked
            share = token_budget // 2 if len(self.waiting) > 0 and token_budget > 1 else token_budget
            chunk = pending.chunk
            assert chunk is not None
            end = min(len(pending.input_ids), chunk.cached_len + share)
            grow = max(0, self.cache.pages_for(end) - chunk.alloc_len // self.cache.page_size)
            if grow + decoding_pages > self.cache.available_pages:
                return []  # NOTE: it waits for pages (decoding frees them, or drops this chunk)
            req = self._continue(pending, share)  # NOTE: only now: it rewrites the slot's ledger row
            reserved_tokens += self._future_tokens(req)
            shared.add(pending.input_ids)
            batch.append(req)
            token_budget -= req.extend_len
            if isinstance(req, ChunkedReq):
                pending.chunk = req
            else:
                pending.chunk, self.chunked = None, None
        with closing(self.waiting.offer()) as buckets:
            for bucket in buckets:
                while bucket.reqs and token_budget > 0:
                    pending = bucket.reqs[0]
                    if pending.group.slots >= self.group_slots and self._others_wait():
                        break  # its siblings wait while another job takes a slot
                    admitted = self._admit(pending, token_budget, reserved_tokens, shared)
                    if admitted is _DEFER:
                        break  # its prefix is being computed by this batch: next bucket
                    if admitted is None:
                        return batch
                    assert isinstance(admitted, tuple)
                    req, reserved_tokens = admitted
                    self.waiting.take(bucket, req.handle, req.matched_len)
                    shared.add(pending.input_ids)
                    batch.append(req)
                    token_budget -= req.extend_len
                    if isinstance(req, ChunkedReq):
                        pending.chunk, self.chunked = req, pending
                        return batch  # the budget is spent: a chunk takes all that is left
                if token_budget <= 0:
                    break
        return batch

    def _others_wait(self) -> bool:
        """Whether a request other than the requeued ones (siblings, retracted) waits."""
        return len(self.waiting) > len(self.waiting.requeued.reqs)

    def _future_tokens(self, req: Req) -> int:
        """KV tokens ``req`` may still take beyond its pages: the rest of its prompt, its
        output reserve and a page of rounding (what its admission reserved, less what it holds)."""
        prompt_end = len(req.input_ids)
        reserve = output_reserve(req.max_device_len - prompt_end, self.output_reserve_ratio)
        return prompt_end - req.alloc_len + reserve + self.cache.page_size

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
            ledger=self.ledger,
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
    ) -> tuple[Req, int] | object | None:
        """Promote to a Req: take a slot, match and lock the prefix; None if it does not fit,
        _DEFER if a request of this batch is computing more of its prefix (it waits one step,
        then matches that prefix in the cache)."""
        if self.tables.num_free_slots == 0:
            return None
        match = self.cache.match(pending.input_ids)
        if self.cache.shares_prefixes and shared.extends(pending.input_ids, match.length):
            return _DEFER
        if self.chunked is not None and match.length + token_budget < len(pending.input_ids):
            return None  # NOTE: one prompt is chunked at a time
        remain = pending.max_device_len - len(pending.input_ids)
        reserve = output_reserve(remain, self.output_reserve_ratio)
        need = len(pending.input_ids) - match.length + reserve + self.cache.page_size
        self.cache.lock(match)
        if need + reserved_tokens > self.cache.available_pages * self.cache.page_size:
            self.cache.unlock(match)
            return None
        slot = self.tables.allocate()
        pending.group.slots += 1
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
