"""RedisJobQueue.complete, the script that writes a batch of results (worker.queue.streams.writes),
read back with plain Redis commands on a real redis-server, on the 3-node Redis Cluster (where
partitions 1 and up live in other slots and are acknowledged after the script) and on
fakeredis (which the unit tests' queue world runs on)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest
import redis

from tests.redis_cluster import running_cluster
from wire.cluster import connect
from wire.epoch import create_epoch
from wire.keys import QueueKeys
from wire.routing import qualify
from wire.schema import Choice, Result, decode_result, encode, error_result
from wire.streams import ensure_groups
from worker.queue.jobqueue import Completion, DeadLetter, Write
from worker.queue.streams import RedisJobQueue

pytestmark = pytest.mark.integration

KEYS = QueueKeys("writes")
PARTITIONS = 3


@pytest.fixture(scope="module")
def cluster_url() -> Iterator[str]:
    with running_cluster(3) as nodes:
        yield f"redis://127.0.0.1:{nodes.ports[0]}"


@pytest.fixture(params=["server", "cluster", "fakeredis"])
def client(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "fakeredis":
        yield fakeredis.FakeRedis()
        return
    url = request.getfixturevalue("redis_url" if request.param == "server" else "cluster_url")
    conn = connect(url)
    if request.param == "cluster":
        conn.flushall(target_nodes="primaries")  # type: ignore[call-arg]
    yield conn
    conn.close()


def queue_of(client: Any) -> RedisJobQueue:
    return RedisJobQueue(client, KEYS.queue, "w", min_idle_ms=60_000, dead_after_ms=60_000)


def delivered(client: Any, jobs: list[tuple[int, str]]) -> list[str]:
    """Each (partition, job id) added and read by consumer ``w``; their qualified entry ids."""
    ensure_groups(client, KEYS, PARTITIONS)
    entry_ids = []
    for partition, job_id in jobs:
        stream = KEYS.partition(partition)
        raw = client.xadd(stream, {"id": job_id, "job": b"payload"}).decode()
        read: Any = client.xreadgroup(KEYS.group, "w", {stream: ">"}, count=1)
        assert read[0][1][0][0].decode() == raw
        entry_ids.append(qualify(partition, raw))
    return entry_ids


def ok(job_id: str) -> Result:
    return Result(id=job_id, choices=[Choice(index=0, text=f"answer to {job_id}", token_ids=[1, 2], finish_reason="stop")])


def write(result: Result, entry_id: str, epoch: str | None, **fields: Any) -> Write:
    return Write(Completion(result, entry_id, epoch=epoch, **fields), encode(result))


def results(client: Any) -> list[tuple[str, str, Result, str | None]]:
    """(id, entry, result, epoch) of each results-stream entry, in order."""
    found = []
    for _, fields in client.xrange(KEYS.results):
        epoch = fields.get(b"epoch")
        found.append(
            (
                fields[b"id"].decode(),
                fields[b"entry"].decode(),
                decode_result(fields[b"result"]),
                epoch.decode() if epoch is not None else None,
            )
        )
    return found


def text_hash(client: Any, key: str) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in client.hgetall(key).items()}


def pending(client: Any) -> int:
    return sum(int(client.xpending(stream, KEYS.group)["pending"]) for stream in KEYS.partitions(PARTITIONS))


def test_a_batch_lands_whole(client: Any) -> None:
    epoch = create_epoch(client, KEYS)
    e = delivered(client, [(0, "a"), (1, "b"), (2, "c"), (1, "d"), (2, "d"), (0, "old")])
    client.hset(KEYS.done, "old", "0-1")  # done before: its entry is only acknowledged
    failed = error_result("b", "invalid_job", "field prompt: must be a string")
    dead = error_result("c", "dead_letter", "crashed the engine 4 times")
    writes = [
        write(ok("a"), e[0], epoch),
        write(failed, e[1], epoch),
        write(dead, e[2], epoch, dead=DeadLetter(b"the job", "crashed the engine 4 times", 4)),
        write(ok("d"), e[3], None, also_ack=(e[4],)),
    ]
    assert queue_of(client).complete(writes, [e[5]]) == []
    assert [(i, entry, r.id, ep) for i, entry, r, ep in results(client)] == [
        ("a", e[0], "a", epoch),
        ("b", e[1], "b", epoch),
        ("c", e[2], "c", epoch),
        ("d", e[3], "d", None),
    ]
    assert results(client)[0][2].choices[0].text == "answer to a"
    assert text_hash(client, KEYS.done) == {"a": e[0], "b": e[1], "c": e[2], "d": e[3], "old": "0-1"}
    assert text_hash(client, KEYS.failed) == {"b": "invalid_job", "c": "dead_letter"}
    letters = [{k.decode(): v for k, v in f.items()} for _, f in client.xrange(KEYS.dead)]
    assert letters == [
        {
            "id": b"c",
            "entry": e[2].encode(),
            "job": b"the job",
            "reason": b"crashed the engine 4 times",
            "attempts": b"4",
        }
    ]
    assert pending(client) == 0


def test_the_first_result_written_counts(client: Any) -> None:
    epoch = create_epoch(client, KEYS)
    e = delivered(client, [(0, "x"), (1, "y"), (2, "y")])
    client.hset(KEYS.done, "x", "7-0")  # another delivery of x was written first
    writes = [
        write(error_result("x", "internal", "late duplicate"), e[0], epoch),
        write(ok("y"), e[1], epoch),
        write(error_result("y", "internal", "second run"), e[2], epoch),
    ]
    assert queue_of(client).complete(writes, []) == []
    assert [(i, entry) for i, entry, _, _ in results(client)] == [("y", e[1])]
    assert text_hash(client, KEYS.done) == {"x": "7-0", "y": e[1]}
    assert text_hash(client, KEYS.failed) == {}  # neither error is the counted result
    assert pending(client) == 0


def test_writes_of_another_epoch_are_left_out(client: Any) -> None:
    epoch = create_epoch(client, KEYS)
    e = delivered(client, [(0, "old"), (1, "now"), (2, "before-epochs"), (0, "done")])
    client.hset(KEYS.done, "done", "1-0")
    stale = write(ok("old"), e[0], "an-epoch-redis-lost")
    writes = [stale, write(ok("now"), e[1], epoch), write(ok("before-epochs"), e[2], None)]
    assert queue_of(client).complete(writes, [e[3]]) == [stale]
    assert [i for i, _, _, _ in results(client)] == ["now", "before-epochs"]
    assert set(text_hash(client, KEYS.done)) == {"now", "before-epochs", "done"}
    held: Any = client.xpending_range(KEYS.partition(0), KEYS.group, "-", "+", 10)
    assert [h["message_id"].decode() for h in held] == [e[0].split(":")[-1]]  # the stale one only


def test_a_queue_without_an_epoch_takes_writes_of_none_only(client: Any) -> None:
    e = delivered(client, [(0, "p"), (1, "q")])
    stale = write(ok("q"), e[1], "an-epoch-redis-lost")
    assert queue_of(client).complete([write(ok("p"), e[0], None), stale], []) == [stale]
    assert [i for i, _, _, _ in results(client)] == ["p"]
    assert pending(client) == 1


def test_a_batch_larger_than_one_script_call_takes(client: Any) -> None:
    """Lua's unpack has a limit (about 8,000 values): the script splits its long commands."""
    epoch = create_epoch(client, KEYS)
    ensure_groups(client, KEYS, PARTITIONS)
    count = 2_500
    with client.pipeline(transaction=False) as pipe:
        for i in range(count):
            pipe.xadd(KEYS.jobs, {"id": f"j{i}", "job": b"payload"})
        pipe.execute()
    read: Any = client.xreadgroup(KEYS.group, "w", {KEYS.jobs: ">"}, count=count)
    entries = [entry_id.decode() for entry_id, _ in read[0][1]]
    writes = [write(ok(f"j{i}"), qualify(0, raw), epoch) for i, raw in enumerate(entries)]
    assert queue_of(client).complete(writes, []) == []
    assert client.xlen(KEYS.results) == count and client.hlen(KEYS.done) == count
    assert pending(client) == 0


