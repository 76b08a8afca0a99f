"""The heartbeat of a worker that is still getting its model (downloading, loading, compiling):
``state = "loading"``, written from a thread every heartbeat interval from before the load
starts until the consumer's own heartbeats take over, so ``radixq status`` lists the worker
(alive, loading) and ``run``'s display can tell loading from running (producer.worker_pool).

Readers that hand out work skip it: the pool's survey counts only ``running`` workers
(worker.queue.routing), and so does the service's list of served models.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import msgspec

from wire.status import LOADING, Heartbeat, now_ms
from worker.queue.jobqueue import JobQueue

log = logging.getLogger(__name__)


@contextmanager
def loading_heartbeats(queue: JobQueue, beat: Heartbeat, interval_s: float) -> Iterator[None]:
    """``beat`` (its state set to loading, stamped now) written every ``interval_s`` while the
    block runs. NOTE: a block that raises (the model could not be loaded) takes the worker's
    entry away with it, so status does not list a worker that never ran."""
    stop = threading.Event()
    beat = msgspec.structs.replace(beat, state=LOADING, interval_s=interval_s)

    def beating() -> None:
        while True:
            try:
                queue.heartbeat(msgspec.structs.replace(beat, last_seen_ms=now_ms()), epoch=False)
            except Exception as exc:  # NOTE: status only; the consumer judges Redis once it runs
                log.debug("loading heartbeat not written: %s", exc)
            if stop.wait(interval_s):
                return

    thread = threading.Thread(target=beating, name="loading-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    except BaseException:
        stop.set()
        thread.join()
        try:
            queue.leave()
        except Exception as exc:
            log.debug("loading heartbeat not removed: %s", exc)
        raise
    stop.set()
    thread.join()
