"""Time one call on the GPU: milliseconds between CUDA events around it (on a machine without
CUDA, wall time, for CPU smoke runs of GPU benchmarks); and capture a call as a CUDA graph."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")


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


def captured(run: Callable[[], T]) -> tuple[torch.cuda.CUDAGraph, T]:
    """``run`` captured in a CUDA graph after one warm-up call on a side stream (Triton compiles,
    cuBLAS picks its kernels), and what the captured call returned (its tensors are the graph's
    outputs)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    return graph, out
