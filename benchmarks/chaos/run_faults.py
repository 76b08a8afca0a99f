"""`radixq run` scenarios with the real engine on CPU (a tiny random Llama): Ctrl-C or SIGTERM
mid-run then the same command again, and a job that crashes the engine. `run` starts its own
private Redis and workers; the Lab finds them in /proc to check that none is left behind.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from benchmarks.chaos.engine_faults import POISON_TOKEN, innocents, poison_line, write_lines
from benchmarks.chaos.lab import Lab, line_count
from benchmarks.chaos.row import Observed

RUN_TIMEOUT_S = 300


def run_args(source: Path, out: Path, model_dir: Path) -> list[str]:
    return ["run", str(source), "-o", str(out), "--model", str(model_dir), "--device", "cpu"]


def run_signal(
    lab: Lab, model_dir: Path, how: str = "sigint", jobs: int = 12, max_tokens: int = 40
) -> Observed:
    """`radixq run` (4 jobs at a time, each engine step 30 ms slower) gets Ctrl-C (SIGINT to its
    process group, as a terminal sends it) or SIGTERM once some results are written: it exits 1
    having written what finished and removed its Redis; the same command again finishes the rest."""
    source, out = lab.dir / "in.jsonl", lab.dir / "out.jsonl"
    ids = write_lines(source, innocents(jobs, max_tokens))
    env = {"RADIXQ_FAULT": "sleep-per-step:30", "RADIXQ_READ_WINDOW": "4"}
    run = lab.start(
        "run", *run_args(source, out, model_dir), "--drain-timeout-s", "20", env=env, session=True
    )
    lab.wait_for(lambda: line_count(out) >= 2, RUN_TIMEOUT_S, "two results in the output")
    lab.sweep(force=True)
    signalled = time.monotonic()
    if how == "sigint":
        os.killpg(run.pid, signal.SIGINT)
    else:
        run.send_signal(signal.SIGTERM)
    lab.wait_for(lambda: run.poll() is not None, 60, f"run to exit after {how}")
    took_s = time.monotonic() - signalled
    written = line_count(out)
    text = lab.log("run")
    lab.expect(run.returncode == 1, f"run exited {run.returncode} after {how}, expected 1")
    lab.expect(
        f"interrupted: wrote {written} of {jobs} results" in text, f"no 'interrupted' line: {text[-300:]}"
    )
    lab.expect("Traceback" not in text, "run printed a traceback")
    lab.expect(written < jobs, "the run finished before the signal: nothing was tested")
    again = lab.radixq("run-again", *run_args(source, out, model_dir), timeout_s=RUN_TIMEOUT_S)
    lab.expect(again == 0, f"the same command again exited {again}: {lab.log('run-again')[-300:]}")
    lab.notes.append(
        f"first run exited {run.returncode} {took_s:.1f} s after {how.upper()} with {written} of {jobs} "
        f"written; the same command again exited {again}"
    )
    return Observed(out, ids)


def poison_run(lab: Lab, model_dir: Path, jobs: int = 8, max_attempts: int | None = None) -> Observed:
    """A job that crashes the engine (RADIXQ_FAULT=raise-on-token) under `radixq run`: it is
    dead-lettered within the run, every other job is written, the exit code is 1."""
    source, out = lab.dir / "in.jsonl", lab.dir / "out.jsonl"
    lines = innocents(jobs, 6)
    ids = write_lines(source, [*lines[: jobs // 2], poison_line(), *lines[jobs // 2 :]])
    env = {"RADIXQ_FAULT": f"raise-on-token:{POISON_TOKEN}"}
    if max_attempts is not None:
        env["RADIXQ_MAX_ATTEMPTS"] = str(max_attempts)
    code = lab.radixq("run", *run_args(source, out, model_dir), env=env, timeout_s=RUN_TIMEOUT_S)
    text = lab.log("run")
    lab.expect(code == 1, f"run exited {code}, expected 1 (one failed job): {text[-300:]}")
    lab.expect("1 job failed" in text, f"run did not name the failed job: {text[-300:]}")
    lab.notes.append(f"run exited {code}; max_attempts {max_attempts or 'default (3)'}")
    return Observed(out, ids, culprits=["poison"])
