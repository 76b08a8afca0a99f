"""What a worker checks the queue still knows.

Every read and reclaim returns the queue's epoch, and so does a heartbeat when none came since
the last one: one that disappears or changes means Redis lost the queue's data (wire.epoch).
After an outage or a lost group, the jobs stream must still reach the newest entry this worker
read: a Redis restarted without its data, or from an AOF that missed the last writes, does not. Either is logged as DATA LOSS with what to do, and
counted in the heartbeat.
"""

from __future__ import annotations

import logging

from wire.epoch import EpochWatch
from wire.keys import QueueKeys
from wire.status import Heartbeat
from worker.queue.jobqueue import JobQueue, entry_key

log = logging.getLogger("radixq.worker")


class QueueWatch:
    def __init__(self, queue_name: str) -> None:
        self.queue_name = queue_name
        self.epoch = EpochWatch(QueueKeys(queue_name))
        self.stream_losses = 0
        self.last_read = (0, 0)  # the newest entry this worker received

    @property
    def losses(self) -> int:
        return self.epoch.losses + self.stream_losses

    def saw(self, entry_id: str) -> None:
        self.last_read = max(self.last_read, entry_key(entry_id))

    def beat(self, queue: JobQueue, heartbeat: Heartbeat, epoch: bool = True) -> None:
        """Publish the heartbeat; with ``epoch``, ask the queue's epoch and report a change."""
        current = queue.heartbeat(heartbeat, epoch)
        if epoch:
            self.saw_epoch(current)

    def saw_epoch(self, current: str | None) -> None:
        """The queue's epoch as a read or a heartbeat found it; report a change."""
        lost = self.epoch.observe(current)
        if lost is not None:
            log.error("DATA LOSS: %s", lost)

    def check_stream(self, queue: JobQueue) -> None:
        """Report a jobs stream that no longer reaches the newest entry this worker read."""
        if self.last_read == (0, 0):
            return
        newest = queue.newest_entry()
        if newest < self.last_read:
            self.stream_losses += 1
            log.error(
                "DATA LOSS: queue %r: Redis answers with jobs up to entry %d-%d, but this worker had read "
                "entry %d-%d: it lost recent writes (restarted without its data, or from an older AOF). "
                "Re-enqueue the input file and collect again into the same output.",
                self.queue_name,
                *newest,
                *self.last_read,
            )
