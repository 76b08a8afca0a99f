"""The survey, taken by one consumer for the whole pool.

Every consumer needs the queue's backlog, its live workers and the partitions' owners every
``survey_s`` (worker.queue.routing.Survey). Taking it reads every partition (XINFO GROUPS and
XPENDING each), every heartbeat (HGETALL) and the routing (HMGET), and assigning the owners
costs P x W hashes: done by each of W consumers, the queue's work grows as W x P and the pool's
CPU as W x W. So one consumer takes it and writes it to ``{Q}:survey`` with the time it was
taken; the others read that record, one GET:

    GET {Q}:survey            fresh (taken within max_age): that is the survey
    SET {Q}:surveying NX PX   else whoever wins this lease (a tenth of max_age: longer than a
                              survey takes) takes it and SETs the record; the others keep the
                              survey they had

so about one consumer reads the partitions per ``max_age``, however large the pool. Of W
consumers that find the record old, each tries the lease with probability LEASE_TRIERS / W (W
from the record), and every one once it is twice too old: a pool of 1,000 does not send 1,000
SETs to elect one, and a record is never more than twice too old for long.

    NOTE: a record's age is judged by the reader's wall clock against the writer's, as
    heartbeats are. A clock ahead sees records older than they are and tries the lease more
    often (one command more); one behind takes a record up to its skew older. Neither changes
    what is read or written: the survey steers reads, it never decides a job's fate.

Besides the backlog, the survey counts per partition the entries held by consumers whose
heartbeat stopped (``orphaned``, from XPENDING's summary), so the pool knows where a reclaim
would find something (worker.queue.consumer), and whether every partition had the consumer
group, so a consumer starting on a queue surveyed a moment ago need not create them again.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import msgspec
import redis

from wire.keys import QueueKeys
from wire.routing import read_routing
from wire.status import decode_heartbeat, now_ms
from wire.streams import ensure_groups
from worker.queue.routing import Survey, beating, live_workers, survey_of

RECORD_KEPT_MS = 600_000  # a record outlives its pool by this much (then Redis drops it)
LEASE_TRIERS = 2  # consumers of a pool, on average, that try to take an old record's survey
GROUPS_TRUSTED_MS = 60_000  # a consumer starting within this of a whole survey does not create groups
PREPARE_LEASE_MS = 100  # the lease of the consumer creating the groups (longer than it takes)

# (stream, last-delivered id) -> the lag Redis lost (worker.queue.streams.lag)
CountLag = Callable[[redis.Redis, str, str], int]


class SurveyRecord(msgspec.Struct, array_like=True, frozen=True):
    """What ``{Q}:survey`` holds: a Survey without ``own``, and when and whether it was whole."""

    taken_ms: int
    partitions: int
    lag: list[int]
    in_flight: int
    owners: list[str]
    live: int
    orphaned: list[int]
    grouped: bool  # every partition stream had the consumer group


_decoder = msgspec.msgpack.Decoder(SurveyRecord)


def take(
    client: redis.Redis, keys: QueueKeys, name: str, partitions: int, count_lag: CountLag
) -> SurveyRecord:
    """Read the queue's partitions and heartbeats now (``partitions`` as routed)."""
    streams = keys.partitions(partitions)
    with client.pipeline(transaction=False) as pipe:
        pipe.hgetall(keys.workers)
        for stream in streams:
            pipe.xinfo_groups(stream)
        for stream in streams:
            pipe.xpending(stream, keys.group)
        reply: Any = pipe.execute(raise_on_error=False)
    if isinstance(reply[0], Exception):
        raise reply[0]
    now = now_ms()
    beats = {raw.decode(): decode_heartbeat(data) for raw, data in reply[0].items()}
    recent = beating(beats, name, now)
    lag, orphaned, in_flight, grouped = [], [], 0, True
    for stream, groups, pending in zip(
        streams, reply[1 : 1 + partitions], reply[1 + partitions :], strict=True
    ):
        group: dict[str, Any] = (
            {}
            if isinstance(groups, Exception)
            else next((g for g in groups if g["name"].decode() == keys.group), {})
        )
        grouped = grouped and bool(group)
        if group and group.get("lag") is None:  # NOTE: Redis lost the count (an AOF restart)
            group["lag"] = count_lag(client, stream, group["last-delivered-id"].decode())
        lag.append(int(group.get("lag") or 0))
        in_flight += int(group.get("pending") or 0)
        held = [] if isinstance(pending, Exception) else pending.get("consumers") or []
        orphaned.append(sum(int(c["pending"]) for c in held if c["name"].decode() not in recent))
    survey = survey_of(partitions, lag, in_flight, live_workers(beats, name, now), orphaned)
    return SurveyRecord(now, partitions, lag, in_flight, survey.owners, survey.live, orphaned, grouped)


