"""Retraction: the decode batch the KV pool can hold, and the running requests sent back to
pending to make room (their computed KV stays in the prefix cache)."""

from __future__ import annotations

import logging

import numpy as np

from worker.kvcache.manager import CacheManager
from worker.kvcache.table import TableManager
from worker.scheduler.decode import NO_SLOTS, DecodeManager
from worker.scheduler.ledger import SlotLedger
from worker.scheduler.prefill import PrefillManager
from worker.scheduler.release import release
from worker.scheduler.req import Req
from worker.scheduler.step import Stats

logger = logging.getLogger(__name__)


class Retractions:
    """``reqs``: the requests retracted this iteration; ``requeue`` puts them back in front of
    the waiting requests at its end, once their in-flight token (if any) has been appended."""

    def __init__(
        self,
        cache: CacheManager,
        tables: TableManager,
        ledger: SlotLedger,
        prefill: PrefillManager,
        decode: DecodeManager,
        stats: Stats,
    ) -> None:
        self.cache = cache
        self.tables = tables
        self.ledger = ledger
        self.prefill = prefill
        self.decode = decode
        self.stats = stats
        self.reqs: list[Req] = []

    def decode_batch(self) -> tuple[list[Req], np.ndarray, int]:
        """Every running request, with their slots and the pages they take this step. While the
        pool cannot hold a token each, first drop a half-prefilled prompt's pages (its computed
        chunks stay cached), then retract the newest running requests. Empty when even one
        cannot get its page (pages held by the step in flight come back once it is processed)."""
        running, slots = self.decode.running, self.decode.slots()
        ledger = self.ledger
        grow = self.cache.pages_to_grow(ledger.device_len[slots], ledger.alloc_len[slots])
        count, pages = len(running), int(grow.sum())
        while count and pages > self.cache.available_pages:
            chunk = self.prefill.drop_chunk()
            if chunk is not None:
                release(chunk, self.cache, self.tables)
            elif count > 1:
                count -= 1
                pages -= int(grow[count])
                self._retract(running[count])
            else:
                return [], NO_SLOTS, 0
        return running[:count], slots[:count], pages

    def _retract(self, req: Req) -> None:
        """Send a decoding request back to pending; its computed KV stays in the prefix cache."""
        self.decode.remove(req)
        release(req, self.cache, self.tables)
        self.reqs.append(req)
        self.stats.retractions += 1
        logger.info("retracted %s at %d tokens (KV pool full)", req.rid, req.cached_len)

    def requeue(self) -> None:
        """Requeue retracted requests once their in-flight token (if any) has been appended."""
        back = [r.pending for r in self.reqs if not r.finished]
        for pending in back:
            pending.chunk = None
        self.prefill.add_front(back)
        self.reqs = []
