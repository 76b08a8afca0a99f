"""`radixq run` stopped early: Ctrl-C, SIGTERM, a second signal, kill -9 - and its private Redis.

Each test starts `radixq run` as a user would (its own session, as a terminal gives a job) with
the fake generator made slow (RADIXQ_FAKE_LATENCY_S), reads the run's private Redis through the
URL a worker got in its environment (the oracle for what had finished), signals the run, and
checks the output file, the exit code and /proc: no child process of the run survives it
(a zombie counts as gone: PID 1 here reaps no orphans) and no temporary folder of it is left.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from producer.local_redis import LocalRedis
from tests.conftest import require_redis_server
from tests.fake_generator import fake_text
from tests.integration.procs import (
    FAKE_GENERATOR,
    REPO_ROOT,
    cmdline,
    descendants,
    proc_stat,
    queue_redis,
    radixq,
    run_children,
    run_folders,
    still_running,
    subprocess_env,
)
from tests.jobs_stream import consumer_names, entry_fields, pending_count, pending_entries  # noqa: E402
from tests.waiting import LIVENESS_S, wait_until
from wire.keys import QueueKeys
from wire.status import decode_heartbeat

pytestmark = pytest.mark.integration

KEYS = QueueKeys()


@pytest.fixture(autouse=True)
def _needs_redis_server() -> None:
    require_redis_server()


def write_input(path: Path, count: int) -> list[str]:
    ids = [f"job{i:03d}" for i in range(count)]
    path.write_text(
        "".join(json.dumps({"id": job_id, "prompt": "x", "max_tokens": 4}) + "\n" for job_id in ids)
    )
    return ids


def start_run(tmp_path: Path, source: Path, out: Path, *args: str, **env: str) -> subprocess.Popen[bytes]:
    """`radixq run` in a session of its own (like a shell job), logging to tmp_path/run.log."""
    with open(tmp_path / "run.log", "ab") as log:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "radixq",
                "run",
                str(source),
                "-o",
                str(out),
                "--generator",
                FAKE_GENERATOR,
            ]
            + list(args),
            cwd=REPO_ROOT,
            env=subprocess_env(**env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def finished_and_held(client: redis.Redis) -> set[str]:
    """Ids that have a counted result now, plus ids some worker holds now."""
    done = {job_id.decode() for job_id in client.hkeys(KEYS.done)}
    held = {
        entry_fields(client, entry["message_id"])[b"id"].decode() for entry in pending_entries(client, KEYS)
    }
    return done | held


def read_output(out: Path) -> list[str]:
    """The ids of a valid JSONL output file, checking each line's text against the fake generator."""
    ids = []
    for line in out.read_text().splitlines():
        row = json.loads(line)
        assert row["error"] is None and row["choices"][0]["text"] == fake_text(row["id"])
        ids.append(row["id"])
    return ids


