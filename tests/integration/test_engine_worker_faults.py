"""The real engine worker (a tiny random Llama on CPU) behind a real redis-server, under faults:
signals, kill -9, a slow engine and a job that crashes the engine. Faults are injected into the
scheduler process with RADIXQ_FAULT (worker/engine/faults.py); expected tokens come from
transformers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from producer.client import Client
from producer.collector import Collector
from tests.integration.procs import children, is_alive, radixq, start_engine_worker
from tests.jobs_stream import consumer_names, pending_count
from tests.model_fixtures import hf_from_dir, hf_greedy, tiny_hf_model
from tests.waiting import LIVENESS_S, wait_until
from wire.keys import QueueKeys
from wire.schema import Job, SamplingParams
from wire.status import Heartbeat, decode_heartbeat, serving

pytestmark = pytest.mark.integration

POISON = 77
KEYS = QueueKeys()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("faults-llama")
    tiny_hf_model("llama", spread=0.2, max_position_embeddings=256).save_pretrained(path)
    return path


def registered(client: Client) -> bool:
    return serving(client.redis, KEYS) == ["eng"]  # its model loaded


def scheduler_of(worker: subprocess.Popen[bytes]) -> int:
    (pid,) = children(worker.pid, "worker.scheduler.main")
    return pid


def jobs(count: int, max_tokens: int) -> list[Job]:
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    return [Job(id=f"j{i}", input_ids=[5 + i, 6, 7], sampling=sampling) for i in range(count)]


def test_ctrl_c_on_an_idle_worker_exits_at_once_and_leaves_nothing(
    redis_url: str, model_dir: Path, tmp_path: Path
) -> None:
    client = Client.from_url(redis_url)
    log_path = tmp_path / "w.log"
    worker = start_engine_worker(redis_url, model_dir, log_path)
    wait_until(lambda: registered(client), "the worker's heartbeat", log_path=log_path)
    scheduler = scheduler_of(worker)
    os.killpg(worker.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
    # NOTE: "at once" is the worker's own exit after one blocking read (1 s): the deadline only
    # turns a hang into a failure (an idle worker that ignored the signal would never exit)
    assert worker.wait(timeout=LIVENESS_S) == 0, log_path.read_text()[-3000:]
    wait_until(lambda: not is_alive(scheduler), "the scheduler to exit")
    text = log_path.read_text()
    assert "Traceback" not in text and "KeyboardInterrupt" not in text
    assert not registered(client)


def test_kill_9_of_the_worker_takes_its_scheduler_along(
    redis_url: str, model_dir: Path, tmp_path: Path
) -> None:
    client = Client.from_url(redis_url)
    log_path = tmp_path / "w.log"
    worker = start_engine_worker(redis_url, model_dir, log_path)
    wait_until(lambda: registered(client), "the worker's heartbeat", log_path=log_path)
    scheduler = scheduler_of(worker)
    (folder,) = socket_dirs_of(worker.pid)
    worker.kill()
    worker.wait(timeout=10)
    wait_until(lambda: not is_alive(scheduler), "the orphaned scheduler to die")
    # Its socket folder outlives it (nothing ran to remove it); the next worker to start does.
    assert folder.exists()
    log_path = tmp_path / "w2.log"
    second = start_engine_worker(redis_url, model_dir, log_path, name="second")
    wait_until(lambda: not folder.exists(), "the next worker to remove the folder", log_path=log_path)
    second.kill()
    second.wait(timeout=10)


def socket_dirs_of(pid: int) -> list[Path]:
    """The scheduler socket folders whose owner file names ``pid`` (worker.frontend.process)."""
    from wire.owned_dirs import OWNER_FILE
    from worker.frontend.process import SOCKET_DIR_PREFIX

    found = []
    for folder in Path(tempfile.gettempdir()).glob(f"{SOCKET_DIR_PREFIX}*"):
        owner = folder / OWNER_FILE
        if owner.exists() and owner.read_text().split()[0] == str(pid):
            found.append(folder)
    return found


def test_ctrl_c_mid_run_drains_writes_results_and_gives_the_rest_back(
    redis_url: str, model_dir: Path, tmp_path: Path
) -> None:
    client = Client.from_url(redis_url)
    work = jobs(12, max_tokens=40)
    client.enqueue(work)
    log_path = tmp_path / "w.log"
    # 4 at a time, each step 30 ms longer: ~1.2 s a job, so a signal lands mid-run
    worker = start_engine_worker(
        redis_url,
        model_dir,
        log_path,
        "--read-window",
        "4",
        "--drain-timeout-s",
        "20",
        fault="sleep-per-step:30",
    )
    wait_until(
        lambda: client.redis.hlen(KEYS.done) >= 2 and pending_count(client.redis, KEYS) > 0,
        "jobs done while others are held",
        log_path=log_path,
    )
    scheduler = scheduler_of(worker)
    os.killpg(worker.pid, signal.SIGINT)
    assert worker.wait(timeout=LIVENESS_S) == 0, log_path.read_text()[-3000:]
    wait_until(lambda: not is_alive(scheduler), "the scheduler to exit")
    assert "Traceback" not in log_path.read_text()
    done = client.redis.hlen(KEYS.done)
    status = client.status()
    # everything held was either finished and written or given back; nothing left pending
    assert status.in_flight == 0 and done + status.queued == len(work)
    assert b"eng" not in consumer_names(client.redis, KEYS)
    out = tmp_path / "out.jsonl"
    Collector(client.redis).collect(out, wait=False)
    expected = hf_greedy(hf_from_dir(model_dir), work[0].input_ids or [], 40)
    rows = {row["id"]: row for row in map(json.loads, out.read_text().splitlines())}
    assert rows["j0"]["choices"][0]["token_ids"] == expected


def test_sigterm_drain_stays_within_its_timeout(redis_url: str, model_dir: Path, tmp_path: Path) -> None:
    client = Client.from_url(redis_url)
    client.enqueue(jobs(4, max_tokens=200))  # ~200 steps of 100 ms: far longer than the drain
    log_path = tmp_path / "w.log"
    worker = start_engine_worker(
        redis_url, model_dir, log_path, "--drain-timeout-s", "3", fault="sleep-per-step:100"
    )
    wait_until(lambda: pending_count(client.redis, KEYS) == 4, "jobs held", log_path=log_path)
    started = time.monotonic()
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=LIVENESS_S) == 0, log_path.read_text()[-3000:]
    print(f"drain with --drain-timeout-s 3: {time.monotonic() - started:.1f} s")
    # The drain kept to its timeout: the jobs (about 20 s of steps) were given back unfinished;
    # a drain that waited for them would have written their rows instead.
    status = client.status()
    assert status.in_flight == 0 and status.queued == 4 and status.done == 0  # all given back, none lost


def test_a_job_that_crashes_the_engine_is_dead_lettered_alone(
    redis_url: str, model_dir: Path, tmp_path: Path
) -> None:
    client = Client.from_url(redis_url)
    innocents = jobs(8, max_tokens=6)
    poison = Job(id="poison", input_ids=[3, POISON, 4], sampling=SamplingParams(max_tokens=6, temperature=0))
    client.enqueue([*innocents[:4], poison, *innocents[4:]])
    log_path = tmp_path / "w.log"
    worker = start_engine_worker(
        redis_url, model_dir, log_path, "--max-attempts", "2", fault=f"raise-on-token:{POISON}"
    )
    try:
        out = tmp_path / "out.jsonl"
        report = Collector(client.redis).collect(out, wait=True, timeout_s=240)
        assert report.missing == [], log_path.read_text()[-4000:]

        def heartbeat() -> Heartbeat | None:
            return decode_heartbeat(client.redis.hget(KEYS.workers, "eng") or b"")

        # a crash with 9 jobs in the engine, then the poison alone twice: three restarts
        wait_until(lambda: (beat := heartbeat()) is not None and beat.engine_restarts == 3, "restarts")
        beat = heartbeat()
        assert worker.poll() is None  # the worker lives on
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=LIVENESS_S) == 0, log_path.read_text()[-3000:]
    rows = {row["id"]: row for row in map(json.loads, out.read_text().splitlines())}
    for job in innocents:
        assert rows[job.id]["error"] is None
        assert rows[job.id]["choices"][0]["token_ids"] == hf_greedy(
            hf_from_dir(model_dir), job.input_ids or [], 6
        )
    assert rows["poison"]["error"]["code"] == "dead_letter"
    message = rows["poison"]["error"]["message"]
    assert "crashed the engine 2 times when it ran alone (max_attempts=2); last: InjectedFault" in message
    assert [letter.job_id for letter in client.dead_letters()] == ["poison"]
    assert beat is not None and beat.unattributed_crashes == 0
    listed = radixq("dlq", "list", "--redis-url", redis_url)
    assert [line.split("\t")[0] for line in listed.stdout.splitlines()] == ["poison"]
