"""Progress arithmetic: rates over a sliding window, ETA, cache hit, totals across calls."""

from __future__ import annotations

import io

import pytest

from producer.progress import Progress
from wire.schema import ErrorInfo, Result, Usage, encode
from wire.status import RateWindow


def test_rate_window_uses_only_the_last_window() -> None:
    window = RateWindow(window_s=10.0)
    assert window.sample(0.0, 0) == (0.0,)
    window.sample(5.0, 100)  # 20/s during the first five seconds
    for t in range(6, 31):
        rate = window.sample(float(t), 100 + 2 * (t - 5))  # then 2/s
    assert rate[0] == pytest.approx(2.0)


def test_snapshot_counts_results_failures_tokens_and_eta() -> None:
    now = [0.0]
    progress = Progress(quiet=True, stream=io.StringIO(), clock=lambda: now[0])
    progress.begin(total=10, already=2, already_failed=1)
    progress.snapshot()
    for i in range(4):
        now[0] += 1.0
        usage = Usage(prompt_tokens=10, completion_tokens=5, cached_tokens=4)
        progress.result(encode(Result(id=f"j{i}", usage=usage)))
    progress.result(encode(Result(id="bad", error=ErrorInfo(code="internal", message="x"))))
    snap = progress.snapshot()
    assert (snap.done, snap.total, snap.failed) == (7, 10, 2)
    assert snap.jobs_per_s == pytest.approx(5 / 4) and snap.output_tokens_per_s == pytest.approx(20 / 4)
    assert snap.cache_hit == pytest.approx(16 / 40)
    assert snap.eta_s == pytest.approx(3 / (5 / 4))
    assert "7/10 done  2 failed" in snap.line() and "cache 40%" in snap.line()


def test_plain_mode_writes_a_final_line() -> None:
    stream = io.StringIO()
    with Progress(interval_s=60, stream=stream) as progress:
        progress.begin(total=1, already=0, already_failed=0)
        progress.result(encode(Result(id="a", usage=Usage(completion_tokens=3))))
    assert stream.getvalue().startswith("progress: 1/1 done  0 failed")
    assert "ETA 0:00:00" in stream.getvalue()


def test_the_final_line_shows_whole_run_rates() -> None:
    """A run shorter than one plain-line interval: the last line averages over the run
    (4 jobs and 40 output tokens in 8 s), not the empty sampling window (0 jobs/s)."""
    now, stream = [100.0], io.StringIO()
    with Progress(interval_s=60, stream=stream, clock=lambda: now[0]) as progress:
        progress.begin(total=4, already=0, already_failed=0)
        for i in range(4):
            now[0] += 2.0
            progress.result(encode(Result(id=f"j{i}", usage=Usage(completion_tokens=10))))
    assert (
        stream.getvalue()
        == "progress: 4/4 done  0 failed  0.5 jobs/s  5 tok/s out  cache -  ETA 0:00:00  elapsed 0:00:08\n"
    )


def test_loading_phase_then_bursty_results_keep_a_rate() -> None:
    """Issue 17, item 4: while the workers load their model (5 minutes here) the line says so;
    the rate counts from when they were ready, and an engine that finishes its batch of 32
    at once every 60 s shows about 32/60 jobs/s between bursts, never 0 (a 20 s window did)."""
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
            progress.result(encode(Result(id=f"b{burst}-{i}")))
        for later in (1.0, 30.0, 59.0):  # sampled as the display does, between bursts
            now[0] = 300.0 + 60 * burst + later
            rates.append(progress.snapshot().jobs_per_s)
    assert min(rates) > 0.25 and max(rates) < 1.1, rates
    assert rates[-1] == pytest.approx(32 * 4 / (60 * 4 + 59), rel=0.35)
    assert "ETA" in progress.snapshot().line() and "loading" not in progress.snapshot().line()
