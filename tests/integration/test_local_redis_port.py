"""The private Redis of `radixq run` (producer.local_redis.LocalRedis) when another process takes
the free port it chose before redis-server binds it: a new port is chosen; a port the caller
named is not replaced. A real redis-server and a real listening socket."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
import redis

from producer import local_redis
from producer.local_redis import LocalRedis, PortTaken

pytestmark = pytest.mark.integration


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_a_chosen_port_taken_first_is_chosen_again(taken_port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    real_free_port = local_redis.free_port
    offered = iter([taken_port])
    monkeypatch.setattr(local_redis, "free_port", lambda: next(offered, None) or real_free_port())
    with LocalRedis(use_server=True) as server:
        assert server.port != taken_port
        assert redis.Redis.from_url(server.url).ping()


def test_a_named_port_that_is_taken_fails_naming_the_cause(taken_port: int) -> None:
    with pytest.raises(PortTaken, match="Address already in use"):
        LocalRedis(port=taken_port, use_server=True).start()
