"""Split decode (issue 31 item 2; experimental, off unless ``EngineConfig.decode_split_sms``).

A decode pass of at least ``decode_split_min_batch`` requests is cut into two halves whose
layers interleave (worker.models.decoder.CausalLM.forward_split). Each half's attention runs on
a stream of one green context (``decode_split_sms`` SMs) and its other kernels (norms, GEMMs,
rope, MoE) on a stream of a second green context holding the rest of the GPU, so one half's
memory-bound attention can read the KV pool while the other half's GEMMs compute: on one
stream, XQA's CTAs take every SM and the two run one after the other
(benchmarks/overlap_probe.py measured that; its ``--split-sms`` variants measure this cut).

The two halves attend with two attention backends over the same pool (a backend's plan lives
in its own buffers until the pass ends). The pass runs eagerly: whether a CUDA graph may be
captured across green contexts' streams is what ``overlap_probe.py --split-graph`` finds out.
On CPU (the tests) the lanes hold no streams and the halves run in turn, which checks what
the split computes, not its speed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

import torch

from worker.forward import BatchLayout, ForwardBatch

if TYPE_CHECKING:
    from worker.attention.base import AttentionBackend
    from worker.engine.engine import Engine
    from worker.forward import ForwardInput
    from worker.models.decoder import CausalLM

_GREEN_CONTEXTS: list[Any] = []  # NOTE: a green context must outlive the streams it handed out


class Lanes:
    """Where one half's kernels run: its attention on one stream, everything else on another
    (None: the current stream, in turn). Each kernel waits for the one before it in the half's
    chain, so the half computes what one stream computes. Blocks nest (a layer runs on "gemm"
    and its attention on "attention" inside it): when an inner block ends, the outer block's
    stream waits for it before going on."""

    def __init__(
        self, gemm: torch.cuda.Stream | None = None, attention: torch.cuda.Stream | None = None
    ) -> None:
        self.streams = {"gemm": gemm, "attention": attention}
        self.last: torch.cuda.Stream | None = None  # the stream of the chain's latest kernel
        self._open: list[torch.cuda.Stream] = []  # the streams of the blocks entered, innermost last

    @contextmanager
    def on(self, kind: str) -> Iterator[None]:
        """Run the block on this half's ``kind`` stream ("gemm" or "attention"), after what
        the half ran before."""
        stream = self.streams[kind]
        if stream is None:
            yield
            return
        if self.last is not stream:
            stream.wait_stream(self.last or torch.cuda.current_stream())
        self.last = stream
        self._open.append(stream)
        try:
            with torch.cuda.stream(stream):
                yield
        finally:
            self._open.pop()
            if self._open and self._open[-1] is not stream:  # back in the enclosing block
                self._open[-1].wait_stream(stream)
                self.last = self._open[-1]

    def join(self) -> None:
        """The current stream waits for the half's last kernel; the next pass starts afresh."""
        if self.last is not None:
            torch.cuda.current_stream().wait_stream(self.last)
        self.last = None


def green_streams(
    attention_sms: int, per_side: int = 2, device: int | None = None
) -> tuple[list[torch.cuda.Stream], list[torch.cuda.Stream], int, int]:
    """The GPU cut in two disjoint green contexts: ``attention_sms`` SMs (the driver rounds up,
    8 at a time on sm90) and the rest, ``per_side`` streams on each; returns (the first's streams,
    the rest's, their SM counts). torch's GreenContext takes its SMs from the whole device each
    time (two of them may share SMs), so this uses the driver API (cuda-python), FlashInfer's
    green_ctx helpers cutting the SMs. RuntimeError, naming what is missing, where it cannot."""
    try:
        import cuda.bindings.driver as driver
        from flashinfer.cuda_utils import checkCudaErrors
        from flashinfer.green_ctx import get_cudevice, get_device_resource, split_resource_by_sm_count
    except ImportError as exc:
        raise RuntimeError(
            f"a split of the GPU's SMs needs cuda-python (pip install cuda-bindings): {exc}"
        ) from exc

    cu_device = get_cudevice(torch.device("cuda", torch.cuda.current_device() if device is None else device))
    groups, rest = split_resource_by_sm_count(cu_device, get_device_resource(cu_device), [attention_sms])
    sides: list[list[torch.cuda.Stream]] = []
    for resource in (groups[0], rest):
        desc = checkCudaErrors(driver.cuDevResourceGenerateDesc([resource], 1))
        flags = driver.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM
        context = checkCudaErrors(driver.cuGreenCtxCreate(desc, cu_device, flags))
        _GREEN_CONTEXTS.append(context)
        nonblocking = driver.CUstream_flags.CU_STREAM_NON_BLOCKING
        handles = [
            checkCudaErrors(driver.cuGreenCtxStreamCreate(context, nonblocking, 0)) for _ in range(per_side)
        ]
        sides.append([torch.cuda.get_stream_from_external(int(h)) for h in handles])
    return sides[0], sides[1], int(groups[0].sm.smCount), int(rest.sm.smCount)


def halve(layout: BatchLayout, at: int) -> tuple[BatchLayout, BatchLayout]:
    """The layouts of requests [0, at) and [at, B)."""
    return tuple(  # type: ignore[return-value]
        BatchLayout(layout.slots_cpu[part], layout.cached_lens_cpu[part], layout.extend_lens_cpu[part])
        for part in (slice(0, at), slice(at, None))
    )


class SplitDecode:
    """The engine's split decode path: the second half's attention backend, the two halves'
    lanes and the smallest batch that splits (module docstring)."""

    def __init__(self, backend: AttentionBackend, lanes: tuple[Lanes, Lanes], min_batch: int) -> None:
        self.backend = backend
        self.lanes = lanes
        self.min_batch = max(2, min_batch)
        self.passes = 0  # decode passes split (the benchmarks report it)

    @classmethod
    def on_gpu(
        cls, backend: AttentionBackend, attention_sms: int, min_batch: int, device: int
    ) -> SplitDecode:
        attention, gemms, _, _ = green_streams(attention_sms, device=device)
        return cls(backend, (Lanes(gemms[0], attention[0]), Lanes(gemms[1], attention[1])), min_batch)

    def applies(self, fi: ForwardInput) -> bool:
        return fi.batch_size >= self.min_batch and fi.layout.is_decode

    def logits(self, engine: Engine, fi: ForwardInput) -> torch.Tensor:
        """The pass's logits [B, vocab], the two halves' rows in order. A pass the scheduler
        padded for a CUDA graph is read to its B requests only (decode: one token a request)."""
        rows = fi.batch_size
        at = rows // 2
        input_ids = engine.token_pool[fi.load_slots[:rows], fi.positions[:rows]].to(torch.int64)
        halves = []
        for part, layout, backend, lanes in zip(
            (slice(0, at), slice(at, rows)),
            halve(fi.layout, at),
            (engine.backend, self.backend),
            self.lanes,
            strict=True,
        ):
            halves.append(
                ForwardBatch(
                    input_ids=input_ids[part],
                    positions=fi.positions[part],
                    out_loc=fi.out_loc[part],
                    sample_idx=torch.arange(layout.batch_size, device=input_ids.device),
                    layout=layout,
                    backend=backend,
                    attn_meta=backend.plan(layout),
                    kv=engine.kv,
                    lanes=lanes,
                )
            )
        self.passes += 1
        return cast("CausalLM", engine.model).forward_split(halves)
