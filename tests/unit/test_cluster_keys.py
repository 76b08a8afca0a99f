"""Which keys of a queue share a Redis Cluster hash slot (wire.keys, wire.cluster)."""

from __future__ import annotations

import fakeredis
from redis.crc import key_slot

from wire.cluster import by_slot, together
from wire.keys import QueueKeys
from wire.redis_errors import check_url


def slot(key: str) -> int:
    return key_slot(key.encode())


def test_the_keys_of_the_atomic_transactions_share_the_queue_slot() -> None:
    keys = QueueKeys("q")
    atomic = [keys.jobs, keys.results, keys.done, keys.failed, keys.dead, keys.enqueued]
    atomic += [keys.digests, keys.order, keys.workers, keys.meta, keys.requeued, keys.partition(0)]
    assert {slot(key) for key in atomic} == {slot(keys.meta)}


def test_partitions_above_zero_spread_over_slots() -> None:
    keys = QueueKeys("q")
    slots = {slot(key) for key in keys.partitions(64)[1:]}
    assert len(slots) == 63 and slot(keys.meta) not in slots


def test_no_partition_is_spelled_like_another_queues_key() -> None:
    names = {key for queue in ("a", "a:1", "a:1:1") for key in QueueKeys(queue).partitions(16)}
    assert len(names) == 3 * 16
    assert QueueKeys("a").partition(1) != QueueKeys("a:1").jobs


def test_a_plain_client_holds_every_key_together() -> None:
    plain = fakeredis.FakeRedis()
    keys = QueueKeys("q").partitions(16)
    assert together(plain, keys) and by_slot(plain, keys) == [keys]


def test_cluster_urls_pass_the_url_check() -> None:
    check_url("redis+cluster://127.0.0.1:7000")
    check_url("rediss+cluster://user:pw@example.com:7000")
