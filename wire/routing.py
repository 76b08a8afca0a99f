"""Routing: which partition stream of a queue a job goes to (shared by producer and workers).

A queue's jobs go to P partition streams (P is the queue's ``partitions``, fixed by its first
enqueue; 1 for a queue enqueued before partitions existed). A new queue routes by default:
DEFAULT_PARTITIONS, sized for the pools radixq expects (up to a few dozen workers on one queue:
each live worker owns at most ceil(P / workers) partitions, so 16 spreads prefix groups over up
to 16 owners and a worker that joins or leaves moves about 1/16 of them; with more workers
than partitions the rest only steal). ``partitions=0`` asks for no routing: one stream that
every worker reads. A job's prefix key says which jobs
share a prompt prefix: the job's ``prefix_key`` if given, else the first ``prefix_chars``
characters of its prompt (of its first prompt for a prompt list; of its messages, roles included; of its ``input_ids``, the first
``prefix_chars // 4`` ids). Its partition is the key's hash modulo P, so every job of a prefix
group lands in the same stream, which one worker owns (worker.queue.routing).

Entry ids: partition 0 keeps Redis's plain ``ms-seq``; partition p > 0 names its entries
``p/ms-seq``, so one id names one entry across the queue (in ``done``, results, acks).
"""

from __future__ import annotations

import hashlib
from typing import Any

import redis

from wire.keys import META_PARTITIONS, META_PREFIX_CHARS, QueueKeys
from wire.schema import Job

DEFAULT_PARTITIONS = 16
NO_ROUTING = 0  # ``partitions=0``: one stream, every worker reads it
DEFAULT_PREFIX_CHARS = 256
MAX_PARTITIONS = 1024


def check_partitions(partitions: int) -> int:
    """The stream count of ``partitions`` (0, no routing, is one stream)."""
    if not NO_ROUTING <= partitions <= MAX_PARTITIONS:
        raise ValueError(f"partitions={partitions!r}: must be between 0 (no routing) and {MAX_PARTITIONS}")
    return max(1, partitions)


def prefix_key(job: Job, prefix_chars: int = DEFAULT_PREFIX_CHARS) -> str:
    """The job's prefix key as 16 hex digits (a hash of what its prefix group shares)."""
    if job.prefix_key is not None:
        text = "k:" + job.prefix_key
    elif job.prompt is not None or job.prompts:
        first = job.prompt if job.prompt is not None else (job.prompts or [""])[0]
        text = "p:" + first[:prefix_chars]
    elif job.messages is not None:
        text = "m:" + "".join(f"{m.role}\n{m.content}\n" for m in job.messages)[:prefix_chars]
    else:
        text = "t:" + ",".join(map(str, (job.input_ids or [])[: max(1, prefix_chars // 4)]))
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


def partition_of(key: str, partitions: int) -> int:
    """The partition of a prefix key (16 hex digits); 0 for a key that is not one."""
    try:
        return int(key, 16) % partitions
    except ValueError:
        return 0


def qualify(partition: int, raw_id: str) -> str:
    return raw_id if partition == 0 else f"{partition}/{raw_id}"


def split_id(entry_id: str) -> tuple[int, str]:
    """(partition, the stream's own id) of an entry id made by ``qualify``."""
    head, sep, raw = entry_id.partition("/")
    return (int(head), raw) if sep else (0, entry_id)


class RoutingCorrupt(ValueError):
    """The queue's meta hash holds a routing value that is not an integer (written by hand or
    by another program): nothing can be routed until it is put right."""


def read_routing(client: redis.Redis, keys: QueueKeys) -> tuple[int, int]:
    """The queue's (partitions, prefix_chars); (1, default) for a queue that has none.
    Raises RoutingCorrupt naming the key, the field and the value when one is not an integer."""
    values: Any = client.hmget(keys.meta, [META_PARTITIONS, META_PREFIX_CHARS])
    partitions = _meta_int(keys, META_PARTITIONS, values[0], 1)
    chars = _meta_int(keys, META_PREFIX_CHARS, values[1], DEFAULT_PREFIX_CHARS)
    return max(1, min(partitions, MAX_PARTITIONS)), max(0, chars)


def _meta_int(keys: QueueKeys, field: str, value: Any, default: int) -> int:
    if value is None:
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        raise RoutingCorrupt(
            f"the queue's {keys.meta} field {field!r} is {value!r}, not an integer: set it back "
            f"(HSET {keys.meta} {field} N) or delete the queue"
        ) from None
