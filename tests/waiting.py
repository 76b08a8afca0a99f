"""How tests wait: on an event (a condition polled until it holds), under one generous
deadline whose only job is to turn a hang into a failure. No test asserts how fast something
is; speeds are measured on purpose in benchmarks/ (docs/performance.md)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

# NOTE: generous on purpose: a loaded 2-core box can be 10x slower than a quiet one (under
# five other helpers' load, test_grammar_isolation's first test needed more than 120 s), and a
# deadline that a slow but correct run can reach is a flake, not a check. pytest-timeout (600 s
# a test, pyproject.toml) is the last guard.
LIVENESS_S = 300.0


def drive_until(
    condition: Callable[[], object],
    step: Callable[[], object],
    what: str | Callable[[], str] = "the condition",
    log_path: Path | None = None,
    timeout_s: float = LIVENESS_S,
) -> None:
    """Call ``step`` (what makes progress: a consumer's step, a generator's blocking poll) until
    ``condition`` is true. After ``timeout_s`` (a hang, not a speed): an AssertionError naming
    ``what`` (a callable is asked then, to say how far it got), with the end of ``log_path``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            said = what() if callable(what) else what
            tail = (
                log_path.read_text(errors="replace")[-4000:]
                if log_path is not None and log_path.exists()
                else ""
            )
            raise AssertionError(
                f"timed out after {timeout_s:g} s waiting for {said}" + (f"\n{tail}" if tail else "")
            )
        step()


def wait_until(
    condition: Callable[[], object],
    what: str | Callable[[], str] = "the condition",
    log_path: Path | None = None,
    timeout_s: float = LIVENESS_S,
    poll_s: float = 0.02,
) -> None:
    """Poll ``condition`` every ``poll_s`` until it is true (drive_until with a pause as the step)."""
    drive_until(condition, lambda: time.sleep(poll_s), what, log_path, timeout_s)


def observe(sample: Callable[[], object], duration_s: float, poll_s: float = 0.1) -> None:
    """Call ``sample`` every ``poll_s`` for ``duration_s``: for a claim that something does NOT
    happen while the system runs (a bound never exceeded), a window to watch, not a speed."""
    end = time.monotonic() + duration_s
    while time.monotonic() < end:
        sample()
        time.sleep(poll_s)