@pytest.fixture
def reaped() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Runs a test started; killed at the end if a failed test left them running."""
    runs: list[subprocess.Popen[bytes]] = []
    yield runs
    for run in runs:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm", "sigterm, shared redis"])
def test_signal_mid_run_drains_writes_what_finished_and_cleans_up(
    how: str, tmp_path: Path, reaped: list[subprocess.Popen[bytes]], request: pytest.FixtureRequest
) -> None:
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_input(source, 60)
    shared = ["--redis-url", request.getfixturevalue("redis_url")] if "shared" in how else []
    args = [*shared, "--workers", "2"]
    run = start_run(tmp_path, source, out, *args, RADIXQ_FAKE_LATENCY_S="0.4", RADIXQ_FAKE_CAPACITY="2")
    reaped.append(run)
    redis_pid, worker_pids = run_children(run, 2, num_servers=0 if shared else 1)
    children = descendants(run.pid)
    client = queue_redis(worker_pids[0])
    wait_until(lambda: out.exists() and len(out.read_text().splitlines()) >= 4, "4 results in the output")
    before = finished_and_held(client)
    if how == "ctrl-c":
        os.killpg(run.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    else:
        os.kill(run.pid, signal.SIGTERM)
    assert run.wait(timeout=LIVENESS_S) == 1
    log = (tmp_path / "run.log").read_text()

    written = read_output(out)
    assert len(written) == len(set(written)) and set(written) <= set(ids)
    assert before <= set(written), (
        f"finished or held before the signal but not written: {before - set(written)}"
    )
    assert len(written) < len(ids), "the run finished before the signal: nothing was tested"
    assert f"interrupted: wrote {len(written)} of 60 rows to {out}; run the same command again" in log
    assert "Traceback" not in log
    assert still_running(children) == [], f"left running: {[cmdline(p) for p in still_running(children)]}"
    assert set(worker_pids) <= set(children) and (shared or redis_pid in children)
    assert run_folders(run.pid) == []
    if shared:  # the workers put back what they did not finish and left the group
        assert pending_count(client, KEYS) == 0
        assert consumer_names(client, KEYS) == set()
    client.close()

    again = radixq(
        "run", str(source), "-o", str(out), *shared, "--generator", FAKE_GENERATOR, "--timeout", "60"
    )
    assert again.returncode == 0, again.stderr
    assert read_output(out) == ids  # every id exactly once, in input order


def test_shutdown_keeps_to_the_drain_timeout(tmp_path: Path, reaped: list[subprocess.Popen[bytes]]) -> None:
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_input(source, 6)
    run = start_run(
        tmp_path, source, out, "--drain-timeout-s", "2", RADIXQ_FAKE_LATENCY_S="600", RADIXQ_FAKE_CAPACITY="3"
    )
    reaped.append(run)
    _, (worker_pid,) = run_children(run, 1)
    children = descendants(run.pid)
    client = queue_redis(worker_pid)
    wait_until(lambda: pending_count(client, KEYS) == 3, "the worker to hold 3 jobs")
    client.close()
    signalled = time.monotonic()
    os.kill(run.pid, signal.SIGTERM)
    # NOTE: the jobs take 600 s: a run that exits before LIVENESS_S kept to its drain timeout
    assert run.wait(timeout=LIVENESS_S) == 1
    shutdown_s = time.monotonic() - signalled
    print(f"shutdown with --drain-timeout-s 2 and jobs that never finish: {shutdown_s:.2f} s")
    # The drain is 2 s all told: held jobs get until the give-back point (a quarter of the drain
    # before its end), then go back, then the generator stops; so not before 1.5 s (a load on
    # the box can only make it later: how much later is not this test's business).
    assert shutdown_s >= 1.5
    assert out.read_text() == ""
    assert still_running(children) == [] and run_folders(run.pid) == []


def test_second_signal_hurries_the_shutdown(tmp_path: Path, reaped: list[subprocess.Popen[bytes]]) -> None:
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_input(source, 6)
    run = start_run(
        tmp_path,
        source,
        out,
        "--drain-timeout-s",
        "600",
        RADIXQ_FAKE_LATENCY_S="600",
        RADIXQ_FAKE_CAPACITY="3",
    )
    reaped.append(run)
    _, (worker_pid,) = run_children(run, 1)
    children = descendants(run.pid)
    client = queue_redis(worker_pid)
    wait_until(lambda: pending_count(client, KEYS) == 3, "the worker to hold 3 jobs")
    os.killpg(run.pid, signal.SIGINT)

    def draining() -> bool:
        beats = map(decode_heartbeat, client.hvals(KEYS.workers))
        return any(beat is not None and beat.state == "draining" for beat in beats)

    wait_until(draining, "the worker's heartbeat to say it drains", tmp_path / "run.log")
    client.close()
    assert run.poll() is None  # draining: up to 600 s
    os.killpg(run.pid, signal.SIGINT)
    # NOTE: the drain (and the jobs) would last 600 s: exiting before LIVENESS_S is the hurry
    assert run.wait(timeout=LIVENESS_S) == 1
    assert still_running(children) == [] and run_folders(run.pid) == []


def test_timeout_stops_the_run_as_a_signal_does(
    tmp_path: Path, reaped: list[subprocess.Popen[bytes]]
) -> None:
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_input(source, 4)
    run = start_run(
        tmp_path, source, out, "--timeout", "3", "--drain-timeout-s", "1", RADIXQ_FAKE_LATENCY_S="60"
    )
    reaped.append(run)
    run_children(run, 1)
    children = descendants(run.pid)
    assert run.wait(timeout=LIVENESS_S) == 1
    log = (tmp_path / "run.log").read_text()
    assert f"timed out after 3s: wrote 0 of 4 rows to {out}; run the same command again to resume" in log
    assert still_running(children) == [] and run_folders(run.pid) == []


def test_kill_9_of_run_takes_its_children_and_a_later_run_removes_the_folder(
    tmp_path: Path, reaped: list[subprocess.Popen[bytes]]
) -> None:
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_input(source, 8)
    run = start_run(tmp_path, source, out, "--workers", "2", RADIXQ_FAKE_LATENCY_S="60")
    reaped.append(run)
    run_children(run, 2)
    children = descendants(run.pid)
    (folder,) = run_folders(run.pid)
    os.kill(run.pid, signal.SIGKILL)
    run.wait()
    wait_until(lambda: not still_running(children), "the run's redis-server and workers to die with it")
    assert folder.is_dir()  # nobody was left to remove it

    again = radixq("run", str(source), "-o", str(out), "--generator", FAKE_GENERATOR, "--timeout", "60")
    assert again.returncode == 0, again.stderr
    assert read_output(out) == ids
    assert not folder.exists()


def test_private_redis_wants_its_password_which_no_command_line_shows(
    tmp_path: Path, reaped: list[subprocess.Popen[bytes]]
) -> None:
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_input(source, 4)
    run = start_run(tmp_path, source, out, "--drain-timeout-s", "1", RADIXQ_FAKE_LATENCY_S="60")
    reaped.append(run)
    redis_pid, (worker_pid,) = run_children(run, 1)
    client = queue_redis(worker_pid)
    password = client.connection_pool.connection_kwargs["password"]
    assert password and len(password) >= 16
    port = client.connection_pool.connection_kwargs["port"]
    assert client.config_get("protected-mode") == {"protected-mode": "yes"}
    assert client.config_get("bind") == {"bind": "127.0.0.1"}
    client.close()
    for guess in (None, "guess"):
        stranger = redis.Redis(port=port, password=guess, retry=Retry(NoBackoff(), 0))
        with pytest.raises(redis.AuthenticationError):
            stranger.ping()
        stranger.close()

    for pid in (run.pid, redis_pid, worker_pid):
        assert password not in cmdline(pid)
    everyone = [entry for entry in Path("/proc").iterdir() if entry.name.isdigit()]
    assert worker_pid in {int(entry.name) for entry in everyone}
    for entry in everyone:  # what `ps` shows
        try:
            assert password not in cmdline(int(entry.name)), cmdline(int(entry.name))
        except OSError:
            pass  # exited meanwhile
    os.kill(run.pid, signal.SIGTERM)
    assert run.wait(timeout=LIVENESS_S) == 1
    assert password not in (tmp_path / "run.log").read_text()


def test_local_redis_failing_to_start_leaves_nothing_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    # The server exits at once (its port is taken).
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = LocalRedis(port=taken.getsockname()[1], use_server=True, appendonly=False)
        folder = server.data_dir
        with pytest.raises(RuntimeError, match="exited"), server:
            pass
    assert not folder.exists()

    # The server runs, but start fails after it was started.
    started: dict[int, str] = {}

    def fail_when_ready(self: LocalRedis) -> None:
        assert self.pid is not None
        wait_until(lambda: redis.Redis(port=self.port, password=self.password).ping(), "redis-server")
        stat = proc_stat(self.pid)
        assert stat is not None
        started[self.pid] = stat[2]
        raise RuntimeError("injected")

    monkeypatch.setattr(LocalRedis, "_wait_ready", fail_when_ready)
    server = LocalRedis(use_server=True, appendonly=False, with_password=True)
    folder = server.data_dir
    with pytest.raises(RuntimeError, match="injected"), server:
        pass
    assert started and still_running(started) == [] and not folder.exists()


@pytest.mark.parametrize("workers", [2, 4])
def test_a_run_resumed_after_ctrl_c_is_in_input_order(
    workers: int, tmp_path: Path, reaped: list[subprocess.Popen[bytes]]
) -> None:
    """Issue 17, item 1. Four early jobs are too slow to finish before the drain timeout, so
    the interrupted run writes the later jobs behind them (out of order, as it should: they
    finished) and puts the slow ones back; the resumed run writes those, and the file is then
    in input order with each id once."""
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_input(source, 40)
    slow = ids[8:12]
    run = start_run(
        tmp_path,
        source,
        out,
        "--workers",
        str(workers),
        "--drain-timeout-s",
        "1",
        RADIXQ_FAKE_LATENCY_S="0.05",
        RADIXQ_FAKE_CAPACITY="4",
        RADIXQ_FAKE_SLOW_IDS=",".join(slow),
        RADIXQ_FAKE_SLOW_S="600",
    )
    reaped.append(run)
    _, worker_pids = run_children(run, workers)
    client = queue_redis(worker_pids[0])
    wait_until(lambda: client.hlen(KEYS.done) == len(ids) - len(slow), "every fast job done")
    client.close()
    os.killpg(run.pid, signal.SIGINT)
    assert run.wait(timeout=LIVENESS_S) == 1
    first = read_output(out)
    assert set(first) == set(ids) - set(slow)  # the rows behind the missing ones were written

    again = radixq(
        "run", str(source), "-o", str(out), "--workers", str(workers), "--generator", FAKE_GENERATOR
    )
    assert again.returncode == 0, again.stderr
    assert read_output(out) == ids  # every id exactly once, in input order
