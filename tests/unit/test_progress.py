"""Progress arithmetic: rates over a sliding window, ETA, cache hit, totals across calls."""

from __future__ import annotations

import io

import pytest

from producer.progress import Progress
from wire.schema import ErrorInfo, Result, Timings, Usage, encode
from wire.status import RateWindow


def test_rate_window_uses_only_the_last_window() -> None:
    window = RateWindow(window_s=10.0)
    assert window.sample(0.0, 0) == (0.0,)
    window.sample(5.0, 100)  # 20/s during the first five seconds
    for t in range(6, 31):
        rate = window.sample(float(t), 100 + 2 * (t - 5))  # then 2/s
    assert rate[0] == pytest.approx(2.0)


def generated(job_id: str, started_s: float, finished_s: float, **usage: int) -> bytes:
    """A stored result its worker started and finished at those (wall-clock) seconds."""
    timings = Timings(started_at_ms=int(started_s * 1000), finished_at_ms=int(finished_s * 1000))
    return encode(Result(id=job_id, usage=Usage(**usage), timings=timings))


def test_snapshot_counts_results_failures_tokens_and_eta() -> None:
    now = [1000.0]
    progress = Progress(quiet=True, stream=io.StringIO(), clock=lambda: now[0])
    progress.begin(total=10, already=2, already_failed=1)
    progress.snapshot()
    for i in range(4):
        now[0] += 1.0
        progress.result(
            generated(f"j{i}", 1000.0, now[0], prompt_tokens=10, completion_tokens=5, cached_tokens=4)
        )
    progress.result(encode(Result(id="bad", error=ErrorInfo(code="internal", message="x"))))
    snap = progress.snapshot()
    assert (snap.done, snap.total, snap.failed) == (7, 10, 2)
    # 4 jobs generated in the 4 s since the first one started (the error row has no timings)
    assert snap.jobs_per_s == pytest.approx(4 / 4) and snap.output_tokens_per_s == pytest.approx(20 / 4)
    assert snap.cache_hit == pytest.approx(16 / 40)
    assert snap.eta_s == pytest.approx(3 / 1)
    assert "7/10 done  2 failed" in snap.line() and "cache 40%" in snap.line()


def test_plain_mode_writes_a_final_line() -> None:
    stream = io.StringIO()
    with Progress(interval_s=60, stream=stream) as progress:
        progress.begin(total=1, already=0, already_failed=0)
        progress.result(encode(Result(id="a", usage=Usage(completion_tokens=3))))
    assert stream.getvalue().startswith("progress: 1/1 done  0 failed")
    assert "ETA 0:00:00" in stream.getvalue()


def test_the_final_line_shows_whole_run_rates() -> None:
    """The last line averages over the generation of what was read (4 jobs and 40 output
    tokens from the first start to the last finish, 8 s), not the empty sampling window."""
    now, stream = [100.0], io.StringIO()
    with Progress(interval_s=60, stream=stream, clock=lambda: now[0]) as progress:
        progress.begin(total=4, already=0, already_failed=0)
        for i in range(4):
            now[0] += 2.0
            progress.result(generated(f"j{i}", 100.0, now[0], completion_tokens=10))
    assert (
        stream.getvalue()
        == "progress: 4/4 done  0 failed  0.5 jobs/s  5 tok/s out  cache -  ETA 0:00:00  elapsed 0:00:08\n"
    )


def test_rates_are_the_workers_generation_not_the_reading() -> None:
    """Issue 30, item 9: results the workers generated one a second over 100 s, read by a
    collect in half a second, show 1 job/s (and 8 tok/s), not the 200 jobs/s of the reading;
    read long after, the live rate says nothing is being generated now."""
    now, stream = [5100.0], io.StringIO()
    with Progress(interval_s=60, stream=stream, clock=lambda: now[0]) as progress:
        progress.begin(total=100, already=0, already_failed=0)
        for i in range(100):
            progress.result(generated(f"j{i}", 4800.0 + i, 4801.0 + i, completion_tokens=8))
        now[0] += 0.5
        assert progress.snapshot().jobs_per_s == 0.0  # generated long ago: nothing now
    final = stream.getvalue()
    assert "100/100 done  0 failed  1.0 jobs/s  8 tok/s out" in final, final


def test_loading_phase_then_bursty_results_keep_a_rate() -> None:
    """Issue 17, item 4: while the workers load their model (5 minutes here) the line says so;
    the rate counts from when they started generating, and an engine that finishes its batch of
    32 at once every 60 s shows about 32/60 jobs/s between bursts, never 0 (a 20 s window did)."""
    now = [0.0]
    progress = Progress(quiet=True, stream=io.StringIO(), clock=lambda: now[0])
    progress.begin(total=300, already=0, already_failed=0)
    progress.phase("loading the model in 2 workers")
    now[0] = 300.0
    snap = progress.snapshot()
    assert snap.line() == "0/300 done  loading the model in 2 workers  elapsed 0:05:00"
    progress.phase(None)  # the first worker beats
    rates = []
    for burst in range(1, 5):
        now[0] = 300.0 + 60 * burst
        for i in range(32):
            progress.result(generated(f"b{burst}-{i}", now[0] - 60, now[0]))
        for later in (1.0, 30.0, 59.0):  # sampled as the display does, between bursts
            now[0] = 300.0 + 60 * burst + later
            rates.append(progress.snapshot().jobs_per_s)
    assert min(rates) > 0.25 and max(rates) < 1.1, rates
    assert rates[-1] == pytest.approx(32 * 2 / 120, rel=0.35)
    assert "ETA" in progress.snapshot().line() and "loading" not in progress.snapshot().line()


def test_a_rejected_row_does_not_hide_the_loading_phase_on_a_plain_stream() -> None:
    """Issue 32, defect 3: without a terminal the loading phase is a line at once (not after
    interval_s), and a row rejected at enqueue - read at once, generated by no worker - leaves
    the phase on until a worker's result comes."""
    stream = io.StringIO()
    rejected = encode(Result(id="bad", error=ErrorInfo(code="invalid_job", message="x")))
    with Progress(interval_s=3600, stream=stream, clock=lambda: 1000.0) as progress:
        progress.begin(total=14, already=0, already_failed=0)
        progress.phase("loading the model in 1 worker")
        assert stream.getvalue() == "progress: 0/14 done  loading the model in 1 worker  elapsed 0:00:00\n"
        progress.result(rejected)
        assert "1/14 done  loading the model in 1 worker" in progress.snapshot().line()
        progress.result(generated("j0", 1000.0, 1001.0, completion_tokens=3))
        assert "loading" not in progress.snapshot().line()
