"""Two `radixq collect`s on one output file (real redis-server, CLI subprocesses): the one
that comes second refuses with exit code 2 and one line naming the holder, and every id is in
the file exactly once, in enqueue order."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from producer.client import Client
from producer.outlock import lock_path
from tests.integration.procs import REPO_ROOT, subprocess_env
from tests.integration.results import complete_all
from tests.waiting import LIVENESS_S, wait_until
from wire import exits
from wire.keys import QueueKeys
from wire.schema import Job

pytestmark = pytest.mark.integration
KEYS = QueueKeys()
JOBS = 3000


def start_collect(url: str, out: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "radixq", "collect", "-o", str(out), "--redis-url", url, "--quiet", *args],
        cwd=REPO_ROOT,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def ids_in(out: Path) -> list[str]:
    return [json.loads(line)["id"] for line in out.read_text().splitlines()]


def enqueued(url: str) -> tuple[redis.Redis, list[str]]:
    client = redis.Redis.from_url(url)
    ids = [f"j{i:05d}" for i in range(JOBS)]
    Client(client).enqueue([Job(id=i, prompt="p") for i in ids])
    return client, ids


def test_a_collect_started_while_another_writes_refuses_naming_it(redis_url: str, tmp_path: Path) -> None:
    client, ids = enqueued(redis_url)
    complete_all(client, ids[: JOBS // 2])
    out = tmp_path / "out.jsonl"
    first = start_collect(redis_url, out, "--timeout", "300")
    try:

        def holds_half() -> bool:  # it holds the file, waiting
            assert first.poll() is None, first.communicate()
            return out.exists() and len(ids_in(out)) == JOBS // 2

        wait_until(holds_half, "the first collect to write half the rows", poll_s=0.05)
        second = start_collect(redis_url, out)
        _, err = second.communicate(timeout=LIVENESS_S)
        assert second.returncode == exits.USAGE, err
        assert "Traceback" not in err and len(err.splitlines()) == 1, err
        assert err.startswith(f"error: {out} is being written by another collect or run (pid {first.pid} ")
        complete_all(client, ids[JOBS // 2 :])
        _, err = first.communicate(timeout=LIVENESS_S)
        assert first.returncode == exits.OK, err
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert ids_in(out) == ids
    assert not lock_path(out).exists()


def test_collects_started_together_write_each_id_once(redis_url: str, tmp_path: Path) -> None:
    client, ids = enqueued(redis_url)
    complete_all(client, ids)
    out = tmp_path / "out.jsonl"
    procs = [start_collect(redis_url, out, "--keep-results") for _ in range(3)]
    outcomes = [(proc, *proc.communicate(timeout=LIVENESS_S)) for proc in procs]
    pids = {proc.pid for proc in procs}
    for proc, _, err in outcomes:
        assert proc.returncode in (exits.OK, exits.USAGE), err
        if proc.returncode == exits.USAGE:  # refused: it names one of the others
            holder = int(err.split("(pid ")[1].split()[0])
            assert holder in pids - {proc.pid}, err
    assert any(proc.returncode == exits.OK for proc, _, _ in outcomes)
    assert ids_in(out) == ids  # each id once, in enqueue order
