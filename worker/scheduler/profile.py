"""StepProfiler: where each scheduler step's time goes, host phases against GPU time.

Install on a scheduler (``StepProfiler.install(scheduler)``, or set RADIXQ_STEP_PROFILE=1 for
the worker); it observes the steps through the scheduler's hooks (worker.scheduler.hooks).
Per step it records host seconds spent launching (batch preparation, planning, enqueueing
the pass), waiting for the step's tokens, and processing them, plus CUDA events around the
pass on the engine stream. ``summary`` gives percentiles and the GPU's busy share of the
wall time: with overlap on, host work hides behind GPU work when the gap between one pass's
end and the next one's start stays near zero.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from worker.scheduler.hooks import StepHooks

FULL_BATCH_SHARE = 0.98  # a "full" decode step runs at least this share of the largest batch

if TYPE_CHECKING:
    from worker.engine.engine import Engine
    from worker.forward import ForwardInput, ForwardOutput
    from worker.scheduler.scheduler import Scheduler
    from worker.scheduler.step import Step


@dataclass
class StepRecord:
    batch_size: int
    is_prefill: bool
    num_tokens: int = 0  # tokens the pass computed (a mixed step's prompt tokens and decode rows)
    launch_s: float = 0.0
    wait_s: float = 0.0
    process_s: float = 0.0
    events: tuple[Any, Any] | None = None  # CUDA events around the pass


@dataclass
class StepProfiler(StepHooks):
    engine: Engine
    records: list[StepRecord] = field(default_factory=list)
    _by_output: dict[int, StepRecord] = field(default_factory=dict)  # steps launched, not processed
    _launch_start_s: float = 0.0
    _process_start_s: float = 0.0
    _tokens_s: float = 0.0

    @classmethod
    def install(cls, scheduler: Scheduler) -> StepProfiler:
        """A profiler observing ``scheduler`` from its next step on."""
        profiler = cls(scheduler.engine)
        scheduler.hooks = profiler
        return profiler

    def launch_started(self) -> None:
        self._launch_start_s = time.perf_counter()

    def forward_started(self, fi: ForwardInput) -> None:
        record = StepRecord(fi.batch_size, not fi.layout.is_decode, fi.layout.num_tokens)
        self.records.append(record)
        engine = self.engine
        if engine.device.type == "cuda":
            stream = engine.stream or torch.cuda.current_stream()
            if engine.stream is not None:
                stream.wait_stream(engine.scheduler_stream)  # begin after the metadata copies
            begin = torch.cuda.Event(enable_timing=True)
            begin.record(stream)
            record.events = (begin, torch.cuda.Event(enable_timing=True))

    def forward_finished(self, fi: ForwardInput, output: ForwardOutput) -> None:
        record = self.records[-1]
        if record.events is not None:
            record.events[1].record(self.engine.stream or torch.cuda.current_stream())
        self._by_output[id(output)] = record

    def launch_finished(self, step: Step) -> None:
        self._by_output[id(step.output)].launch_s = time.perf_counter() - self._launch_start_s

    def process_started(self, step: Step) -> None:
        self._process_start_s = time.perf_counter()

    def tokens_arrived(self, step: Step) -> None:
        self._tokens_s = time.perf_counter()
        self._by_output[id(step.output)].wait_s = self._tokens_s - self._process_start_s

    def process_finished(self, step: Step) -> None:
        self._by_output.pop(id(step.output)).process_s = time.perf_counter() - self._tokens_s

    def summary(self) -> dict[str, Any]:
        """Percentiles (ms) of each phase for decode and prefill steps, and GPU busy share.

        ``decode_full``: the decode steps whose batch is within FULL_BATCH_SHARE of the largest
        decode batch (the host time "at N running" when N requests run at once). Prefill steps
        also give ``tokens`` (all they computed, decode rows riding along included) and
        ``gpu_ms_per_8192_tokens``: their GPU time over those tokens, per 8,192."""
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
        decode = [i for i, r in enumerate(self.records) if not r.is_prefill]
        full_batch = FULL_BATCH_SHARE * max((self.records[i].batch_size for i in decode), default=0)
        kinds = {
            "decode": decode,
            "decode_full": [i for i in decode if self.records[i].batch_size >= full_batch],
            "prefill": [i for i, r in enumerate(self.records) if r.is_prefill],
        }
        for kind, idx in kinds.items():
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
        if decode:
            out["decode_full"]["batch_size"] = int(max(self.records[i].batch_size for i in decode))
        if kinds["prefill"]:
            tokens = sum(self.records[i].num_tokens for i in kinds["prefill"])
            timed = [gpu_ms[i] for i in kinds["prefill"] if gpu_ms[i] == gpu_ms[i]]
            out["prefill"]["tokens"] = tokens
            if timed and tokens:
                out["prefill"]["gpu_ms_per_8192_tokens"] = sum(timed) / tokens * 8192
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