def as_survey(record: SurveyRecord) -> Survey:
    return Survey(
        record.partitions, record.lag, record.in_flight, record.owners, record.live, record.orphaned
    )


class SharedSurvey:
    """One consumer's side of the pool's survey (see the module docstring)."""

    def __init__(self, keys: QueueKeys, name: str, count_lag: CountLag) -> None:
        self.keys = keys
        self.name = name
        self.count_lag = count_lag
        self.last: SurveyRecord | None = None  # the newest record this consumer has seen
        self._rng = random.Random(name)

    def read(self, client: redis.Redis) -> SurveyRecord | None:
        """The pool's record, if there is one that can be read."""
        raw: Any = client.get(self.keys.survey)
        if raw is None:
            return None
        try:
            return _decoder.decode(raw)
        except msgspec.DecodeError:  # NOTE: another version's record, or damage: taken again
            return None

    def get(self, client: redis.Redis, max_age_s: float, partitions: int) -> SurveyRecord | None:
        """A survey taken within ``max_age_s`` (read, else taken here if this consumer wins the
        lease); else the newest one seen, None if none (another consumer is taking it now)."""
        max_age_ms = max(1, int(max_age_s * 1000))
        record = self.read(client)
        if record is None:
            tries = True
        else:
            age_ms = now_ms() - record.taken_ms
            if age_ms < max_age_ms:
                return self._seen(record)
            # NOTE: of W consumers finding the record old, about LEASE_TRIERS try the lease;
            # all of them once it is twice too old
            tries = age_ms >= 2 * max_age_ms or self._rng.random() * record.live < LEASE_TRIERS
        if tries and client.set(self.keys.surveying, self.name, nx=True, px=max(1, max_age_ms // 10)):
            routed = read_routing(client, self.keys)[0]
            if routed != partitions:  # NOTE: the queue was routed since: every partition needs the group
                ensure_groups(client, self.keys, routed)
            return self._publish(client, routed)
        return self._seen(record) if record is not None else self.last

    def prepare(self, client: redis.Redis, partitions: int) -> bool:
        """Whether the consumer groups of ``partitions`` can be read: a whole survey found them
        lately, else this consumer won the lease, created the missing ones and wrote the
        survey; False while another consumer does that (a pool starting at once creates them
        once, not once per consumer)."""
        record = self.read(client)
        if (
            record is not None
            and record.grouped
            and record.partitions == partitions
            and now_ms() - record.taken_ms < GROUPS_TRUSTED_MS
        ):
            return True
        if not client.set(self.keys.surveying, self.name, nx=True, px=PREPARE_LEASE_MS):
            return False
        ensure_groups(client, self.keys, partitions)
        self._publish(client, partitions)
        return True

    def _publish(self, client: redis.Redis, partitions: int) -> SurveyRecord:
        """Take the survey now (this consumer holds the lease) and write it for the pool."""
        record = take(client, self.keys, self.name, partitions, self.count_lag)
        client.set(self.keys.survey, msgspec.msgpack.encode(record), px=RECORD_KEPT_MS)
        return self._seen(record)

    def _seen(self, record: SurveyRecord) -> SurveyRecord:
        if self.last is None or record.taken_ms >= self.last.taken_ms:
            self.last = record
        return self.last
