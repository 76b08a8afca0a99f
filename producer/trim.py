"""What a trimming collect removes from Redis: results it has read, records of ids it has written.

The results stream is trimmed (XTRIM MINID) past the last entry read as soon as the spill has
committed what that read counted (producer.spill): every result read is then on disk, so Redis
holds only results no collect has read. The bound is recorded in the meta hash
(``results_trimmed``) for other collects, which report results trimmed before they read them
instead of waiting for them. The per-id records of the ids written in order are forgotten
(producer.forget).

    NOTE: at ``maxmemory`` (noeviction) Redis refuses commands that may grow memory, and a
    MULTI holding one is refused whole. XTRIM is not one of them, and it is what frees memory
    for the workers' results; so it goes first, on its own, and the bound is recorded after it
    (HSET), and the records forgotten (a MULTI with HINCRBY), only when Redis takes them: a
    refusal for memory leaves them to a later round. The record may lag the trim (as after a
    crash between the two), never run ahead of it.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence
from typing import Any

import redis

from producer.forget import forget_written
from wire.keys import META_RESULTS_TRIMMED, QueueKeys
from wire.redis_errors import classify

EntryId = tuple[int, int]


class Trimmer:
    def __init__(self, client: redis.Redis, keys: QueueKeys) -> None:
        self.redis = client
        self.keys = keys
        self.trimmed_to: EntryId = (0, 1)  # this collector trimmed the results stream below this
        self._recorded_to: EntryId = (0, 1)  # and recorded that in meta up to this
        self._forgotten_to = 0  # this collector forgot the ids at order positions below this

    def trim_to(self, bound: EntryId) -> EntryId:
        """Trim the results stream below ``bound`` (everything below it is in the spill or the
        output, committed); returns the bound trimmed to."""
        if bound > self.trimmed_to:
            self.redis.xtrim(self.keys.results, minid=_text(bound), approximate=False)
            self.trimmed_to = bound
        if self._recorded_to < self.trimmed_to:
            _unless_full(self._record)
        return self.trimmed_to

    def _record(self) -> None:
        recorded: Any = self.redis.hget(self.keys.meta, META_RESULTS_TRIMMED)
        if recorded is None or _parse(recorded.decode()) < self.trimmed_to:
            self.redis.hset(self.keys.meta, META_RESULTS_TRIMMED, _text(self.trimmed_to))
        self._recorded_to = self.trimmed_to

    def forget(
        self, expected: Sequence[str], written: int, base: int, errors: Container[str], *, allowed: bool
    ) -> None:
        """Forget the records of ``expected[:written]`` (written in order, fsynced; the first at
        order position ``base``), when ``allowed`` (every id of the queue in scope, no row waiting
        to be replaced)."""
        if not allowed or base + written <= self._forgotten_to:
            return

        def step() -> None:
            self._forgotten_to = forget_written(self.redis, self.keys, expected, written, base, errors)

        _unless_full(step)


def _unless_full(step: Callable[[], None]) -> None:
    """Run ``step``; a refusal because Redis is at maxmemory leaves it to a later call."""
    try:
        step()
    except redis.ResponseError as exc:
        full = isinstance(exc, redis.exceptions.OutOfMemoryError) or (
            classify(exc) == "transient" and "OOM" in str(exc)
        )
        if not full:
            raise


def _parse(entry_id: str) -> EntryId:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _text(entry: EntryId) -> str:
    return f"{entry[0]}-{entry[1]}"