def test_a_plain_server_counts_one_command_a_result_and_a_few_a_batch(redis_url: str) -> None:
    """What the script costs, by INFO commandstats: per batch one EVALSHA, the epoch, the done
    marks, one HSET and one XACK per partition; per new result one XADD."""
    client = redis.Redis.from_url(redis_url)
    epoch = create_epoch(client, KEYS)
    e = delivered(client, [(i % 2, f"j{i}") for i in range(20)])
    queue = queue_of(client)
    queue.complete([write(ok("warm"), e[0], epoch)], [])  # loads the script
    client.config_resetstat()
    queue.complete([write(ok(f"j{i}"), e[i], epoch) for i in range(1, 20)], [])
    stats: Any = client.info("commandstats")
    calls = {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}
    calls.pop("config|resetstat", None)
    calls.pop("info", None)
    assert calls == {"evalsha": 1, "hget": 1, "hmget": 1, "xadd": 19, "hset": 1, "xack": 2}


def test_a_cluster_client_reads_streams_without_asking_the_server_for_their_keys(cluster_url: str) -> None:
    """A worker's XREADGROUP on a cluster goes straight to the node of its streams' slot:
    redis-py alone would send COMMAND GETKEYS first (the keys follow the STREAMS keyword)."""
    client = connect(cluster_url)
    client.flushall(target_nodes="primaries")  # type: ignore[call-arg]
    stream = KEYS.partition(1)
    ensure_groups(client, KEYS, PARTITIONS)
    client.xadd(stream, {"id": "j"})
    nodes = [redis.Redis(host=n.host, port=n.port) for n in client.get_primaries()]  # type: ignore[attr-defined]

    def getkeys_calls() -> int:
        return sum(int(node.info("commandstats").get("cmdstat_command|getkeys", {}).get("calls", 0)) for node in nodes)

    before = getkeys_calls()
    direct: Any = client.xreadgroup(KEYS.group, "STREAMS", {stream: "0"}, count=1)  # a consumer named like the keyword
    with client.pipeline(transaction=False) as pipe:
        pipe.xreadgroup(KEYS.group, "w", {stream: ">"}, count=1)
        piped: Any = pipe.execute()
    assert getkeys_calls() == before
    assert direct[0][0].decode() == stream and direct[0][1] == []
    assert piped[0][0][0].decode() == stream and piped[0][0][1][0][1] == {b"id": b"j"}
    client.close()
