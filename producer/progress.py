"""Live progress of a collect (``radixq collect --wait``, ``radixq run``).

The collector tells a Progress how many jobs are in scope and hands it every counted result
as it reads it (before the in-order write). Progress shows: done/total, failed, jobs/s and
output tokens/s as the workers generated them (each result by its ``timings``: finished over
the last RATE_WINDOW_S seconds, and on the final line from the first job started to the last
one finished), never how fast collect read them (results that waited in Redis are read at
thousands a second); the prefix-cache hit rate (cached prompt tokens / prompt tokens of the
results seen) and the ETA (jobs left / jobs/s). While a phase is on (the workers load their
model) and no worker has generated a result, the line says what is happening instead of the
rates; a row rejected at enqueue, read at once, does not end it. On a terminal it is a rich live line redrawn a few times a
second, and other lines (``log``: the workers' logs under ``run``) are printed above it, never
into it; otherwise (a pipe, a log file) a plain line when a phase begins, every ``interval_s``
seconds and one at the end; ``quiet`` shows nothing of its own (``log`` lines still pass).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

import msgspec

from wire.schema import Timings, Usage

# NOTE: long enough for an engine that finishes its running batch at once, every minute or so
RATE_WINDOW_S = 120.0


class _Seen(msgspec.Struct):
    """The part of a stored Result that progress reads."""

    usage: Usage = Usage()
    error: Any = None
    timings: Timings = Timings()


_seen_decoder = msgspec.msgpack.Decoder(_Seen)


@dataclass(frozen=True)
class Snapshot:
    done: int  # jobs in scope with a row, or a result read and not yet written
    total: int  # jobs in scope (grows while jobs are enqueued)
    failed: int  # of done: error rows
    jobs_per_s: float
    output_tokens_per_s: float
    cache_hit: float | None  # cached prompt tokens / prompt tokens of results read; None: none read
    eta_s: float | None  # None: no rate yet
    elapsed_s: float  # since the display started
    phase: str | None = None  # what happens before the first result (loading the model)

    def line(self) -> str:
        if self.phase is not None:
            return f"{self.done}/{self.total} done  {self.phase}  elapsed {_clock(self.elapsed_s)}"
        eta = _clock(self.eta_s) if self.eta_s is not None else "?"
        hit = f"{self.cache_hit:.0%}" if self.cache_hit is not None else "-"
        return (
            f"{self.done}/{self.total} done  {self.failed} failed  {self.jobs_per_s:.1f} jobs/s  "
            f"{self.output_tokens_per_s:.0f} tok/s out  cache {hit}  ETA {eta}  elapsed {_clock(self.elapsed_s)}"
        )


class Generated:
    """Jobs and output tokens by the second their workers finished them: generation rates,
    whenever the results are read. A result without timings (a row rejected at enqueue: no
    worker ran it) is not counted."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.jobs = 0
        self.tokens = 0
        self.first_start_s: float | None = None  # the earliest start among the results counted
        self.last_finish_s: float | None = None
        self._seconds: dict[int, list[int]] = {}  # finished second -> [jobs, tokens]

    def add(self, timings: Timings, tokens: int) -> None:
        if not timings.finished_at_ms:
            return
        finish_s = timings.finished_at_ms / 1000
        start_s = min(timings.started_at_ms or timings.finished_at_ms, timings.finished_at_ms) / 1000
        self.jobs += 1
        self.tokens += tokens
        self.first_start_s = start_s if self.first_start_s is None else min(self.first_start_s, start_s)
        self.last_finish_s = finish_s if self.last_finish_s is None else max(self.last_finish_s, finish_s)
        counts = self._seconds.setdefault(int(finish_s), [0, 0])
        counts[0] += 1
        counts[1] += tokens

    def rates(self, now_s: float) -> tuple[float, float]:
        """(jobs/s, tokens/s) finished over the last window (or since the first job started)."""
        if self.first_start_s is None:
            return 0.0, 0.0
        start_s = max(now_s - self.window_s, self.first_start_s)
        for second in [s for s in self._seconds if s + 1 <= start_s]:
            del self._seconds[second]
        elapsed_s = now_s - start_s
        if elapsed_s < 0.1:
            return 0.0, 0.0
        jobs = sum(counts[0] for second, counts in self._seconds.items() if second <= now_s)
        tokens = sum(counts[1] for second, counts in self._seconds.items() if second <= now_s)
        return jobs / elapsed_s, tokens / elapsed_s

    def averages(self) -> tuple[float, float]:
        """(jobs/s, tokens/s) from the first job started to the last one finished."""
        if self.first_start_s is None or self.last_finish_s is None:
            return 0.0, 0.0
        span_s = max(self.last_finish_s - self.first_start_s, 1e-3)
        return self.jobs / span_s, self.tokens / span_s


