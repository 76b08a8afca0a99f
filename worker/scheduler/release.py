"""Releasing a request: its KV goes to the prefix cache, its slot back to the table.

Every way out of the running set ends here: a request that finished, was aborted or was
retracted, and a half-prefilled chunk whose pages are dropped."""

from __future__ import annotations

from worker.kvcache.manager import CacheManager
from worker.kvcache.table import TableManager
from worker.scheduler.req import Req


def release(req: Req, cache: CacheManager, tables: TableManager) -> None:
    """Idempotent: under overlap a request can be released before its last step is processed."""
    if req.released:
        return
    req.released = True
    cache.cache_req(req, finished=True)
    req.detach()  # NOTE: before its slot can be handed out again
    tables.free(req.slot)
    req.pending.group.slots -= 1
