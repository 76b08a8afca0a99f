"""The service's background thread: every batch not final has a driver, and the queue's
throughput is sampled.

Each look (``supervise_s``) starts a driver thread (service.driver) for each active batch this
process does not drive already; a driver that finds the batch's lock held by another service
ends at once, and the next look tries again, so when that service dies its batches are taken
over within a look. Every ``sample_s`` the queue's done and failed counts go into the throughput
stream (wire.keys ``throughput``) under the period's start as entry id: with two services the
second one's sample for a period is refused by Redis, and the stream is trimmed to an hour.
With ``trim_results``, at each sample, when no batch is active, the results stream is trimmed
(``release_results``): every result in it is in some batch's files by then.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import redis

from service.config import ServeConfig
from service.driver import BatchDriver
from service.records import Records
from service.storage import Storage
from wire.keys import META_FORGOTTEN, META_FORGOTTEN_FAILED, META_RESULTS_TRIMMED, QueueKeys
from wire.status import now_ms

log = logging.getLogger("radixq.serve")
SAMPLE_S = 10  # the default sampling period (ServeConfig.sample_s)
KEEP_MS = 3_600_000


def sample_throughput(client: redis.Redis, keys: QueueKeys, at_ms: int, period_s: int = SAMPLE_S) -> bool:
    """Record the queue's done and failed counts for the period holding ``at_ms``; False when
    this period has its sample already."""
    with client.pipeline(transaction=False) as pipe:
        pipe.hlen(keys.done)
        pipe.hlen(keys.failed)
        pipe.hmget(keys.meta, [META_FORGOTTEN, META_FORGOTTEN_FAILED])
        done, failed, (forgotten, forgotten_failed) = pipe.execute()
    period_ms = period_s * 1000
    entry = f"{at_ms - at_ms % period_ms}-1"
    fields: dict[Any, Any] = {
        "done": done + int(forgotten or 0),
        "failed": failed + int(forgotten_failed or 0),
    }
    try:
        client.xadd(keys.throughput, fields, id=entry, minid=str(at_ms - KEEP_MS), approximate=False)
    except redis.ResponseError as exc:
        if "equal or smaller" in str(exc):
            return False
        raise
    return True


# KEYS: the active batches, the results stream, meta. With no batch active, every result in the
# stream is in some batch's files: trim them all, and record the bound for collects (as
# producer.trim does). One script: a batch created meanwhile is either seen active or has no
# result before the bound. Returns the entries trimmed.
_RELEASE = f"""
if redis.call('SCARD', KEYS[1]) > 0 then return 0 end
local last = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
if #last == 0 then return 0 end
local ms, seq = string.match(last[1][1], '(%d+)-(%d+)')
local bound = ms .. '-' .. (tonumber(seq) + 1)
local trimmed = redis.call('XTRIM', KEYS[2], 'MINID', bound)
local before = redis.call('HGET', KEYS[3], '{META_RESULTS_TRIMMED}')
local bms, bseq = 0, 0
if before then bms, bseq = string.match(before, '(%d+)-(%d+)') end
if tonumber(ms) > tonumber(bms) or (tonumber(ms) == tonumber(bms) and tonumber(seq) + 1 > tonumber(bseq)) then
  redis.call('HSET', KEYS[3], '{META_RESULTS_TRIMMED}', bound)
end
return trimmed
"""


def release_results(client: redis.Redis, keys: QueueKeys) -> int:
    """With no batch active, trim the results stream (``--trim-results``: a queue only the
    service uses; a plain collect on it would find its results gone). Entries trimmed."""
    script = client.register_script(_RELEASE)
    return int(script(keys=[keys.active_batches, keys.results, keys.meta], client=client))


def read_throughput(client: redis.Redis, keys: QueueKeys) -> list[tuple[int, int, int]]:
    """(ms, done, failed) samples of the last hour, oldest first."""
    entries: Any = client.xrange(keys.throughput, min=str(now_ms() - KEEP_MS))
    return [
        (int(entry_id.decode().split("-")[0]), int(fields[b"done"]), int(fields[b"failed"]))
        for entry_id, fields in entries
    ]


class Supervisor:
    def __init__(self, config: ServeConfig, client: redis.Redis, records: Records, storage: Storage) -> None:
        self.config = config
        self.redis = client
        self.records = records
        self.storage = storage
        self.keys = QueueKeys(config.queue)
        self.stopping = threading.Event()
        self.drivers: dict[str, threading.Thread] = {}
        self._thread = threading.Thread(target=self._loop, name="supervisor", daemon=True)
        self._next_sample_ms = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self.stopping.set()
        self._thread.join(timeout_s)
        for thread in list(self.drivers.values()):
            thread.join(timeout_s)

    def _loop(self) -> None:
        while not self.stopping.is_set():
            try:
                self.look()
            except redis.RedisError as exc:
                log.warning("supervisor: Redis error, will look again: %s", exc)
            except Exception:  # NOTE: the loop outlives one bad look; it is logged
                log.exception("supervisor: look failed")
            self.stopping.wait(min(self.config.supervise_s, self.config.sample_s))

    def look(self) -> None:
        """Start a driver for each active batch without one here; sample when a period starts."""
        for batch_id, thread in list(self.drivers.items()):
            if not thread.is_alive():
                del self.drivers[batch_id]
        for batch_id in self.records.active():
            if batch_id not in self.drivers:
                thread = threading.Thread(
                    target=self._drive, args=(batch_id,), name=f"batch-{batch_id}", daemon=True
                )
                self.drivers[batch_id] = thread
                thread.start()
        at_ms, period_s = now_ms(), self.config.sample_s
        if at_ms >= self._next_sample_ms:
            sample_throughput(self.redis, self.keys, at_ms, period_s)
            self._next_sample_ms = at_ms - at_ms % (period_s * 1000) + period_s * 1000
            if self.config.trim_results:
                release_results(self.redis, self.keys)

    def _drive(self, batch_id: str) -> None:
        try:
            BatchDriver(
                self.redis, self.config.queue, self.records, self.storage, self.config.work_dir, batch_id,
                self.stopping, poll_s=self.config.poll_s, retry_timeout_s=self.config.retry_timeout_s,
            ).run()  # fmt: skip
        except Exception:  # NOTE: one batch's trouble stays its own; the next look tries again
            log.exception("batch %s: driver failed", batch_id)