class Progress:
    """Counts what a collect sees and shows it (see the module docstring). Use as a context
    manager: the display runs between enter and exit, and exit shows the final state."""

    def __init__(
        self,
        *,
        quiet: bool = False,
        interval_s: float = 10.0,
        stream: IO[str] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``clock``: wall-clock seconds, the time base of the results' timings."""
        self.stream = stream or sys.stderr
        self.quiet = quiet
        self.interval_s = interval_s
        self.clock = clock
        self.total = 0
        self._already = 0  # rows in scope before the current collect call
        self._already_failed = 0
        self._read = 0  # results read by the current collect call
        self._read_failed = 0
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.output_tokens = 0
        self.generated = Generated(RATE_WINDOW_S)
        self._started_s = clock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._live: Any = None
        self._begun = False  # a collect call has begun (it reached Redis)
        self._final = False  # the display is ending: show whole-run averages
        self._phase: str | None = None
        self._lock = threading.Lock()  # one writer at a time on a plain stream

    # ---- what the collector calls -----------------------------------------------------------

    def begin(self, total: int, already: int, already_failed: int) -> None:
        """A collect call starts: ``already`` rows of its scope are in the output file."""
        self.total, self._already, self._already_failed = total, already, already_failed
        self._begun = True
        self._read = self._read_failed = 0

    def scope(self, total: int) -> None:
        self.total = total

    def phase(self, text: str | None) -> None:
        """What is happening before results come (``text``), or None once work has started.
        NOTE: on a plain stream a new phase is a line at once, not at the next interval."""
        changed, self._phase = text != self._phase, text
        if changed and text is not None and self._thread is not None:
            self._say(self.snapshot().line())

    def log(self, line: str) -> None:
        """Show a line from elsewhere (a worker's log): above the live display, never inside it."""
        live = self._live
        if live is not None:
            live.console.print(line, markup=False, highlight=False, emoji=False, soft_wrap=True)
            return
        with self._lock:
            print(line, file=self.stream, flush=True)

    def result(self, raw: bytes) -> None:
        """A counted result read from Redis (stored msgpack)."""
        try:
            seen = _seen_decoder.decode(raw)
        except msgspec.DecodeError:
            seen = _Seen(error="undecodable")
        self._read += 1
        self._read_failed += seen.error is not None
        self.prompt_tokens += seen.usage.prompt_tokens
        self.cached_tokens += seen.usage.cached_tokens
        self.output_tokens += seen.usage.completion_tokens
        self.generated.add(seen.timings, seen.usage.completion_tokens)

    # ---- what it shows ----------------------------------------------------------------------

    def snapshot(self, final: bool = False) -> Snapshot:
        """The state now; ``final``: the rates are averages over the generation of every
        result counted (the last line of a run shorter than the window would otherwise show
        less than it ran at)."""
        now_s = self.clock()
        jobs_per_s, tokens_per_s = self.generated.averages() if final else self.generated.rates(now_s)
        done = self._already + self._read
        total = max(self.total, done)
        left = total - done
        return Snapshot(
            done=done,
            total=total,
            failed=self._already_failed + self._read_failed,
            jobs_per_s=jobs_per_s,
            output_tokens_per_s=tokens_per_s,
            cache_hit=self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None,
            eta_s=0.0 if left == 0 else (left / jobs_per_s if jobs_per_s > 0 else None),
            elapsed_s=now_s - self._started_s,
            # NOTE: until a worker generated a result: rows rejected at enqueue are read at once
            phase=self._phase if not final and self.generated.jobs == 0 else None,
        )

    def __enter__(self) -> Progress:
        self._started_s = self.clock()
        if self.quiet:
            return self
        if self.stream.isatty():
            from rich.console import Console
            from rich.live import Live

            self._live = Live(
                get_renderable=self._render,
                console=Console(file=self.stream),
                refresh_per_second=4,
                transient=False,
            )
            self._live.start()
        else:
            self._thread = threading.Thread(target=self._plain_lines, name="progress", daemon=True)
            self._thread.start()
            if self._phase is not None:
                self._say(self.snapshot().line())
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        """Shows the final state, unless the collect failed before it began (its error is the
        message then) or while it ran (the last line shown stands)."""
        self._final = True
        if self._live is not None:
            self._live.stop()  # draws the final state
            self._live = None
        elif self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            if exc_type is None and self._begun:
                self._say(self.snapshot(final=True).line())

    def _render(self) -> Any:
        from rich.progress_bar import ProgressBar
        from rich.table import Table

        snap = self.snapshot(final=self._final)
        grid = Table.grid(padding=(0, 1))
        grid.add_row(ProgressBar(total=max(snap.total, 1), completed=snap.done, width=20), snap.line())
        return grid

    def _plain_lines(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._say(self.snapshot().line())

    def _say(self, line: str) -> None:
        with self._lock:
            print(f"progress: {line}", file=self.stream, flush=True)


def _clock(seconds: float) -> str:
    whole = int(round(seconds))
    hours, rest = divmod(whole, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}"
