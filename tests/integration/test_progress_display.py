"""Live progress of `radixq collect --wait` and `radixq run`: a live display on a real
terminal (the command runs under util-linux `script`, which gives it a pseudo-terminal and
records the screen), plain lines every --progress-interval seconds on a pipe, nothing with
--quiet. The totals shown are checked against the output file written by the same command."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from producer.client import Client
from tests.integration.procs import FAKE_GENERATOR, REPO_ROOT, radixq, start_worker, subprocess_env
from tests.waiting import LIVENESS_S, drive_until
from wire.schema import Job

pytestmark = pytest.mark.integration

NUM_JOBS = 30
FAILING = {"p3", "p11", "p20"}
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
STATE = re.compile(
    r"(\d+)/(\d+) done\s+(\d+) failed\s+([\d.]+) jobs/s\s+(\d+) tok/s out\s+cache (\S+)\s+ETA (\S+)"
)


def enqueue_jobs(redis_url: str) -> None:
    jobs = [
        Job(
            id=f"p{i}",
            prompt=f"word {i} " * (i % 4 + 1),
            metadata={"fake_error": "internal"} if f"p{i}" in FAILING else {},
        )
        for i in range(NUM_JOBS)
    ]
    client = Client.from_url(redis_url, "default")
    try:
        client.enqueue(jobs)
    finally:
        client.close()


def output_totals(path: Path) -> tuple[int, int, str]:
    """(rows, error rows, cache hit as progress prints it) from the output file."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    prompt = sum(row.get("usage", {}).get("prompt_tokens", 0) for row in rows if not row.get("error"))
    cached = sum(row.get("usage", {}).get("cached_tokens", 0) for row in rows if not row.get("error"))
    return len(rows), sum(1 for row in rows if row.get("error")), f"{cached / prompt:.0%}"


def test_collect_on_a_terminal_shows_a_live_display_reaching_the_totals(
    redis_url: str, tmp_path: Path
) -> None:
    if shutil.which("script") is None:
        pytest.skip("util-linux `script` is not installed")
    enqueue_jobs(redis_url)
    start_worker(redis_url, "w", tmp_path / "w.log", RADIXQ_FAKE_LATENCY_S="0.1", RADIXQ_FAKE_CAPACITY="4")
    out, screen = tmp_path / "out.jsonl", tmp_path / "screen.log"
    command = shlex.join(
        [
            sys.executable,
            "-m",
            "radixq",
            "collect",
            "-o",
            str(out),
            "--redis-url",
            redis_url,
            "--timeout",
            "60",
        ]
    )
    done = subprocess.run(
        ["script", "-q", "-e", "-c", command, str(screen)],
        cwd=REPO_ROOT,
        env=subprocess_env(TERM="xterm-256color", COLUMNS="160"),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=90,
    )
    raw = screen.read_text(errors="replace")
    assert done.returncode == 1, raw  # the three failing jobs
    assert "\x1b[1A" in raw or "\x1b[2K" in raw, "no live redraw: the display did not see a terminal"
    states = [m.groups() for m in STATE.finditer(ANSI.sub("", raw))]
    assert len({s[0] for s in states}) >= 3, f"fewer than three distinct progress states: {states}"
    counts = [int(s[0]) for s in states]
    assert counts == sorted(counts)
    rows, errors, hit = output_totals(out)
    final = states[-1]
    assert (
        (int(final[0]), int(final[1]), int(final[2])) == (rows, NUM_JOBS, errors) == (NUM_JOBS, NUM_JOBS, 3)
    )
    assert final[5] == hit and final[6] == "0:00:00"
    assert any(float(s[3]) > 0 and int(s[4]) > 0 for s in states), "no rate was ever shown"


