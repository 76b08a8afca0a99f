"""Running the radixq CLI as subprocesses, the way users and `radixq run` do."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
FAKE_GENERATOR = "tests.fake_generator:create_generator"


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for `radixq` subprocesses: repo importable, no stray Redis settings."""
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "RADIXQ_REDIS_URL", "RADIXQ_QUEUE")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")]))
    env.update(extra)
    return env


def radixq(
    *args: str, env: dict[str, str] | None = None, timeout_s: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run the radixq CLI (worker.cli:main, the console script's target) to completion."""
    return subprocess.run(
        [sys.executable, "-m", "worker.cli", *args],
        cwd=REPO_ROOT,
        env=env or subprocess_env(),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def start_worker(
    redis_url: str, name: str, log_path: Path, *args: str, **env: str
) -> subprocess.Popen[bytes]:
    """A `radixq worker` subprocess with the fake backend, logging to ``log_path``."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "worker.cli", "worker", "--redis-url", redis_url, "--name", name]
            + ["--backend", FAKE_GENERATOR, *args],
            cwd=REPO_ROOT,
            env=subprocess_env(**env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


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
