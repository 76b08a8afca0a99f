"""docker/healthcheck.py, the worker containers' healthcheck, against a real redis-server and a
real `radixq worker` (fake generator): healthy while the worker heartbeats, unhealthy once it
stops, when it never started, and when Redis cannot be reached; one line every time."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
import redis

from tests.integration.procs import FAKE_GENERATOR, REPO_ROOT, subprocess_env
from tests.waiting import LIVENESS_S, wait_until
from wire.keys import QueueKeys
from wire.status import DEAD_AFTER_BEATS, Heartbeat, now_ms

pytestmark = pytest.mark.integration

HEALTHCHECK = REPO_ROOT / "docker" / "healthcheck.py"


def healthcheck(redis_url: str, *args: str, queue: str = "default") -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, str(HEALTHCHECK), *args],
        env=subprocess_env(RADIXQ_REDIS_URL=redis_url, RADIXQ_QUEUE=queue),
        capture_output=True,
        text=True,
        timeout=30,
    )
    output = done.stdout + done.stderr
    assert len(output.splitlines()) == 1, output  # one line, never a traceback
    return done.returncode, output.strip()


def write_heartbeat(
    redis_url: str, name: str, age_s: float, interval_s: float = 2.0, state: str = "running"
) -> None:
    beat = Heartbeat(
        name=name, pid=7, last_seen_ms=now_ms() - int(age_s * 1000), interval_s=interval_s, state=state
    )
    with redis.Redis.from_url(redis_url) as client:
        client.hset(QueueKeys().workers, name, msgspec.msgpack.encode(beat))


def test_healthy_while_the_worker_heartbeats_unhealthy_once_it_stops(redis_url: str, tmp_path: Path) -> None:
    # No --name: the worker calls itself <hostname>-<pid>, as it does in a container.
    with open(tmp_path / "worker.log", "wb") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "radixq", "worker", "--generator", FAKE_GENERATOR],
            cwd=REPO_ROOT,
            env=subprocess_env(RADIXQ_REDIS_URL=redis_url),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        checked: list[tuple[int, str]] = []
        wait_until(
            lambda: checked.append(healthcheck(redis_url)) or checked[-1][0] == 0,
            lambda: f"healthy ({checked[-1]})",
            tmp_path / "worker.log",
            poll_s=0.2,
        )
        code, line = checked[-1]
        assert line.startswith(f"healthy: worker {socket.gethostname()}-{worker.pid}: heartbeat ")

        worker.send_signal(signal.SIGSTOP)  # hung: no more heartbeats
        wait_until(  # its last heartbeat ages past 1 s
            lambda: checked.append(healthcheck(redis_url, "--max-age-s", "1")) or checked[-1][0] != 0,
            "unhealthy",
            poll_s=0.2,
        )
        code, line = checked[-1]
        assert code == 1 and line.startswith("unhealthy: worker "), line
    finally:
        worker.send_signal(signal.SIGCONT)
        worker.terminate()
        worker.wait(timeout=LIVENESS_S)


def test_default_limit_is_the_age_at_which_status_calls_a_worker_dead(redis_url: str) -> None:
    host = socket.gethostname()
    limit_s = DEAD_AFTER_BEATS * 2.0  # radixq status: dead after 5 missed 2 s heartbeats
    write_heartbeat(redis_url, f"{host}-41", age_s=limit_s - 2)
    assert healthcheck(redis_url)[0] == 0
    write_heartbeat(redis_url, f"{host}-41", age_s=limit_s + 2)
    code, line = healthcheck(redis_url)
    assert code == 1 and f"limit {limit_s:g} s" in line, line
    # a restarted worker of the same container (another pid) is the one that counts: the freshest
    write_heartbeat(redis_url, f"{host}-42", age_s=0.5)
    assert healthcheck(redis_url)[0] == 0


def test_only_this_containers_worker_counts(redis_url: str) -> None:
    code, line = healthcheck(redis_url)
    assert code == 1 and "no heartbeat from worker" in line, line
    host = socket.gethostname()
    write_heartbeat(redis_url, "0123456789ab-1", age_s=0)  # another container
    write_heartbeat(redis_url, f"{host}-tools", age_s=0)  # not <hostname>-<pid>
    assert healthcheck(redis_url)[0] == 1
    assert healthcheck(redis_url, "--name", f"{host}-tools")[0] == 0  # a worker started with --name
    write_heartbeat(redis_url, f"{host}-7", age_s=0)
    assert healthcheck(redis_url, queue="other")[0] == 1  # RADIXQ_QUEUE names the hash
    assert healthcheck(redis_url)[0] == 0


def test_unreachable_or_malformed_redis_is_unhealthy_in_one_line() -> None:
    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code, line = healthcheck(f"redis://127.0.0.1:{port}/0")
    assert code == 1 and line.startswith("unhealthy: ") and f"127.0.0.1:{port}" in line, line
    code, line = healthcheck("http://nowhere")
    assert code == 1 and line.startswith("unhealthy: "), line


def test_a_worker_loading_its_model_is_not_ready_yet(redis_url: str) -> None:
    """Since issue 32 a worker beats while it loads (state loading): the readiness probe still
    waits for the model, as it did when a loading worker had no heartbeat."""
    name = f"{socket.gethostname()}-43"
    write_heartbeat(redis_url, name, age_s=0, state="loading")
    code, line = healthcheck(redis_url)
    assert code == 1 and "loading its model" in line, line
    write_heartbeat(redis_url, name, age_s=0)
    assert healthcheck(redis_url)[0] == 0