def test_collect_on_a_pipe_prints_plain_lines_and_quiet_prints_none(redis_url: str, tmp_path: Path) -> None:
    enqueue_jobs(redis_url)
    start_worker(redis_url, "w", tmp_path / "w.log", RADIXQ_FAKE_LATENCY_S="0.1", RADIXQ_FAKE_CAPACITY="4")
    out = tmp_path / "out.jsonl"
    done = radixq(
        "collect", "-o", str(out), "--redis-url", redis_url, "--progress-interval", "0.2", "--timeout", "60"
    )
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("progress: ")]
    assert len(lines) >= 3, done.stderr
    assert "\x1b" not in done.stderr
    states = [STATE.search(line) for line in lines]
    assert all(states), lines
    counts = [int(s.group(1)) for s in states if s]
    assert counts == sorted(counts)
    rows, errors, hit = output_totals(out)
    final = states[-1]
    assert final is not None
    assert (
        (int(final.group(1)), int(final.group(3)), final.group(6))
        == (rows, errors, hit)
        == (NUM_JOBS, 3, hit)
    )

    again = radixq(
        "collect", "-o", str(tmp_path / "again.jsonl"), "--redis-url", redis_url, "--quiet", "--keep-results"
    )
    assert "progress" not in again.stderr


def test_run_prints_progress_lines_reaching_every_job(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"id": f"r{i}", "prompt": f"hello {i}"}) + "\n" for i in range(12)))
    out = tmp_path / "out.jsonl"
    done = radixq(
        "run", str(source), "-o", str(out), "--generator", FAKE_GENERATOR, "--progress-interval", "0.2"
    )
    assert done.returncode == 0, done.stderr
    final = [STATE.search(line) for line in done.stderr.splitlines() if line.startswith("progress: ")][-1]
    assert final is not None and (final.group(1), final.group(2), final.group(3)) == ("12", "12", "0")


def run_in_pty(args: list[str], env: dict[str, str], timeout_s: float = LIVENESS_S) -> tuple[int, str]:
    """Run a command with stdin, stdout and stderr on a fresh pseudo-terminal (Python's pty
    module, 200 columns), as a shell in a terminal would; returns (exit code, what the
    terminal received)."""
    import fcntl
    import os
    import pty
    import select
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    proc = subprocess.Popen(args, cwd=REPO_ROOT, env=env, stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    received = bytearray()
    closed = False

    def read() -> None:
        nonlocal closed
        ready, _, _ = select.select([master], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every writer closed the terminal
                chunk = b""
            closed = not chunk
            received.extend(chunk)
        else:
            closed = proc.poll() is not None

    try:
        drive_until(
            lambda: closed,
            read,
            lambda: f"the command to end; the screen: {received[-2000:]!r}",
            timeout_s=timeout_s,
        )
        code = proc.wait(timeout=LIVENESS_S)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    return code, received.decode(errors="replace")


def test_run_on_a_terminal_keeps_worker_logs_out_of_the_bar_and_says_it_is_loading(tmp_path: Path) -> None:
    """Issue 17, item 4, in a real pseudo-terminal: the workers log a line per job while the
    live line redraws; every log line starts a screen line of its own (the bar's text never
    runs into it), and before the first result the line says the model is loading."""
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"id": f"t{i}", "prompt": f"hello {i}"}) + "\n" for i in range(20)))
    env = subprocess_env(
        RADIXQ_FAKE_START_S="1.5", RADIXQ_FAKE_LOG="1", RADIXQ_FAKE_LATENCY_S="0.1", RADIXQ_FAKE_CAPACITY="2"
    )
    command = [sys.executable, "-m", "radixq", "run", str(source), "-o", str(tmp_path / "out.jsonl")]
    code, screen = run_in_pty([*command, "--generator", FAKE_GENERATOR, "--workers", "2"], env)
    assert code == 0, screen[-2000:]
    lines = [line for line in re.split(r"[\r\n]", ANSI.sub("", screen)) if line.strip()]
    logs = [line for line in lines if "finished job" in line]
    assert len(logs) == 20, lines[-20:]
    glued = [line for line in lines if " INFO " in line and not re.match(r"\[worker [01]\] \d{4}-", line)]
    assert glued == [], glued[:3]  # a log line that does not start its own screen line
    assert all(
        re.match(r"\[worker [01]\] \d{4}-\d\d-\d\d .* INFO radixq\.fake: finished job t\d+$", line)
        for line in logs
    )
    assert any(re.search(r"0/20 done  loading the model in 2 workers  elapsed", line) for line in lines), (
        lines[:10]
    )
    finals = [match for line in lines if (match := STATE.search(line))]
    assert finals and (finals[-1].group(1), finals[-1].group(2)) == ("20", "20")
