"""EngineConfig: every engine and scheduler option, built once at the edge and frozen."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EngineConfig:
    """Options of one engine + scheduler. ``resolved()`` turns "auto" values into concrete ones.

    ``num_pages`` None sizes the KV pool from ``mem_fraction`` of free device memory (CUDA)
    or from ``cpu_kv_gib`` (CPU). ``max_seq_len`` None means the model's context length.
    ``output_reserve_ratio`` is the share of each request's remaining output that admission
    reserves in the KV pool (1.0: never retract; lower admits more and retracts when short).
    """

    model: str
    load_format: str = "auto"
    device: str = "auto"
    dtype: str = "auto"
    page_size: int = 16
    num_pages: int | None = None
    mem_fraction: float = 0.85
    cpu_kv_gib: float = 1.0
    cpu_threads: int = 0  # torch threads of a CPU engine (0: every core it may use; worker.engine.threads)
    max_running_reqs: int = 256
    max_prefill_tokens: int = 8192
    max_seq_len: int | None = None
    cache: str = "radix"
    kv_cache_dtype: str = "auto"  # "auto": the model's dtype; "fp8_e4m3": half the bytes (per-layer scales)
    quantization: str = "none"  # "fp8": e4m3 projection weights (per-channel scales), FP8 GEMMs
    kv_scales: str = "calibrated"  # FP8 scales: "calibrated" at load, or "unit" (1.0 everywhere)
    schedule_policy: str = "lpm"  # waiting-request order: longest cached prefix first, or "fcfs"
    overlap: bool = True
    mixed_batches: bool = True  # while a long prompt is chunked, its steps decode the running requests too
    attention: str = "auto"
    decode_kernel: str = (
        "auto"  # flashinfer decode: "auto" (XQA over FP8 pages on sm90, else FA2), "fa2", "xqa"
    )
    cuda_graph: bool = True
    cuda_graph_max_bs: int = 256
    cascade_attention: bool = False  # attend to prefixes that running requests share once per group
    cascade_min_saved_mib: float = 32.0  # the cost rule: KV MiB a step must save per layer (groups.py)
    output_reserve_ratio: float = 0.5
    triton: bool = True  # fused Triton kernels on CUDA (false: the torch paths, for ablation)
    onednn: bool = True  # float32 linear layers on CPU through oneDNN (false: torch's MKL, for ablation)
    cache_dir: str = ""  # where converted models are cached ("": ~/.cache/radixq/models)
    grammar_timeout_s: float = 60.0  # a job's grammar that compiles longer fails that job
    grammar_memory_mib: int = 2048  # what one compile may add to the compiler process; beyond: that job fails
    tensor_parallel_size: int = 1  # processes (GPUs) one model is split over; rank 0 schedules
    step_profile: bool = False  # record every scheduler step (profiling runs; logged at exit)
    fault: str = ""  # injected failures, for the failure tests (worker.engine.faults)

    def __post_init__(self) -> None:
        checks: list[tuple[bool, str, Any, str]] = [
            (self.page_size >= 1, "page_size", self.page_size, "must be >= 1"),
            (self.num_pages is None or self.num_pages >= 1, "num_pages", self.num_pages, "must be >= 1"),
            (0 < self.mem_fraction <= 1, "mem_fraction", self.mem_fraction, "must be in (0, 1]"),
            (self.cpu_threads >= 0, "cpu_threads", self.cpu_threads, "must be >= 0 (0: every core)"),
            (self.grammar_timeout_s > 0, "grammar_timeout_s", self.grammar_timeout_s, "must be > 0"),
            (self.grammar_memory_mib >= 16, "grammar_memory_mib", self.grammar_memory_mib, "must be >= 16"),
            (
                self.tensor_parallel_size >= 1,
                "tensor_parallel_size",
                self.tensor_parallel_size,
                "must be >= 1",
            ),
            (self.max_running_reqs >= 1, "max_running_reqs", self.max_running_reqs, "must be >= 1"),
            (self.max_prefill_tokens >= 1, "max_prefill_tokens", self.max_prefill_tokens, "must be >= 1"),
            (
                self.max_seq_len is None or self.max_seq_len >= 2,
                "max_seq_len",
                self.max_seq_len,
                "must be >= 2",
            ),
            (self.cache in ("radix", "naive"), "cache", self.cache, "must be 'radix' or 'naive'"),
            (
                self.kv_cache_dtype in ("auto", "fp8_e4m3"),
                "kv_cache_dtype",
                self.kv_cache_dtype,
                "must be 'auto' or 'fp8_e4m3'",
            ),
            (
                self.quantization in ("none", "fp8"),
                "quantization",
                self.quantization,
                "must be 'none' or 'fp8'",
            ),
            (
                self.decode_kernel in ("auto", "fa2", "xqa"),
                "decode_kernel",
                self.decode_kernel,
                "must be 'auto', 'fa2' or 'xqa'",
            ),
            (
                self.kv_scales in ("calibrated", "unit"),
                "kv_scales",
                self.kv_scales,
                "must be 'calibrated' or 'unit'",
            ),
            (
                self.schedule_policy in ("lpm", "fcfs"),
                "schedule_policy",
                self.schedule_policy,
                "must be 'lpm' or 'fcfs'",
            ),
            (
                self.cascade_min_saved_mib >= 0,
                "cascade_min_saved_mib",
                self.cascade_min_saved_mib,
                "must be >= 0",
            ),
            (
                0 <= self.output_reserve_ratio <= 1,
                "output_reserve_ratio",
                self.output_reserve_ratio,
                "must be in [0, 1]",
            ),
        ]
        if self.fault:
            from worker.engine.faults import Fault

            Fault.parse(self.fault)  # raises ValueError naming the rule
        for ok, field, value, reason in checks:
            if not ok:
                raise ValueError(f"{field}={value!r}: {reason}")

    def resolved(self) -> EngineConfig:
        """A copy with device "auto" resolved (cuda when available, else cpu)."""
        if self.device != "auto":
            return self
        import torch

        return dataclasses.replace(self, device="cuda" if torch.cuda.is_available() else "cpu")

    @classmethod
    def from_options(cls, model: str, **options: Any) -> EngineConfig:
        """Build from keyword options, naming any unknown one."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(f"unknown engine option(s) {unknown}; known: {sorted(known)}")
        return cls(model=model, **options)
