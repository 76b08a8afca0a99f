"""Leaving a tensor-parallel group (worker.distributed.close_tp) on gloo, on every path, with
real processes (tests/tp_leave_rank.py): every live rank's close_tp returns; it destroys the
group when every rank is there, and aborts it when a peer was SIGKILLed, is stalled (SIGSTOP)
or is still inside a collective. The ranks keep torch's default 600 s timeouts, so a leave
that waited on any of them would outlast the liveness deadline and fail here; how long each
leave took is printed (-s), never asserted (speed is not what these tests check)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.waiting import wait_until
from worker.distributed import LEFT_ABORTED, LEFT_DESTROYED, free_loopback_address

REPO_ROOT = Path(__file__).resolve().parents[2]


class Rank:
    """One rank process and the lines it printed."""

    def __init__(self, rank: int, size: int, init_method: str, log_path: Path) -> None:
        self.rank = rank
        self.log_path = log_path
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")]))
        env.setdefault("OMP_NUM_THREADS", "1")
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.tp_leave_rank", str(rank), str(size), init_method],
                cwd=REPO_ROOT,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.strip())

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def said(self, prefix: str) -> str | None:
        return next((line for line in self.lines if line.startswith(prefix)), None)

    def wait_for(self, prefix: str) -> str:
        wait_until(
            lambda: self.said(prefix) is not None, f"rank {self.rank} to say {prefix!r}", self.log_path
        )
        line = self.said(prefix)
        assert line is not None
        return line

    def left(self) -> str:
        """How the rank left, once its close_tp returned."""
        _, how, seconds = self.wait_for("left ").split()
        print(f"rank {self.rank} left: {how} after {seconds} s")
        return how

    def leave(self) -> str:
        self.send("leave")
        return self.left()

    def inflict(self, fault: str) -> None:
        """``kill``: SIGKILL, waited for; ``stall``: SIGSTOP (the process stays, answers nothing)."""
        if fault == "kill":
            self.proc.kill()
            self.proc.wait()
        else:
            os.kill(self.proc.pid, signal.SIGSTOP)


@pytest.fixture
def ranks(tmp_path: Path) -> Iterator[list[Rank]]:
    init_method = free_loopback_address()
    group = [Rank(r, 2, init_method, tmp_path / f"rank{r}.log") for r in range(2)]
    try:
        for rank in group:
            rank.wait_for("ready")
        yield group
    finally:
        for rank in group:
            if rank.proc.poll() is None:
                rank.proc.kill()  # NOTE: SIGKILL ends a stopped process too
            rank.proc.wait()


def test_every_rank_destroys_the_group_at_a_normal_end(ranks: list[Rank]) -> None:
    """Both ranks leave at once (a ShutdownRequest reaches every rank at the same step)."""
    for rank in ranks:
        rank.send("leave")
    assert [rank.left() for rank in ranks] == [LEFT_DESTROYED, LEFT_DESTROYED]


@pytest.mark.parametrize("fault", ["kill", "stall"])
@pytest.mark.parametrize("victim", [1, 0], ids=["follower", "rank0"])
def test_a_rank_whose_peer_is_gone_or_stalled_aborts_the_group(
    ranks: list[Rank], victim: int, fault: str
) -> None:
    """A follower's death or stall as rank 0 leaves (rank 0's watchdog path, a drain that finds
    a follower hung), and rank 0's as a follower leaves (rank 0 hosts the group's store: a
    dead one resets the connection, a stalled one never answers)."""
    ranks[victim].inflict(fault)
    assert ranks[1 - victim].leave() == LEFT_ABORTED


def test_a_rank_leaving_while_its_peer_waits_in_a_collective_frees_it(ranks: list[Rank]) -> None:
    """Drain: rank 0 leaves between steps while the follower already waits in the next step's
    all-reduce. Rank 0 does not wait for it (the follower never says it is leaving) and aborts;
    the abort ends the follower's all-reduce with an error, and the follower leaves too."""
    follower = ranks[1]
    follower.send("collective")
    assert ranks[0].leave() == LEFT_ABORTED
    assert follower.wait_for("collective ").startswith("collective failed")
    assert follower.leave() in (LEFT_ABORTED, LEFT_DESTROYED)


def test_a_rank_told_its_peer_is_lost_aborts_without_waiting(ranks: list[Rank]) -> None:
    """peer_lost (a crash path): abort at once; the peer, still healthy, aborts in turn."""
    ranks[0].send("leave-lost")
    assert ranks[0].left() == LEFT_ABORTED
    assert ranks[1].leave() == LEFT_ABORTED
