"""Tags: a label given to jobs when they are enqueued (a batch id), so that ``radixq cancel
--tag`` finds them without listing the queue.

    tags          hash  job id -> its tag
    tag:<name>    set   ids of the jobs enqueued with tag <name>       (keys: wire.keys)

A batch's tags are written *before* the batch is enqueued (``tag_ahead``), so the set holds
every enqueued job of the tag, and possibly ids whose enqueue failed after that (cancel skips
ids the queue has no ``enqueued`` record of). A job keeps its first tag: enqueued again with
another one, it stays in the first tag's set only. A trimming collect forgets the records of
the ids it has written (producer.forget), their tags with them (``tags_of``/``untag``).

Cost: one hash field and one set member per tagged job (about twice the id's length plus 100
bytes); cancel reads the set on the server (SISMEMBER while it scans), never lists it whole.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import redis

from wire.keys import QueueKeys
from wire.schema import Job, Result

T = TypeVar("T")
MAX_TAG_CHARS = 256

# KEYS: tags, the tag's set. ARGV: the tag, then the ids. An id with no tag gets this one; an id
# with this tag is put in the set again (an enqueue retried); an id with another tag is left.
_TAG = """
local tag = ARGV[1]
for i = 2, #ARGV do
  local id = ARGV[i]
  if redis.call('HSETNX', KEYS[1], id, tag) == 1 or redis.call('HGET', KEYS[1], id) == tag then
    redis.call('SADD', KEYS[2], id)
  end
end
return 0
"""


def check_tag(tag: str) -> str:
    """``tag`` when it can name a tag: 1 to MAX_TAG_CHARS characters, none a control character;
    else ValueError saying why."""
    if not tag:
        raise ValueError("a tag must not be empty")
    if len(tag) > MAX_TAG_CHARS:
        raise ValueError(f"a tag has at most {MAX_TAG_CHARS} characters, not {len(tag)}")
    bad = next((c for c in tag if ord(c) < 32 or ord(c) == 127), None)
    if bad is not None:
        raise ValueError(f"a tag holds no control characters ({bad!r} in {tag!r})")
    return tag


def tag_ahead(
    client: redis.Redis,
    keys: QueueKeys,
    jobs: Iterable[Job | Result],
    tag: str,
    batch_size: int,
    call: Callable[[Callable[[], Any]], Any],
) -> Iterator[Job | Result]:
    """``jobs`` as they come, each batch of ``batch_size`` tagged before it is yielded (so
    before anything enqueues it); ``call`` runs each Redis step (a Backoff's retries)."""
    script = client.register_script(_TAG)
    batch: list[Job | Result] = []

    def flush() -> Iterator[Job | Result]:
        ids = [job.id for job in batch]
        call(lambda: script(keys=[keys.tags, keys.tag(tag)], args=[tag, *ids], client=client))
        yield from batch
        batch.clear()

    for job in jobs:
        batch.append(job)
        if len(batch) == batch_size:
            yield from flush()
    if batch:
        yield from flush()


def tags_of(pipe: Any, keys: QueueKeys, ids: list[str]) -> dict[str, list[str]]:
    """Tag -> those of ``ids`` that have it; ``pipe`` runs the read at once (a pipeline under
    WATCH, before its MULTI)."""
    found: list[Any] = pipe.hmget(keys.tags, ids)
    tagged: dict[str, list[str]] = {}
    for job_id, tag in zip(ids, found, strict=True):
        if tag is not None:
            tagged.setdefault(tag.decode(), []).append(job_id)
    return tagged


def untag(pipe: Any, keys: QueueKeys, tagged: dict[str, list[str]]) -> None:
    """Queue the commands that forget these ids' tags (``tagged``: tags_of's answer)."""
    for tag, ids in tagged.items():
        pipe.srem(keys.tag(tag), *ids)
        pipe.hdel(keys.tags, *ids)
