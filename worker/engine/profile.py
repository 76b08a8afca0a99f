"""StepProfiler: where each scheduler step's time goes, host phases against GPU time.

Install on a scheduler (``StepProfiler.install(scheduler)``, or set RADIXQ_STEP_PROFILE=1 for
the offline benchmark). Per step it records host seconds spent launching (batch preparation,
planning, enqueueing the pass), waiting for the previous step's tokens, and processing them,
plus CUDA events around the pass on the engine stream. ``summary`` gives percentiles and the
GPU's busy share of the wall time: with overlap on, host work hides behind GPU work when the
gap between one pass's end and the next one's start stays near zero.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class StepRecord:
    batch_size: int
    is_prefill: bool
    launch_s: float = 0.0
    wait_s: float = 0.0
    process_s: float = 0.0
    events: tuple[Any, Any] | None = None  # CUDA events around the pass


class _TimedEvent:
    """Wraps a copy-done event so the host's wait on it is measured."""

    def __init__(self, event: Any, record: StepRecord) -> None:
        self._event, self._record = event, record

    def synchronize(self) -> None:
        start = time.perf_counter()
        self._event.synchronize()
        self._record.wait_s += time.perf_counter() - start

    def query(self) -> bool:
        return bool(self._event.query())


@dataclass
class StepProfiler:
    records: list[StepRecord] = field(default_factory=list)
    _by_output: dict[int, StepRecord] = field(default_factory=dict)

    @classmethod
    def install(cls, scheduler: Any) -> StepProfiler:
        profiler = cls()
        launch, process, forward = scheduler._launch, scheduler._process, scheduler.engine.forward
        cuda = scheduler.engine.device.type == "cuda"

        def timed_forward(fi: Any) -> Any:
            record = StepRecord(fi.batch_size, not fi.layout.is_decode)
            profiler.records.append(record)
            if cuda:
                begin = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                engine = scheduler.engine
                stream = engine.stream or torch.cuda.current_stream()
                if engine.stream is not None:
                    stream.wait_stream(engine.scheduler_stream)  # begin after the metadata copies
                begin.record(stream)
            output = forward(fi)
            if cuda:
                end.record(stream)
                record.events = (begin, end)
                output = output._replace(copy_done=_TimedEvent(output.copy_done, record))
            profiler._by_output[id(output)] = record
            return output

        def timed_launch() -> Any:
            start = time.perf_counter()
            step = launch()
            if step is not None:
                profiler._by_output[id(step.output)].launch_s = time.perf_counter() - start
            return step

        def timed_process(step: Any) -> None:
            start = time.perf_counter()
            process(step)
            if step is not None:
                record = profiler._by_output.pop(id(step.output))
                record.process_s = time.perf_counter() - start - record.wait_s

        scheduler._launch, scheduler._process, scheduler.engine.forward = (
            timed_launch,
            timed_process,
            timed_forward,
        )
        return profiler

    def summary(self) -> dict[str, Any]:
        """Percentiles (ms) of each phase for decode and prefill steps, and GPU busy share."""
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        gpu_ms, gap_ms = [], []
        prev_end = None
        for r in self.records:
            if r.events is None:
                gpu_ms.append(float("nan"))
                continue
            begin, end = r.events
            gpu_ms.append(begin.elapsed_time(end))
            if prev_end is not None:
                gap_ms.append(max(0.0, prev_end.elapsed_time(begin)))
            prev_end = end
        out: dict[str, Any] = {"steps": len(self.records)}
        for kind in ("decode", "prefill"):
            idx = [i for i, r in enumerate(self.records) if r.is_prefill == (kind == "prefill")]
            if not idx:
                continue
            rows = {
                "launch_ms": [self.records[i].launch_s * 1e3 for i in idx],
                "process_ms": [self.records[i].process_s * 1e3 for i in idx],
                "wait_ms": [self.records[i].wait_s * 1e3 for i in idx],
                "host_ms": [(self.records[i].launch_s + self.records[i].process_s) * 1e3 for i in idx],
                "gpu_ms": [gpu_ms[i] for i in idx],
            }
            out[kind] = {"steps": len(idx), **{k: _percentiles(v) for k, v in rows.items()}}
        if gap_ms:
            out["gpu_gap_ms"] = _percentiles(gap_ms)
            busy, idle = sum(g for g in gpu_ms if g == g), sum(gap_ms)
            out["gpu_busy_share"] = busy / (busy + idle) if busy + idle else 0.0
        return out


def _percentiles(values: list[float]) -> dict[str, float]:
    clean = sorted(v for v in values if v == v)
    if not clean:
        return {}

    def at(q: float) -> float:
        return clean[min(len(clean) - 1, int(q * len(clean)))]

    return {
        "p50": at(0.5),
        "p90": at(0.9),
        "p99": at(0.99),
        "mean": sum(clean) / len(clean),
        "sum": sum(clean),
    }
