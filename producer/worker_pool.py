"""The worker processes of one ``radixq run`` and the steps that stop them.

    step 0  running
    step 1  SIGTERM: stop reading, finish what is held within the drain timeout, put the
            rest back, exit
    step 2  SIGTERM again: stop draining now; write what is done, put the rest back, exit
    step 3  SIGKILL

The caller asks for a step (1 on the first Ctrl-C, 2 on the second); a step that overruns
(step 1 by more than GRACE_S past the drain timeout, step 2 by GRACE_S) leads to the next.

Their output is relayed line by line (``relay_output``) to the progress display, and
``Readiness`` tells the display when the first of them has its model loaded (its heartbeat).
"""

from __future__ import annotations

import math
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

from wire.keys import QueueKeys
from wire.status import LOADING, decode_heartbeat

GRACE_S = 2.0  # how long a worker may overrun a step before the next, harder one
_MIN_STEP_GAP_S = 0.1  # NOTE: two SIGTERMs in a row may reach a worker's handler as one


class WorkerPool:
    def __init__(self, procs: list[subprocess.Popen[bytes]], drain_timeout_s: float) -> None:
        self.procs = procs
        self.drain_timeout_s = drain_timeout_s
        self.step = 0
        self._step_at = 0.0
        self._next_step_at = math.inf

    def exited(self) -> bool:
        return all(proc.poll() is not None for proc in self.procs)

    def codes(self) -> list[int | None]:
        return [proc.poll() for proc in self.procs]

    def advance(self, wanted: int) -> bool:
        """Take the next step if ``wanted`` is further or the current one overran; at most one
        step per call. True when every worker has exited."""
        if self.exited():
            return True
        now = time.monotonic()
        if now >= self._next_step_at:
            wanted = max(wanted, self.step + 1)
        if min(wanted, 3) > self.step and now - self._step_at >= _MIN_STEP_GAP_S:
            self._take_step(now)
        return self.exited()

    def stop(self, wanted: Callable[[], int], poll_s: float = 0.1) -> list[int | None]:
        """Step until every worker has exited (at least step 1); return their exit codes.
        Takes at most the drain timeout plus 2 x GRACE_S (and ``poll_s`` per step)."""
        while not self.advance(max(1, wanted())):
            time.sleep(poll_s)
        return self.codes()

    def _take_step(self, now: float) -> None:
        self.step += 1
        self._step_at = now
        if self.step == 1:
            self._next_step_at = now + self.drain_timeout_s + GRACE_S
        elif self.step == 2:
            self._next_step_at = now + GRACE_S
        else:
            self._next_step_at = math.inf
        signum = signal.SIGKILL if self.step == 3 else signal.SIGTERM
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signum)
        if self.step == 3:
            for proc in self.procs:
                proc.wait()


def relay_output(proc: subprocess.Popen[bytes], prefix: str, show: Callable[[str], None]) -> threading.Thread:
    """A thread that shows each line ``proc`` writes (its stdout, a pipe) with ``prefix``,
    until the pipe closes."""

    def relay() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            show(prefix + raw.decode(errors="replace").rstrip("\r\n"))

    thread = threading.Thread(target=relay, name=f"relay-{proc.pid}", daemon=True)
    thread.start()
    return thread


class Readiness:
    """Watches the queue's heartbeats for the run's workers: until the first one beats in a
    state other than loading (its model is loaded), the display's phase says they are
    loading; ``check`` is cheap to call every collect round (it reads Redis at most every
    ``every_s``) and always returns False."""

    def __init__(
        self, client: Any, queue: str, names: list[str], progress: Any, every_s: float = 0.5
    ) -> None:
        self.client = client
        self.key = QueueKeys(queue).workers
        self.names = names
        self.progress = progress
        self.every_s = every_s
        self._next_s = 0.0
        self.done = not names
        if not self.done:
            progress.phase(f"loading the model in {len(names)} worker{'s' * (len(names) != 1)}")

    def check(self) -> bool:
        now = time.monotonic()
        if self.done or now < self._next_s:
            return False
        self._next_s = now + self.every_s
        try:
            beating: list[Any] = self.client.hmget(self.key, self.names)
        except Exception:  # NOTE: the display only; the collect itself judges Redis errors
            return False
        # NOTE: a worker beats from before its load, in state LOADING
        if any(
            beat is not None and getattr(decode_heartbeat(beat), "state", LOADING) != LOADING
            for beat in beating
        ):
            self.done = True
            self.progress.phase(None)
        return False
