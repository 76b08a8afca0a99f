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


def wait_until(
    condition: Callable[[], object],
    what: str = "the condition",
    log_path: Path | None = None,
    timeout_s: float = LIVENESS_S,
    poll_s: float = 0.02,
) -> None:
    """Poll ``condition`` until it is true. After ``timeout_s`` (a hang, not a speed): an
    AssertionError naming ``what``, with the end of ``log_path`` when given."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            tail = (
                log_path.read_text(errors="replace")[-4000:]
                if log_path is not None and log_path.exists()
                else ""
            )
            raise AssertionError(
                f"timed out after {timeout_s:g} s waiting for {what}" + (f"\n{tail}" if tail else "")
            )
        time.sleep(poll_s)
