"""WaitQueue: the requests waiting for admission, and the order a scheduling policy offers them in.

Waiting requests sit in buckets keyed by their prefix key (their first ``key_len`` tokens);
a bucket keeps its members in arrival order. Per step the queue offers buckets, and the
prefill manager admits from the head of each until one does not go in:

    1. requeued requests (retracted ones, the siblings of an n > 1 request), as one bucket;
    2. "lpm" only: the oldest waiting request's bucket, once more than ``max_overtakes``
       later arrivals were admitted ahead of it (the age bound: nothing starves);
    3. "lpm" only: buckets whose prefix the cache holds, longest cached prefix first (its
       members share that KV: siblings go together);
    4. the other buckets, oldest first ("fcfs": one bucket, arrival order).

A bucket's cached length is learnt when the prefill of one of its members is cached and
refreshed from each admission's match; it is never recomputed for all waiting requests. A
bucket with a cached prefix marks it wanted in the prefix cache, which evicts wanted
prefixes last. Work per step is proportional to what is offered, not to the number waiting.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Generator, Hashable
from dataclasses import dataclass, field
from typing import Any

from worker.kvcache.prefix import PrefixCache
from worker.scheduler.req import PendingReq

SCHEDULE_POLICIES = ("lpm", "fcfs")
_REQUEUED = object()  # the key of the requeued requests' bucket
_FCFS = object()  # the key of the only bucket under "fcfs"


@dataclass(eq=False)
class Bucket:
    key: Hashable
    reqs: deque[PendingReq] = field(default_factory=deque)
    cached_len: int = 0  # tokens of the members' prefix known to be cached (0: none)
    wanted: Any = None  # prefix-cache handle marked wanted on the bucket's behalf
    version: int = 0  # the heap entry of this bucket that is current


class WaitQueue:
    def __init__(self, policy: str, key_len: int, max_overtakes: int, cache: PrefixCache) -> None:
        if policy not in SCHEDULE_POLICIES:
            raise ValueError(f"schedule_policy={policy!r}: must be one of {SCHEDULE_POLICIES}")
        self.policy = policy
        self.key_len = key_len
        self.max_overtakes = max_overtakes
        self.cache = cache
        self.requeued = Bucket(_REQUEUED)
        self.buckets: dict[Hashable, Bucket] = {}  # NOTE: insertion order = age of the bucket
        self._arrival: dict[PendingReq, int] = {}  # every waiting request (requeued ones too)
        self._arrivals: deque[tuple[int, PendingReq]] = deque()  # oldest first; stale entries skipped
        self._hot: list[tuple[int, int, Hashable]] = []  # (-cached_len, version, key), lazily pruned
        self._counter = itertools.count()
        self._overtakes = 0  # later arrivals admitted since the oldest request became the oldest

    def __len__(self) -> int:
        return len(self._arrival)

    def key_of(self, pending: PendingReq) -> Hashable:
        if self.policy == "fcfs":
            return _FCFS
        return hash(tuple(pending.input_ids[: self.key_len]))

    def add(self, pending: PendingReq) -> None:
        key = self.key_of(pending)
        bucket = self.buckets.get(key)
        if bucket is None:
            bucket = self.buckets[key] = Bucket(key)
        bucket.reqs.append(pending)
        self._arrive(pending)

    def add_requeued(self, reqs: list[PendingReq]) -> None:
        """Put ``reqs`` ahead of everything waiting, in this order."""
        self.requeued.reqs.extendleft(reversed(reqs))
        for pending in reqs:
            self._arrive(pending)

    def _arrive(self, pending: PendingReq) -> None:
        seq = next(self._counter)
        self._arrival[pending] = seq
        self._arrivals.append((seq, pending))

    def remove(self, keep: Callable[[PendingReq], bool]) -> list[PendingReq]:
        """Drop the waiting requests for which ``keep`` is false; return them (O(waiting))."""
        gone = []
        for bucket in [self.requeued, *self.buckets.values()]:
            gone += [p for p in bucket.reqs if not keep(p)]
            bucket.reqs = deque(p for p in bucket.reqs if keep(p))
        for pending in gone:
            del self._arrival[pending]
        for bucket in [b for b in self.buckets.values() if not b.reqs]:
            self._drop(bucket)
        return gone

    def head(self) -> PendingReq | None:
        """The request offered first when nothing is cached."""
        return self.requeued.reqs[0] if self.requeued.reqs else self.oldest()

    def oldest(self) -> PendingReq | None:
        """The request that arrived (or was requeued) longest ago."""
        while self._arrivals:
            seq, pending = self._arrivals[0]
            if self._arrival.get(pending) == seq:
                return pending
            self._arrivals.popleft()
        return None

    def offer(self) -> Generator[Bucket, None, None]:
        """This step's buckets in policy order (see the module docstring); close it when done."""
        offered: list[Bucket] = []
        try:
            if self.requeued.reqs:
                yield self.requeued
            oldest = self.oldest()
            if oldest is not None and self._overtakes > self.max_overtakes:
                bucket = self.buckets.get(self.key_of(oldest))
                if bucket is not None:
                    offered.append(bucket)
                    yield bucket
            while self._hot:
                neg_len, version, key = heapq.heappop(self._hot)
                bucket = self.buckets.get(key)
                if bucket is None or bucket.version != version or bucket in offered:
                    continue
                offered.append(bucket)
                yield bucket
            for bucket in self.buckets.values():
                if bucket.reqs and bucket not in offered:
                    offered.append(bucket)
                    yield bucket
        finally:
            for bucket in offered:
                if not bucket.reqs:
                    self._drop(bucket)
                elif bucket.cached_len > 0:
                    self._push_hot(bucket)

    def take(self, bucket: Bucket, handle: Any, matched_len: int) -> None:
        """The head of ``bucket`` was admitted with a match of ``matched_len`` tokens."""
        pending = bucket.reqs.popleft()
        seq = self._arrival.pop(pending)
        oldest = self.oldest()
        if oldest is None or self._arrival[oldest] > seq:
            self._overtakes = 0  # it was the oldest: the next oldest starts counting
        else:
            self._overtakes += 1
        if bucket is not self.requeued and self.policy == "lpm":
            self._set_cached(bucket, handle if matched_len > 0 else None, matched_len)

    def cached(self, pending: PendingReq, handle: Any, cached_len: int) -> None:
        """``pending``'s prompt is cached up to ``cached_len`` (its prefill was launched)."""
        if self.policy != "lpm" or cached_len == 0:
            return
        bucket = self.buckets.get(self.key_of(pending))
        if bucket is not None and bucket.reqs and cached_len > bucket.cached_len:
            self._set_cached(bucket, handle, cached_len)
            self._push_hot(bucket)

    def _set_cached(self, bucket: Bucket, handle: Any, cached_len: int) -> None:
        if handle is not None:
            self.cache.want(handle)
        if bucket.wanted is not None:
            self.cache.unwant(bucket.wanted)
        bucket.wanted, bucket.cached_len = handle, cached_len

    def _push_hot(self, bucket: Bucket) -> None:
        bucket.version = next(self._counter)
        heapq.heappush(self._hot, (-bucket.cached_len, bucket.version, bucket.key))

    def _drop(self, bucket: Bucket) -> None:
        if bucket.wanted is not None:
            self.cache.unwant(bucket.wanted)
            bucket.wanted = None
        if self.buckets.get(bucket.key) is bucket and not bucket.reqs:
            del self.buckets[bucket.key]
