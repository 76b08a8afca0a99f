"""Which partitions a worker reads: its own first, then others' when it runs dry.

A queue's jobs sit in P partition streams by prefix key (wire.routing). The owner of each
partition comes from the live workers in the heartbeats (``assign``), computed by the worker
that takes the pool's survey and read by the others with it (worker.queue.streams.survey):
rendezvous hashing with a bound on load, so each worker owns at most
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
Two workers that briefly hold surveys of different ages read a partition both or neither: the
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
STEAL_AFTER_S = 2.0  # a partition's backlog this old may be stolen by a worker that ran dry
PREFIX_KEYS_KEPT = 4096  # distinct prefix keys a worker remembers for its heartbeat
# partitions to steal from that a worker may find empty per survey: with many workers stealing
# at once, the survey's lag is soon old, and each empty read is a command spent on nothing
STEAL_TRIES = 2


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


def beating(beats: dict[str, Heartbeat | None], me: str, at_ms: int) -> set[str]:
    """Names of the consumers that wrote their heartbeat within two of its intervals, whatever
    their state (a draining worker still renews what it holds); always ``me``. The entries any
    other consumer holds are worth a reclaim (worker.queue.streams.survey)."""
    recent = {me}
    for name, beat in beats.items():
        if beat is not None and at_ms - beat.last_seen_ms <= 2000 * max(beat.interval_s, 0.1):
            recent.add(name)
    return recent


@dataclass(frozen=True)
class Survey:
    """What a worker knows of its queue's backlog and pool (refreshed every ``survey_s``, by
    one worker for the whole pool: worker.queue.streams.survey)."""

    partitions: int
    lag: list[int]  # per partition: entries never delivered
    in_flight: int  # entries delivered and not acknowledged, all workers
    owners: list[str]  # per partition: the live worker that owns it (assign)
    live: int  # live workers
    orphaned: list[int]  # per partition: entries held by consumers whose heartbeat stopped
    own: list[int] = field(default_factory=list)  # the partitions this worker owns (Router.update)

    @property
    def queued(self) -> int:
        return sum(self.lag)

    def orphans_in(self, partition: int) -> bool:
        """Whether a reclaim of ``partition`` would find entries of a consumer that stopped."""
        return partition < len(self.orphaned) and self.orphaned[partition] > 0

    def fair_share(self) -> int:
        """Jobs this worker may hold so that the queue's jobs spread over the live workers."""
        return math.ceil((self.queued + self.in_flight) / max(1, self.live))


def survey_of(
    partitions: int, lag: list[int], in_flight: int, workers: list[str], orphaned: list[int] | None = None
) -> Survey:
    """The survey of a queue whose live workers are ``workers``, with each partition's owner."""
    owners = [""] * partitions
    for name, owned in assign(partitions, workers).items():
        for partition in owned:
            owners[partition] = name
    return Survey(partitions, lag, in_flight, owners, len(workers), orphaned or [0] * partitions)


class Router:
    """One worker's view: which partitions are its own, which to steal from."""

    def __init__(
        self, name: str, steal_after_s: float = STEAL_AFTER_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.name = name
        self.steal_after_s = steal_after_s
        self.clock = clock
        self.survey = survey_of(1, [0], 0, [name])
        self.own: list[int] = [0]
        self.adopted: int | None = None  # the partition it stole from last
        self._waiting_since: dict[int, float] = {}  # partition -> when its backlog was first seen
        self._owner: dict[int, str] = {}  # partition -> its owner (assign)
        self.drained: set[int] = set()  # partitions a read found empty since the last survey
        self.probed = False  # whether the own partitions were read since the last survey
        self.missed = 0  # partitions to steal from found empty since the last survey

    def update(self, survey: Survey) -> Survey:
        """Take a new survey; returns it with the partitions this worker owns now."""
        self._owner = {p: name for p, name in enumerate(survey.owners) if name}
        # NOTE: one partition is no routing: every worker reads it, as before partitions existed.
        self.own = (
            [0] if survey.partitions == 1 else [p for p, name in self._owner.items() if name == self.name]
        )
        self.survey = replace(survey, own=self.own)
        now = self.clock()
        self._waiting_since = {
            p: self._waiting_since.get(p, now) for p in range(survey.partitions) if survey.lag[p] > 0
        }
        if self.adopted is not None and (self.adopted >= survey.partitions or self.adopted in self.own):
            self.adopted = None
        self.drained, self.probed, self.missed = set(), False, 0
        return self.survey

    def read_order(self) -> list[int]:
        """Own partitions with a backlog (no read found them empty since), lowest first."""
        return [p for p in self.own if self.survey.lag[p] > 0 and p not in self.drained]

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
            if p not in self.own
            and p not in self.drained
            and lag[p] > 0
            and self._waiting_since.get(p, ripe + 1) <= ripe
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
    a backlog in the last survey, else from every own partition (jobs that came since: once
    per survey), else from the first partition to steal from, else wait up to ``block_s`` on
    the own partitions. A partition a read found empty is not read again before the next
    survey, and a worker steals from at most STEAL_TRIES partitions found empty per survey,
    so a worker with room and an empty queue asks Redis a few times per survey, not every
    step. ``read(partitions, per_partition, block_s)`` reads the queue; reads spread over
    several partitions split ``count`` among them, so never more than ``count`` come in all."""

    def spread(partitions: list[int], wait_s: float | None) -> list[T]:
        chosen = partitions[:count]
        return read(chosen, count // len(chosen), wait_s) if chosen else []

    for partition in router.read_order():
        got = read([partition], count, None)
        if got:
            return got
        router.drained.add(partition)
    if not router.probed:
        router.probed = True
        got = spread(router.own, None)
        if got:
            return got
    for partition in router.steal_order()[: STEAL_TRIES - router.missed]:
        got = read([partition], count, None)
        if got:
            router.adopted = partition
            return got
        router.drained.add(partition)
        router.missed += 1
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
