"""Time one call on the GPU: milliseconds between CUDA events around it (on a machine without
CUDA, wall time, for CPU smoke runs of GPU benchmarks)."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def event_ms(fn: Callable[[], object]) -> float:
    """Milliseconds of GPU time from just before ``fn`` to its last kernel (events on the current
    stream, synchronized), or of wall time where CUDA is unavailable."""
    if not torch.cuda.is_available():
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)
