"""Which partitions a worker reads: its own first, then others' when it runs dry.

A queue's jobs sit in P partition streams by prefix key (wire.routing). Every worker
computes the same owner for each partition from the live workers it sees in the heartbeats
(``assign``): rendezvous hashing with a bound on load, so each worker owns at most
ceil(P / workers) partitions and a worker joining or leaving moves few of them. A worker reads
its own partitions first, one at a time in ascending order: the jobs of a prefix group go to
the worker whose cache holds it, group after group. When its own partitions are empty and it
has room, it steals, as in work stealing, from the other end: the partition it stole from last
while that still has jobs, else the highest partition with a backlog of the worker with the
longest backlog, the one its owner would reach last. So a stolen group moves whole instead of
being read by two workers at once.

A queue of one partition is not routed: every worker reads it (as before partitions existed).
A worker that dies, drains or stops beating drops out of the live set: its partitions go to
live workers, and its held entries come back through reclaim (worker.queue.consumer).
Two workers that briefly disagree on the live set read a partition both or neither: the
first costs cache hits, the second is covered by stealing; no job is lost either way.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TypeVar

from wire.status import Heartbeat, is_alive

T = TypeVar("T")
PREFIX_KEYS_KEPT = 4096  # distinct prefix keys a worker remembers for its heartbeat


def _score(worker: str, partition: int) -> int:
    digest = hashlib.blake2b(f"{worker}\0{partition}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def assign(partitions: int, workers: list[str]) -> dict[str, list[int]]:
    """Owner of each partition: its highest-scoring worker that owns fewer than ceil(P / W)."""
    names = sorted(set(workers))
    owned: dict[str, list[int]] = {name: [] for name in names}
    if not names:
        return owned
    bound = math.ceil(partitions / len(names))
    for partition in range(partitions):
        for name in sorted(names, key=lambda n: _score(n, partition), reverse=True):
            if len(owned[name]) < bound:
                owned[name].append(partition)
                break
    return owned


def live_workers(beats: dict[str, Heartbeat | None], me: str, at_ms: int) -> list[str]:
    """Names of the workers whose heartbeat is recent and that are not draining; always ``me``."""
    live = {me}
    for name, beat in beats.items():
        if beat is not None and beat.state == "running" and is_alive(beat, 1 << 62, at_ms)[0]:
            live.add(name)
    return sorted(live)


@dataclass(frozen=True)
class Survey:
    """What a worker knows of its queue's backlog (refreshed every few hundred ms)."""

    partitions: int
    lag: list[int]  # per partition: entries never delivered
    in_flight: int  # entries delivered and not acknowledged, all workers
    workers: list[str]  # live, this one included
    own: list[int] = field(default_factory=list)  # the partitions this worker owns (Router.update)

    @property
    def queued(self) -> int:
        return sum(self.lag)

    def fair_share(self) -> int:
        """Jobs this worker may hold so that the queue's jobs spread over the live workers."""
        return math.ceil((self.queued + self.in_flight) / max(1, len(self.workers)))


class Router:
    """One worker's view: which partitions are its own, which to steal from."""

    def __init__(
        self, name: str, steal_after_s: float = 2.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.name = name
        self.steal_after_s = steal_after_s
        self.clock = clock
        self.survey = Survey(1, [0], 0, [name])
        self.own: list[int] = [0]
        self.adopted: int | None = None  # the partition it stole from last
        self._waiting_since: dict[int, float] = {}  # partition -> when its backlog was first seen
        self._owner: dict[int, str] = {}  # partition -> its owner (assign)

    def update(self, survey: Survey) -> Survey:
        """Take a new survey; returns it with the partitions this worker owns now."""
        owners = assign(survey.partitions, survey.workers)
        self._owner = {p: name for name, owned in owners.items() for p in owned}
        # NOTE: one partition is no routing: every worker reads it, as before partitions existed.
        self.own = [0] if survey.partitions == 1 else owners.get(self.name, [])
        self.survey = replace(survey, own=self.own)
        now = self.clock()
        self._waiting_since = {
            p: self._waiting_since.get(p, now) for p in range(survey.partitions) if survey.lag[p] > 0
        }
        if self.adopted is not None and (self.adopted >= survey.partitions or self.adopted in self.own):
            self.adopted = None
        return self.survey

    def read_order(self) -> list[int]:
        """Own partitions with a backlog, lowest first."""
        return [p for p in self.own if self.survey.lag[p] > 0]

    def steal_order(self) -> list[int]:
        """Others' partitions with a backlog seen for steal_after_s (their owner had time to
        take it): the adopted one first, then those of the worker with the longest backlog,
        highest first (its owner reads them last)."""
        lag, owner = self.survey.lag, self._owner
        backlog: dict[str, int] = {}
        for p, name in owner.items():
            backlog[name] = backlog.get(name, 0) + lag[p]
        ripe = self.clock() - self.steal_after_s
        others = [
            p
            for p in range(self.survey.partitions)
            if p not in self.own and lag[p] > 0 and self._waiting_since.get(p, ripe + 1) <= ripe
        ]
        others.sort(key=lambda p: (p != self.adopted, -backlog.get(owner.get(p, ""), 0), -p))
        return others


def read_routed(
    router: Router,
    count: int,
    block_s: float | None,
    read: Callable[[list[int], int, float | None], list[T]],
    sleep: Callable[[float], object] = time.sleep,
) -> list[T]:
    """Read up to ``count`` entries the way ``Router`` says: from the first own partition with
    a backlog in the last survey, else from every own partition (jobs that came since), else
    from the first partition to steal from, else wait up to ``block_s`` on the own partitions.
    ``read(partitions, per_partition, block_s)`` reads the queue; reads spread over several
    partitions split ``count`` among them, so never more than ``count`` come in all."""

    def spread(partitions: list[int], wait_s: float | None) -> list[T]:
        chosen = partitions[:count]
        return read(chosen, count // len(chosen), wait_s) if chosen else []

    for partition in router.read_order():
        got = read([partition], count, None)
        if got:
            return got
    got = spread(router.own, None)
    if got:
        return got
    for partition in router.steal_order():
        got = read([partition], count, None)
        if got:
            router.adopted = partition
            return got
    if block_s is None:
        return []
    if not router.own:  # more workers than partitions: this one only steals
        sleep(block_s)
        return []
    return spread(router.own, block_s)


class PrefixTally:
    """What a worker's heartbeat says of its cache: tokens and the prefix keys it ran lately."""

    def __init__(self, kept: int = PREFIX_KEYS_KEPT) -> None:
        self.kept = kept
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self._keys: OrderedDict[str, None] = OrderedDict()

    def saw(self, key: str, prompt_tokens: int, cached_tokens: int) -> None:
        self.prompt_tokens += prompt_tokens
        self.cached_tokens += cached_tokens
        if key:
            self._keys[key] = None
            self._keys.move_to_end(key)
            if len(self._keys) > self.kept:
                self._keys.popitem(last=False)

    @property
    def prefix_keys(self) -> int:
        return len(self._keys)
