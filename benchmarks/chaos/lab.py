"""The world of one reliability scenario.

A Lab owns a folder, private redis-servers (producer.local_redis), the radixq processes a
scenario starts and every process those start in turn (found by sweeping /proc while the
scenario waits), so that afterwards it can say what was left running and which private Redis
folders were left on disk (benchmarks.chaos.row measures the rest).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from producer.local_redis import LocalRedis
from tests.integration.procs import (
    REPO_ROOT,
    cmdline,
    descendants,
    proc_stat,
    run_folders,
    start_engine_worker,
    start_worker,
    still_running,
    subprocess_env,
)
from wire.keys import QueueKeys
from wire.status import Heartbeat, decode_heartbeat

KEYS = QueueKeys()
SWEEP_EVERY_S = 0.5
EXIT_WAIT_S = 5.0  # how long processes may take to go once their owner stopped


class Lab:
    """Use as a context manager: on the way out everything still running is killed and the
    folder (unless given as ``root``) removed. ``settle`` is the measured, polite shutdown."""

    def __init__(self, name: str, root: Path | None = None) -> None:
        self.name = name
        self._own_dir = root is None
        self.dir = Path(tempfile.mkdtemp(prefix=f"radixq-chaos-{name}-")) if root is None else root
        self.dir.mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}  # label (its log's name) -> process
        self.tracked: dict[int, str] = {}  # pid -> start time: everything started, at any depth
        self.commands: dict[int, str] = {}
        self.servers: list[LocalRedis] = []
        self.problems: list[str] = []
        self.notes: list[str] = []
        self.facts: dict[str, int] = {}  # counts a test can check (e.g. that a fault happened)
        self._folders_before = set(run_folders(os.getpid()))  # e.g. a test session's own Redis
        self._swept_at = 0.0

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for server in self.servers:
            server.stop(cleanup=False)
        for pid in still_running(self.tracked):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    # ---- starting things -------------------------------------------------------------------

    def redis(self, *, appendonly: bool = True, fsync: str = "always") -> LocalRedis:
        data_dir = self.dir / f"redis-{len(self.servers)}"
        data_dir.mkdir()
        server = LocalRedis(use_server=True, data_dir=data_dir, appendonly=appendonly, fsync=fsync)
        self.servers.append(server)
        server.start()
        self._track(server.pid)
        return server

    def restart(self, server: LocalRedis) -> None:
        server.restart()
        self._track(server.pid)

    def fake_worker(self, url: str, name: str, *args: str, **env: str) -> subprocess.Popen[bytes]:
        return self._add(name, start_worker(url, name, self.dir / f"{name}.log", *args, **env))

    def engine_worker(
        self, url: str, model_dir: Path, name: str, *args: str, fault: str | None = None, **env: str
    ) -> subprocess.Popen[bytes]:
        proc = start_engine_worker(
            url, model_dir, self.dir / f"{name}.log", *args, name=name, fault=fault, **env
        )
        return self._add(name, proc)

    def start(
        self, label: str, *args: str, env: dict[str, str] | None = None, session: bool = False
    ) -> subprocess.Popen[bytes]:
        """A radixq command in the background, its output in ``label``.log."""
        with open(self.dir / f"{label}.log", "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "radixq", *map(str, args)],
                cwd=REPO_ROOT,
                env=subprocess_env(**(env or {})),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=session,
            )
        return self._add(label, proc)

    def radixq(
        self, label: str, *args: str, env: dict[str, str] | None = None, timeout_s: float = 300
    ) -> int:
        """A radixq command to completion (its children tracked meanwhile); its exit code."""
        proc = self.start(label, *args, env=env)
        self.wait_for(lambda: proc.poll() is not None, timeout_s, f"radixq {args[0]} ({label})")
        return proc.returncode

    def _add(self, label: str, proc: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
        assert label not in self.procs, f"two processes labelled {label}"
        self.procs[label] = proc
        self._track(proc.pid)
        return proc

    def _track(self, pid: int | None) -> None:
        stat = proc_stat(pid) if pid is not None else None
        if pid is not None and stat is not None:
            self.tracked[pid] = stat[2]
            self.commands[pid] = cmdline(pid)

    # ---- waiting ---------------------------------------------------------------------------

    def sweep(self, force: bool = False) -> None:
        """Track every live descendant of what was started (at most every SWEEP_EVERY_S)."""
        if not force and time.monotonic() - self._swept_at < SWEEP_EVERY_S:
            return
        self._swept_at = time.monotonic()
        alive = still_running(self.tracked)
        for pid, started in descendants(*alive).items():
            if pid not in self.tracked:
                self.tracked[pid] = started
                self.commands[pid] = cmdline(pid)

    def wait_for(self, condition: Callable[[], object], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}: timed out after {timeout_s:g} s waiting for {what}")
            self.sweep()
            time.sleep(0.05)

    def sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.sweep()
            time.sleep(min(0.05, max(0.0, end - time.monotonic())))

    def log(self, label: str) -> str:
        path = self.dir / f"{label}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def tails(self, chars: int = 1200) -> str:
        """The end of every log, for a failed test's message."""
        return "\n".join(
            f"--- {path.name}\n{path.read_text(errors='replace')[-chars:]}"
            for path in sorted(self.dir.glob("*.log"))
        )

    def expect(self, ok: bool, problem: str) -> bool:
        """Record ``problem`` (a missed target) unless ``ok``."""
        if not ok:
            self.problems.append(problem)
        return ok

    # ---- stopping and measuring ------------------------------------------------------------

    def stop(self, label: str, timeout_s: float = 40.0) -> int | None:
        """SIGTERM one process and wait for it (a worker drains first); its exit code."""
        proc = self.procs[label]
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.problems.append(f"{label} still running {timeout_s:g} s after SIGTERM")
            return None

    def settle(self) -> tuple[list[str], list[str]]:
        """Stop what still runs the documented way (SIGTERM; Redis last), then say which
        processes are still running and which private Redis folders remain."""
        self.sweep()
        for label, proc in self.procs.items():
            if proc.poll() is None:
                code = self.stop(label)
                self.expect(code in (0, None), f"{label} exited {code} on SIGTERM")
        for server in self.servers:
            server.stop(cleanup=False)
        deadline = time.monotonic() + EXIT_WAIT_S
        while still_running(self.tracked) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = [f"{pid} {self.commands.get(pid, '')[:80]}" for pid in still_running(self.tracked)]
        found = run_folders(os.getpid(), *self.tracked)
        folders = [str(path) for path in found if path not in self._folders_before]
        return left, folders

    def heartbeats(self, client: redis.Redis) -> dict[str, Heartbeat]:
        raw: Any = client.hgetall(KEYS.workers)
        beats = {name.decode(): decode_heartbeat(value) for name, value in raw.items()}
        return {name: beat for name, beat in beats.items() if beat is not None}


def line_count(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0
