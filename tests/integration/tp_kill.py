"""kill -9 of a tensor-parallel worker's rank 1 mid-run, watched from outside (CPU and GPU tests).

The worker (``radixq worker --tp 2``) runs a queue of jobs; once the first job is done,
rank 1 (the follower process) gets SIGKILL. Then, in order: the old group's processes are
gone (rank 0's watchdog ended it), a new group is ready (the worker logs "scheduler process
restarted"), it finishes a job, and every job is done. The seconds from the kill to each are
what ``Restart`` holds (printed, never asserted: how fast is the benchmarks' business).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from producer.client import Client
from tests.integration.procs import children, descendants, still_running
from tests.waiting import LIVENESS_S, wait_until
from wire.keys import FIELD_RESULT, QueueKeys
from wire.schema import Result, decode_result

KEYS = QueueKeys()
READY_LINE = "scheduler process restarted"
LEAVE_LINE = re.compile(r"tensor-parallel rank (\d) left its group: (\w+)")


@dataclass(frozen=True)
class Restart:
    leader: int  # the killed group's rank 0 (its scheduler process) and rank 1
    follower: int
    old_group_gone_s: float  # from the kill: every process of the killed group gone
    new_group_ready_s: float  # the new group's SchedulerReady reached the worker
    new_group_served_s: float  # a job finished after that
    all_done_s: float  # every job done

    def describe(self) -> str:
        return (
            f"kill -9 of rank 1: old group gone {self.old_group_gone_s:.1f} s, new group ready "
            f"{self.new_group_ready_s:.1f} s, serving {self.new_group_served_s:.1f} s, "
            f"every job done {self.all_done_s:.1f} s after the kill"
        )


def kill_rank1_mid_run(
    client: Client, worker: subprocess.Popen[bytes], log_path: Path, num_jobs: int
) -> Restart:
    """Kill the follower once a first job is done (and before the last): see the module docstring."""

    def done() -> int:
        return int(client.redis.hlen(KEYS.done))

    def ready_lines() -> int:
        return log_path.read_text(errors="replace").count(READY_LINE)

    wait_until(lambda: done() >= 1, "a first job done", log_path=log_path)
    (leader,) = children(worker.pid, "worker.scheduler.main")
    (follower,) = children(leader, "worker.scheduler.follower")
    group = descendants(leader) | {leader: descendants(worker.pid)[leader]}
    assert done() < num_jobs, "every job finished before the kill"
    ready_before = ready_lines()
    os.kill(follower, signal.SIGKILL)
    killed_at = time.monotonic()
    wait_until(lambda: not still_running(group), "the old group to be gone", log_path=log_path)
    gone_s = time.monotonic() - killed_at
    wait_until(lambda: ready_lines() > ready_before, "a new group to be ready", log_path=log_path)
    ready_s = time.monotonic() - killed_at
    done_when_ready = done()
    wait_until(
        lambda: done() > done_when_ready or done() == num_jobs, "the new group to serve", log_path=log_path
    )
    served_s = time.monotonic() - killed_at
    wait_until(lambda: done() == num_jobs, "every job done", log_path=log_path)
    return Restart(leader, follower, gone_s, ready_s, served_s, time.monotonic() - killed_at)


def results_once(client: Client, job_ids: list[str]) -> list[Result]:
    """The results stream holds one result per job, each without error; nothing dead-lettered."""
    results = [decode_result(f[FIELD_RESULT.encode()]) for _, f in client.redis.xrange(KEYS.results)]
    assert sorted(r.id for r in results) == sorted(job_ids)  # every job answered, exactly once
    assert client.redis.xlen(KEYS.dead) == 0
    for result in results:
        assert result.error is None, (result.id, result.error)
    return results


def stop_worker(worker: subprocess.Popen[bytes]) -> dict[int, str]:
    """SIGTERM (the drain) and wait; the processes below the worker just before (pid -> start)."""
    everything = descendants(worker.pid)
    worker.send_signal(signal.SIGTERM)
    worker.wait(timeout=LIVENESS_S)
    return everything


def assert_drained_cleanly(
    worker: subprocess.Popen[bytes], everything: dict[int, str], log_path: Path
) -> None:
    """After stop_worker: nothing left running, exit 0, and the group serving at the drain left
    the normal way on both ranks (worker.distributed.close_tp: destroyed, not aborted). The
    groups before it ended with a rank lost: their processes left no such line."""
    wait_until(lambda: not still_running(everything), "no process left behind", log_path=log_path)
    assert worker.returncode == 0
    leaves = LEAVE_LINE.findall(log_path.read_text(errors="replace"))
    assert sorted(leaves) == [("0", "destroyed"), ("1", "destroyed")], log_path.read_text()[-6000:]
