"""The JobQueue on Redis Streams (worker.queue.jobqueue is the contract)."""

from worker.queue.streams.queue import RedisJobQueue

__all__ = ["RedisJobQueue"]
