"""Redis Cluster: which client a URL gets, and which keys one transaction may hold.

A URL gets a cluster client (redis.cluster.RedisCluster: it follows MOVED and ASK, and learns
the new slot map after a failover or a reshard) when its scheme says so (``redis+cluster://``,
``rediss+cluster://``) or when the node it names answers ``INFO cluster`` with
``cluster_enabled:1``. Any other URL, or a node that cannot be asked, gets a plain client.

On a plain client every key of a queue lives on one server and one MULTI may hold them all.
On a cluster one MULTI (or one script, or one multi-key command) holds keys of one hash slot
only: ``together`` says whether it may (wire.keys says which keys share a slot).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import redis
from redis._parsers import CommandsParser
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.crc import key_slot
from redis.retry import Retry

CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}

# NOTE: no retries inside redis-py (its default backs off for seconds and re-sends a MULTI/EXEC
# whose reply was lost, without the WATCH it ran under): every caller retries at its own
# level, knowing what a repeated step means. A cluster client still follows MOVED and ASK.
OPTIONS: dict[str, Any] = {
    "socket_connect_timeout": 5,
    "socket_keepalive": True,
    "health_check_interval": 30,
}


def connect(url: str) -> redis.Redis:
    """A client for ``url``: a cluster client for a cluster node, else a plain one."""
    scheme, sep, rest = url.partition("://")
    if sep and scheme in CLUSTER_SCHEMES:
        return _cluster(f"{CLUSTER_SCHEMES[scheme]}://{rest}")
    return upgrade(redis.Redis.from_url(url, retry=Retry(NoBackoff(), 0), **OPTIONS), url)


def upgrade(client: redis.Redis, url: str) -> redis.Redis:
    """``client`` itself, or a cluster client in its place (closing it) when the node it talks
    to is a cluster node: for a client made while Redis was not answering yet."""
    if is_cluster(client) or url.partition("://")[0] not in ("redis", "rediss"):
        return client
    if not _cluster_enabled(client):
        return client
    client.close()
    return _cluster(url)


def _cluster_enabled(client: redis.Redis) -> bool:
    """Whether the node says it is part of a cluster; False when it cannot be asked (down, no
    password yet, no permission): the caller's first command reports that as it always did."""
    try:
        info: Any = client.info("cluster")
    except redis.RedisError:
        return False
    return int(info.get("cluster_enabled", 0)) == 1


def _cluster(url: str) -> redis.Redis:
    client = RedisCluster.from_url(url, retry=Retry(NoBackoff(), 0), require_full_coverage=False, **OPTIONS)
    # NOTE: the client and its pipelines share this parser; the class swap keeps what it read
    # from COMMAND at start and adds only the local reading of stream reads' keys
    client.commands_parser.__class__ = _StreamReadKeys
    return client  # type: ignore[return-value]


class _StreamReadKeys(CommandsParser):
    """redis-py's key finder, reading XREAD/XREADGROUP keys itself: their keys follow a
    keyword (STREAMS), which redis-py asks the server about (COMMAND GETKEYS, one more round
    trip for every read of a worker)."""

    def get_keys(self, redis_conn: Any, *args: Any) -> Any:
        name = str(args[0]).upper() if args else ""
        if name in ("XREAD", "XREADGROUP"):
            keys = stream_read_keys(name, args)
            if keys:
                return keys
        return super().get_keys(redis_conn, *args)


def stream_read_keys(name: str, args: tuple[Any, ...]) -> list[Any]:
    """The streams an XREAD or XREADGROUP command reads: the first half of what follows its
    STREAMS keyword (skipping XREADGROUP's group and consumer names, which may be any word)."""
    start = 4 if name == "XREADGROUP" else 1
    for at in range(start, len(args)):
        word = args[at].decode(errors="replace") if isinstance(args[at], bytes) else args[at]
        if isinstance(word, str) and word.upper() == "STREAMS":
            rest = args[at + 1 :]
            return list(rest[: len(rest) // 2])
    return []


def is_cluster(client: Any) -> bool:
    return isinstance(client, RedisCluster)


def together(client: Any, keys: Iterable[str]) -> bool:
    """Whether one transaction, script or multi-key command of ``client`` may touch all of ``keys``."""
    return not is_cluster(client) or len({key_slot(key.encode()) for key in keys}) <= 1


def by_slot(client: Any, keys: Iterable[str]) -> list[list[str]]:
    """``keys`` in groups that one command may hold together, in first-seen order."""
    if not is_cluster(client):
        return [list(keys)]
    groups: dict[int, list[str]] = {}
    for key in keys:
        groups.setdefault(key_slot(key.encode()), []).append(key)
    return list(groups.values())
