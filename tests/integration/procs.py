"""Running the radixq CLI as subprocesses, the way users and `radixq run` do."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import redis

from tests.waiting import LIVENESS_S, wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]
FAKE_GENERATOR = "tests.fake_generator:create_generator"
# Every worker started by the helpers below; tests/conftest.py kills those a test left running.
STARTED: list[subprocess.Popen[bytes]] = []


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for `radixq` subprocesses: repo importable, no stray Redis settings."""
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "RADIXQ_REDIS_URL", "RADIXQ_QUEUE")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")]))
    env.update(extra)
    return env


def radixq(
    *args: str, env: dict[str, str] | None = None, timeout_s: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run the radixq CLI (radixq.cli:main, the console script's target) to completion."""
    return subprocess.run(
        [sys.executable, "-m", "radixq", *args],
        cwd=REPO_ROOT,
        env=env or subprocess_env(),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def start_radixq(*args: str, log: Path) -> subprocess.Popen[str]:
    """A radixq command in the background, stdout and stderr appended to ``log``."""
    with open(log, "a") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "radixq", *args],
            cwd=REPO_ROOT,
            env=subprocess_env(),
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            text=True,
        )


def start_worker(
    redis_url: str, name: str, log_path: Path, *args: str, **env: str
) -> subprocess.Popen[bytes]:
    """A `radixq worker` subprocess with the fake generator, logging to ``log_path``."""
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "radixq", "worker", "--redis-url", redis_url, "--name", name]
            + ["--generator", FAKE_GENERATOR, *args],
            cwd=REPO_ROOT,
            env=subprocess_env(**env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    STARTED.append(proc)
    return proc


def start_engine_worker(
    redis_url: str,
    model_dir: Path,
    log_path: Path,
    *args: str,
    name: str = "eng",
    fault: str | None = None,
    device: str = "cpu",
    **env: str,
) -> subprocess.Popen[bytes]:
    """`radixq worker` with the real engine (on the CPU unless ``device`` says), in a session
    of its own (as a shell runs it); ``fault`` is a RADIXQ_FAULT rule (worker/engine/faults.py)."""
    extra = {**env, **({"RADIXQ_FAULT": fault} if fault else {})}
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "radixq", "worker", "--redis-url", redis_url, "--name", name]
            + ["--model", str(model_dir), "--device", device, "--min-idle-s", "5", *args],
            cwd=REPO_ROOT,
            env=subprocess_env(**extra),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    STARTED.append(proc)
    return proc


def process_state(pid: int) -> str | None:
    """The state letter of ``pid`` (R, S, Z, ...), None when there is no such process."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    line = next(line for line in status.splitlines() if line.startswith("State:"))
    return line.split()[1]


def is_alive(pid: int) -> bool:
    """Running or sleeping; a zombie counts as gone (PID 1 here does not reap orphans)."""
    return process_state(pid) not in (None, "Z", "X")


def children(pid: int, command_part: str = "") -> list[int]:
    """Live child processes of ``pid`` whose command line contains ``command_part``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        ppid = next((line.split()[1] for line in status.splitlines() if line.startswith("PPid:")), "")
        if ppid == str(pid) and command_part in cmdline and is_alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def proc_stat(pid: int) -> tuple[int, str, str] | None:
    """(parent pid, state, start time) from /proc/PID/stat; None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # NOTE: the name in parentheses may hold spaces
    return int(fields[1]), fields[0], fields[19]


def descendants(*pids: int) -> dict[int, str]:
    """Every live process below ``pids`` (four generations): pid -> start time (to tell a
    reused pid apart)."""
    found: dict[int, str] = {}
    parents = set(pids)
    for _ in range(4):
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) not in found:
                stat = proc_stat(int(entry.name))
                if stat is not None and stat[0] in parents and stat[1] != "Z":
                    found[int(entry.name)] = stat[2]
        parents = {*pids, *found}
    return found


def still_running(procs: dict[int, str]) -> list[int]:
    """Those of ``procs`` that still run (not gone, not a zombie, not a new process on the pid)."""
    running = []
    for pid, started in procs.items():
        stat = proc_stat(pid)
        if stat is not None and stat[1] != "Z" and stat[2] == started:
            running.append(pid)
    return running


def cmdline(pid: int) -> str:
    """The command line of ``pid`` ("" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def run_folders(*owner_pids: int) -> list[Path]:
    """Private Redis folders (``radixq-redis-*``) whose owner file names one of ``owner_pids``."""
    wanted = {str(pid) for pid in owner_pids}
    folders = []
    for folder in Path(tempfile.gettempdir()).glob("radixq-redis-*"):
        try:
            owner = (folder / "owner.pid").read_text().split()
        except OSError:
            continue
        if owner and owner[0] in wanted:
            folders.append(folder)
    return folders


def run_children(
    run: subprocess.Popen[bytes], num_workers: int, num_servers: int = 1, timeout_s: float = LIVENESS_S
) -> tuple[int | None, list[int]]:
    """(redis-server pid, worker pids) of a `radixq run`, once they are all there (no server
    for a run given a Redis URL: ``num_servers`` 0)."""
    found: dict[str, list[int]] = {}

    def look() -> bool:
        found.clear()
        for pid in descendants(run.pid):
            text = cmdline(pid)
            kind = "redis" if "redis-server" in text else "worker" if "radixq worker" in text else "other"
            found.setdefault(kind, []).append(pid)
        return len(found.get("redis", [])) == num_servers and len(found.get("worker", [])) == num_workers

    wait_until(look, "the run's redis-server and workers", timeout_s=timeout_s)
    return (found["redis"][0] if num_servers else None), found["worker"]


def queue_redis(worker_pid: int) -> redis.Redis:
    """A client on a run's Redis, with the URL its worker got in its environment."""
    environ = Path(f"/proc/{worker_pid}/environ").read_bytes().split(b"\0")
    url = next(item.split(b"=", 1)[1].decode() for item in environ if item.startswith(b"RADIXQ_REDIS_URL="))
    return redis.Redis.from_url(url)
