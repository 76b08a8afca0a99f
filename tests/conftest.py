"""Shared fixtures: a private redis-server for integration tests, fakeredis for unit tests."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import fakeredis
import pytest
import redis

REPO_ROOT = Path(__file__).resolve().parent.parent
# NOTE: makes `tests.*` importable under bare `pytest` and in worker subprocesses.
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from producer.local_redis import LocalRedis  # noqa: E402


def require_redis_server() -> None:
    if shutil.which("redis-server") is None:
        message = "redis-server is not installed (apt-get install redis-server)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[LocalRedis]:
    """One private redis-server (AOF on) on a free loopback port for the whole session."""
    require_redis_server()
    with LocalRedis(use_server=True) as server:
        yield server


@pytest.fixture
def redis_url(redis_server: LocalRedis) -> Iterator[str]:
    """The session server's URL, emptied before each test."""
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    yield redis_server.url


@pytest.fixture
def fake_redis() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis()


@pytest.fixture(autouse=True)
def _reap_workers() -> Iterator[None]:
    """Workers a test started (tests.integration.procs) and left running, because it failed
    before stopping them, are killed when it ends: an engine worker whose Redis is gone would
    otherwise retry for ever (its scheduler dies with it)."""
    from tests.integration.procs import STARTED

    first = len(STARTED)
    yield
    for proc in STARTED[first:]:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    del STARTED[first:]


REAL_MODEL_FIXTURES = frozenset({"smollm2_dir"})


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The real-model tier is a mark: a test that reaches a real model's fixture (directly or
    through another fixture) without ``@pytest.mark.model`` stops the run, so that the fast
    tier (``-m 'not gpu and not model'``) never loads one by accident."""
    unmarked = [
        item.nodeid
        for item in items
        if REAL_MODEL_FIXTURES & set(getattr(item, "fixturenames", ()))
        and item.get_closest_marker("model") is None
    ]
    if unmarked:
        raise pytest.UsageError(
            "these tests load a real model but are not marked @pytest.mark.model:\n  " + "\n  ".join(unmarked)
        )
