"""The world of one reliability scenario, and the row it is measured into.

A Lab owns a folder, private redis-servers (producer.local_redis), the radixq processes a
scenario starts and every process those start in turn (found by sweeping /proc while the
scenario waits), so that afterwards it can say what was left running and which private Redis
folders were left on disk. ``run_scenario`` turns what a scenario observed into a Row: ids
lost, written twice, dead-lettered, failed, the time, and what was left behind.

The oracle for "lost" is the list of job ids the scenario gave (its input file), never
what Redis or collect report.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from producer.keys import QueueKeys
from producer.local_redis import LocalRedis
from producer.status import Heartbeat, decode_heartbeat
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

KEYS = QueueKeys()
SWEEP_EVERY_S = 0.5
EXIT_WAIT_S = 5.0  # how long processes may take to go once their owner stopped


@dataclass
class Observed:
    """What a scenario hands back: its output file and what the right answer is."""

    output: Path
    ids: list[str]  # every job id the scenario gave, in order
    culprits: list[str] = field(default_factory=list)  # the only ids that may be dead-lettered
    expected_errors: dict[str, str] = field(default_factory=dict)  # id -> error code that is right
    missing_before: int | None = None  # Redis lost writes: ids with no row before the recovery
    detected: list[str] = field(default_factory=list)  # how that loss was reported


@dataclass
class Row:
    scenario: str
    jobs: int
    lost: list[str]
    duplicates: list[str]
    dead_lettered: list[str]
    error_rows: dict[str, str]  # rows with an error other than dead_letter: id -> code
    wall_s: float
    left_behind: list[str]  # "pid command" of processes still running after the scenario
    temp_left: list[str]
    observed: Observed
    problems: list[str]  # expectations the scenario checked on the way that failed
    notes: list[str]

    def misses(self) -> list[str]:
        """Every target this row misses (empty: all met)."""
        seen = self.observed
        missed = [f"{len(self.lost)} ids lost: {self.lost[:5]}"] if self.lost else []
        if self.duplicates:
            missed.append(f"ids written twice: {self.duplicates[:5]}")
        if sorted(self.dead_lettered) != sorted(seen.culprits):
            missed.append(f"dead-lettered {sorted(self.dead_lettered)[:5]}, expected {sorted(seen.culprits)}")
        if self.error_rows != seen.expected_errors:
            missed.append(f"error rows {self.error_rows}, expected {seen.expected_errors}")
        if seen.missing_before and not seen.detected:
            missed.append(f"{seen.missing_before} ids lost by Redis and nobody said so")
        if self.left_behind:
            missed.append(f"left running: {self.left_behind}")
        if self.temp_left:
            missed.append(f"folders left: {self.temp_left}")
        return missed + self.problems

    def markdown(self) -> str:
        seen = self.observed
        before = "n/a" if seen.missing_before is None else str(seen.missing_before)
        if seen.detected:
            before += f" ({'; '.join(seen.detected)})"
        dead = f"{len(self.dead_lettered)}" + (
            f" ({', '.join(sorted(self.dead_lettered))})" if self.dead_lettered else ""
        )
        errors = ", ".join(f"{i}: {code}" for i, code in sorted(self.error_rows.items())) or "0"
        cells = [
            f"`{self.scenario}`",
            str(self.jobs),
            str(len(self.lost)),
            before,
            str(len(self.duplicates)),
            dead,
            errors,
            f"{self.wall_s:.1f} s",
            str(len(self.left_behind)),
            str(len(self.temp_left)),
            "; ".join(self.notes + [f"MISSED: {m}" for m in self.misses()]),
        ]
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


MARKDOWN_HEADER = (
    "| scenario | jobs | lost | lost before recovery (detected by) | duplicated | dead-lettered | "
    "other error rows | time | processes left | folders left | notes |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|"
)


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
                [sys.executable, "-m", "producer.cli", *map(str, args)],
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
        folders = [str(path) for path in run_folders(os.getpid(), *self.tracked)]
        return left, folders

    def heartbeats(self, client: redis.Redis) -> dict[str, Heartbeat]:
        raw: Any = client.hgetall(KEYS.workers)
        beats = {name.decode(): decode_heartbeat(value) for name, value in raw.items()}
        return {name: beat for name, beat in beats.items() if beat is not None}


def read_rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def row_id(row: dict[str, Any]) -> str:
    return row.get("custom_id") or row["id"]


def line_count(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def run_scenario(name: str, lab: Lab, scenario: Callable[..., Observed], **params: Any) -> Row:
    """Run ``scenario(lab, **params)``, shut everything down and measure the row."""
    started = time.monotonic()
    observed = scenario(lab, **params)
    left, folders = lab.settle()
    wall_s = time.monotonic() - started
    rows = read_rows(observed.output)
    counts = Counter(row_id(row) for row in rows)
    errors = {row_id(row): row["error"]["code"] for row in rows if row.get("error")}
    wanted = [*observed.ids, *observed.expected_errors]
    unexpected = sorted(set(counts) - set(wanted))
    if unexpected:
        lab.problems.append(f"rows for ids never given: {unexpected[:5]}")
    return Row(
        scenario=name,
        jobs=len(wanted),
        lost=[i for i in wanted if i not in counts],
        duplicates=sorted(i for i, n in counts.items() if n > 1),
        dead_lettered=sorted(i for i, code in errors.items() if code == "dead_letter"),
        error_rows={i: code for i, code in errors.items() if code != "dead_letter"},
        wall_s=wall_s,
        left_behind=left,
        temp_left=folders,
        observed=observed,
        problems=lab.problems,
        notes=lab.notes,
    )
