"""Docker healthcheck of a radixq worker container: healthy while its worker heartbeats.

Run inside the worker's container (the compose files do: ``python /app/docker/healthcheck.py``).
It reads the queue's workers hash (``radixq:{QUEUE}:workers``; a worker writes its Heartbeat
there every ``interval_s``, 2 s by default) and looks at this container's worker: the one named
``--name``, else any named ``<hostname>-<pid>`` (the worker's default name; ``hostname`` is
this container's). Exit 0 when the freshest of them is at most ``--max-age-s`` old (default:
``DEAD_AFTER_BEATS`` of the worker's own heartbeat interval, the age at which ``radixq status``
calls a worker dead); else exit 1. Either way it prints one line, which Docker keeps in
``docker inspect``. Redis URL and queue come from the environment the worker reads:
RADIXQ_REDIS_URL (then REDIS_URL) and RADIXQ_QUEUE.

While the worker gets its model its heartbeat says ``loading``: unhealthy (not ready: the
Kubernetes readiness probe runs this too, so a rollout waits for loaded workers); the compose
files give the worker a ``start_period`` long enough for the first start (model download or
conversion, kernel compiles).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

import redis

from wire.keys import QueueKeys, env_queue, env_redis_url
from wire.redis_errors import describe
from wire.status import DEAD_AFTER_BEATS, LOADING, Heartbeat, decode_heartbeat, now_ms

HEALTHY, UNHEALTHY = 0, 1  # Docker's meanings; 2 is reserved


def is_own_worker(worker_name: str, hostname: str) -> bool:
    """A worker of this container by its default name, ``<hostname>-<pid>``."""
    prefix = f"{hostname}-"
    return worker_name.startswith(prefix) and worker_name[len(prefix) :].isdigit()


def freshest(beats: dict[bytes, bytes], name: str | None, hostname: str) -> Heartbeat | None:
    """The newest readable heartbeat of this container's worker, None if it has none."""
    ours = []
    for field, data in beats.items():
        worker_name = field.decode(errors="replace")
        if worker_name == name or (name is None and is_own_worker(worker_name, hostname)):
            beat = decode_heartbeat(data)
            if beat is not None:
                ours.append(beat)
    return max(ours, key=lambda beat: beat.last_seen_ms, default=None)


def check(url: str, queue: str, name: str | None, max_age_s: float | None, hostname: str) -> tuple[int, str]:
    """(exit code, one line) for the worker of this container."""
    keys = QueueKeys(queue)
    try:
        with redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2) as client:
            beats = client.hgetall(keys.workers)
    except (redis.RedisError, OSError, ValueError) as exc:  # ValueError: a malformed URL
        return UNHEALTHY, f"unhealthy: {describe(exc, url)}"
    who = name or f"{hostname}-<pid>"
    beat = freshest(beats, name, hostname)
    if beat is None:
        return UNHEALTHY, f"unhealthy: no heartbeat from worker {who} in {keys.workers} (still starting?)"
    age_s = max(0.0, (now_ms() - beat.last_seen_ms) / 1000)
    limit_s = max_age_s if max_age_s is not None else DEAD_AFTER_BEATS * max(beat.interval_s, 0.1)
    line = f"worker {beat.name}: heartbeat {age_s:.1f} s ago (limit {limit_s:g} s), {beat.state}, {beat.in_flight} in flight"
    if beat.state == LOADING:
        return UNHEALTHY, f"unhealthy: {line} (loading its model {beat.model})"
    return (HEALTHY, f"healthy: {line}") if age_s <= limit_s else (UNHEALTHY, f"unhealthy: {line}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", help="the worker's --name (default: any <hostname>-<pid>)")
    parser.add_argument("--max-age-s", type=float, help="oldest heartbeat still healthy")
    args = parser.parse_args(argv)
    url, queue = env_redis_url(os.environ), env_queue(os.environ)
    code, line = check(url, queue, args.name, args.max_age_s, socket.gethostname())
    print(line)
    return code


if __name__ == "__main__":
    sys.exit(main())
