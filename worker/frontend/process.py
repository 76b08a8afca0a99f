"""One scheduler process and the channel to it (the front end starts a new one after a crash).

The process runs ``python -m worker.scheduler.main`` in a session of its own (a Ctrl-C meant
for the worker does not reach it: the worker drains first, then stops it) with SIGKILL as its
parent-death signal (it never outlives the worker, ``kill -9`` included). Each incarnation
gets fresh sockets, so nothing sent to a dead one can reach the next.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from wire.lifetime import start_child
from wire.owned_dirs import owned_dir, remove_stale_dirs
from worker.engine.threads import openmp_env
from worker.scheduler.channel import FrontendChannel, PeerGone
from worker.scheduler.config import SchedulerProcessConfig
from worker.scheduler.messages import (
    RANK_LOST_EXIT,
    Inbound,
    Outbound,
    SchedulerFailed,
    SchedulerReady,
    ShutdownRequest,
)

_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
SOCKET_DIR_PREFIX = "radixq-ipc-"  # the ZMQ sockets of one scheduler process, owned by the worker


def quiet_loading_env(log_level: str, environ: dict[str, str]) -> dict[str, str]:
    """Environment that silences model loading's progress bars (transformers' GGUF
    de-quantising, hub downloads) below DEBUG; variables the user set are kept. NOTE: tqdm
    reads TQDM_* once, when imported, hence the environment of a new process."""
    if log_level.upper() == "DEBUG":
        return {}
    wanted = {"TQDM_DISABLE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    return {name: value for name, value in wanted.items() if name not in environ}


class EngineStartError(RuntimeError):
    """The engine could not be started; ``str()`` is the one line to show."""


class SchedulerProcess:
    def __init__(self, config: SchedulerProcessConfig, log_level: str = "INFO") -> None:
        self.config = config
        self.ready: SchedulerReady | None = None
        self.failure: SchedulerFailed | None = None
        self.started_at = time.monotonic()
        # NOTE: a worker killed with -9 cannot remove its folder: the next one to start does
        remove_stale_dirs(SOCKET_DIR_PREFIX)
        self._socket_dir = str(owned_dir(SOCKET_DIR_PREFIX))
        self._channel = FrontendChannel(self._socket_dir)
        env = dict(os.environ)
        # NOTE: the child imports this very tree, whatever sys.path the parent was given.
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PACKAGE_ROOT, env.get("PYTHONPATH", "")]))
        env.update(quiet_loading_env(log_level, env))
        env.update(openmp_env(env))
        args = [
            sys.executable,
            "-m",
            "worker.scheduler.main",
            self._channel.inbound_addr,
            self._channel.outbound_addr,
            config.to_json(),
            log_level,
        ]
        self._closed = False
        self._proc: subprocess.Popen[bytes] | None = start_child(
            args, death_signal=signal.SIGKILL, env=env, stdin=subprocess.DEVNULL
        )

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def exit_code(self) -> int | None:
        return self._proc.poll() if self._proc is not None else None

    def send(self, message: Inbound) -> None:
        """Raises PeerGone when the process is not there to take it."""
        self._channel.send(message)

    def receive(self, timeout_s: float) -> list[Outbound]:
        """Messages available (waiting up to ``timeout_s``); ready and failure reports are
        also kept on the object."""
        messages = self._channel.receive(timeout_s)
        for message in messages:
            if isinstance(message, SchedulerReady):
                self.ready = message
            elif isinstance(message, SchedulerFailed):
                self.failure = message
        return messages

    @property
    def rank_lost(self) -> bool:
        """It ended because a tensor-parallel follower died (no job is to blame)."""
        return self.exit_code == RANK_LOST_EXIT

    def describe_exit(self) -> str:
        """Why it stopped, in words: its own report when it sent one, else the exit status."""
        if self.failure is not None:
            return self.failure.error
        code = self.exit_code
        if self.rank_lost:
            return "a tensor-parallel rank of the engine died; the group was stopped"
        if code is not None and code < 0:
            return f"the scheduler process was killed by signal {signal.Signals(-code).name}"
        return f"the scheduler process exited with code {code}"

    def wait_ready(self, timeout_s: float) -> SchedulerReady:
        """Block until the model is loaded; EngineStartError (one line) if it cannot be."""
        deadline = time.monotonic() + timeout_s
        while self.ready is None:
            self.receive(0.2)
            if self.ready is not None:
                break
            if self.failure is not None or not self.alive:
                self.receive(0.2)  # a report may still be on its way
                raise EngineStartError(f"the engine could not start: {self.describe_exit()}")
            if time.monotonic() > deadline:
                raise EngineStartError(
                    f"the engine did not load {self.config.model!r} within {timeout_s:.0f} s"
                )
        return self.ready

    def stop(self, timeout_s: float) -> None:
        """Ask it to shut down, wait up to ``timeout_s``, then kill it; always release the sockets."""
        if self._proc is not None:
            if self._proc.poll() is None and timeout_s > 0:
                try:
                    self._channel.send(ShutdownRequest())
                    self._proc.wait(timeout=timeout_s)
                except (PeerGone, subprocess.TimeoutExpired):
                    pass
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait()
            self._proc = None
        if not self._closed:
            self._closed = True
            self._channel.close()
            shutil.rmtree(self._socket_dir, ignore_errors=True)
