"""FlashInfer paged attention on CUDA (imported lazily by worker.attention.registry).

Engine API
----------
Eager pass (any batch)::

    with torch.cuda.stream(engine_stream):        # the stream the forward pass runs on
        meta = backend.plan(layout)               # once per pass, never per layer
        ...model forward: each layer calls backend.forward(q, layer_id, meta, new_kv)
                                  # new_kv: the layer's own K/V when wants_new_kv(meta), else None

CUDA-graph decode (the graph hooks of worker.attention.base.AttentionBackend, driven by
worker.engine.graph.GraphRunner; the engine captures the sizes of
worker.engine.graph.graph_batch_sizes: 1, 2, 4, 8, then every multiple of 16 up to its
largest batch)::

    backend.init_cuda_graphs(sizes, max_seq_len)  # fixed buffers, one wrapper a size
    for bs in reversed(sizes):
        meta = backend.capture_meta(bs)   # bs dummy 1-token requests reading page 0
        ...warm up, then capture the model forward with attn_meta=meta
    per decode step (layout.is_decode, B requests, bs the smallest captured size >= B):
        backend.plan_for_replay(layout, bs)       # rewrites the fixed buffers, re-plans
        graphs[bs].replay()

Rows B..bs-1 of a replayed batch are padding: they attend to the first page of row 0 and
their outputs are garbage the caller ignores. A caller that pads the layout itself (dummy
slots) passes B == bs.

Invariants:
- plan/plan_for_replay enqueue their host-to-device copies on the *current* stream and
  overwrite shared device buffers (int workspace, graph index buffers), so they must run
  on the stream that runs the forward pass, after the previous pass was enqueued there.
- FlashInfer stages each plan in a pinned host buffer that it copies without waiting;
  two such buffers (a layer group) alternate, so one pass may be in flight while the next is
  planned.
- KV page indices are gathered from ``page_table`` on the GPU; only slots and per-request
  page offsets cross from the host, in one copy from pinned memory.
- model_config needs ``num_q_heads`` and may give ``layer_attention``
  (worker.models.config.ModelConfig); KV heads, head dim and dtype come from the KV pool, whose
  pages are FlashInfer's "HND" layout.
- Decode over model-dtype pages runs FlashInfer's CUDA-core kernel for small batches and its
  tensor-core kernel from TENSOR_CORE_MIN_BATCH requests up (or always, from 4 query heads per
  KV head); each captured graph is planned for the kernel of its batch size. A graph whose
  split-KV scratch could outgrow the workspace (``split_scratch_bytes``: 335 MB for 1,024
  Llama-3.1-8B requests, against 256 MiB) plans without split-KV: so many requests fill the
  GPU as they are.
- Decode over FP8 pages runs XQA (worker.attention.xqa) where it is supported
  (``decode_kernel="auto"``): FlashInfer's FA2 templates dequantize FP8 tiles in their inner
  loop and are compute-bound there. XQA has no logit soft-cap: a model that caps (Gemma 2)
  decodes through FA2, chosen here and logged once. Prefill over FP8 pages
  (``fp8_prefill="split"``) attends the pass's own K/V in the model dtype and only the cached
  prefixes from the pages (worker.attention.flashinfer_fp8_prefill; ``wants_new_kv`` says so to
  the model); ``"paged"`` runs FA2 over the pages whole, as prefill over bf16 pages always does.
  ``ragged_backend="fa3"`` runs the split path's ragged part (bf16 K/V) through FA3 on Hopper
  (``benchmarks/prefill_attention.py``'s ``split-fa3``; FA2 unless asked).
- Layers that attend differently (sliding windows, soft-caps, scales: ModelConfig.layer_attention)
  are grouped by their plan-time options (worker.attention.plan_groups); each group has its own
  wrappers (prefill, decode, one a graph batch size), planned for every pass, and its own int
  workspace and pinned staging buffers, since two plans of one pass must not overwrite each
  other's plan data. The float workspace stays shared: the layers run one after another on one
  stream. A model with one group (Llama, Qwen) has exactly the wrappers and plans it always had.
  Windows are in absolute positions: a pass's KV indices cover each request's whole sequence
  (cached prefix, earlier chunks, radix hits), and FlashInfer's mask keeps key k for query row i
  when ``k >= kv_len - qo_len + i - window_left``, i.e. the query's own position minus the window.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from worker.attention.base import AttentionBackend
from worker.attention.flashinfer_fp8_prefill import FP8_PREFILL_PATHS, Fp8Prefill, Fp8PrefillMeta
from worker.attention.names import DECODE_KERNELS, RAGGED_KERNELS
from worker.attention.plan_groups import PlanOptions, group_layers, layer_attentions
from worker.attention.xqa import XqaDecode, XqaMeta, xqa_refusal, xqa_supported
from worker.forward import BatchLayout
from worker.kvcache.pool import KVPool

logger = logging.getLogger(__name__)

_INT_WORKSPACE_BYTES = 8 * 1024 * 1024  # FlashInfer's own default for plan data
# Measured on an H200 (benchmarks/decode_breakdown.py attention, 16/8 heads, bf16, page 16):
# tensor cores read the KV at 3.6-4.0 TB/s from 61 requests up where CUDA cores reach
# 3.3-3.5; at 38 requests and below CUDA cores win (66 against 76 us a layer at 38).
TENSOR_CORE_MIN_BATCH = 64
_SPLIT_CTA_TILE_Q = 16  # FlashInfer's query tile for decode on tensor cores (group sizes <= 16)


def split_scratch_bytes(batch_size: int, num_qo_heads: int, num_kv_heads: int, head_dim: int) -> int:
    """The float workspace FlashInfer 0.6's graph-mode tensor-core decode plan takes for split-KV
    partial results (scheduler.cuh PrefillPlan, CUDA-graph padding): per query head, padded
    tiles x tile rows x (head_dim + 1) float32 values."""
    group = num_qo_heads // num_kv_heads
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132
    tiles = -(-batch_size * group // _SPLIT_CTA_TILE_Q) + batch_size - 1
    padded = max(2 * num_sms // num_kv_heads, tiles)
    return num_qo_heads * padded * _SPLIT_CTA_TILE_Q * (head_dim + 1) * 4


@dataclass(frozen=True)
class FlashInferMeta:
    """One planned pass: the wrapper to run (layer group 0's), the number of query rows it was
    planned for, and the wrappers of layer groups 1.. planned for the same pass."""

    wrapper: Any  # a planned FlashInfer wrapper
    num_rows: int  # query rows (tokens) the plan expects, padding included
    other_groups: tuple[Any, ...] = ()

    def wrapper_of(self, group: int) -> Any:
        return self.other_groups[group - 1] if group else self.wrapper


class FlashInferBackend(AttentionBackend):
    """Paged prefill (ragged, causal) and decode attention through FlashInfer; bf16/fp16 KV,
    or FP8 (e4m3) KV pages read with bf16/fp16 queries and the pool's per-layer scales."""

    supports_cuda_graphs = True

    def __init__(
        self,
        kv: KVPool,
        page_table: torch.Tensor,
        model_config: Any,
        page_size: int,
        device: torch.device | str,
        *,
        use_tensor_cores: bool | None = None,
        workspace_mib: int = 256,
        sm_scale: float | None = None,
        prefill_backend: str = "fa2",
        dtype: torch.dtype | None = None,
        decode_kernel: str = "auto",
        fp8_prefill: str = "split",
        ragged_backend: str | None = None,
    ) -> None:
        if page_size != kv.page_size:
            raise ValueError(f"page_size {page_size} != KV pool page_size {kv.page_size}")
        if dtype is not None and dtype != kv.model_dtype:
            raise ValueError(f"dtype {dtype} != KV pool model dtype {kv.model_dtype}")
        self.kv = kv
        self.page_table = page_table
        self.page_size = page_size
        self.device = torch.device(device)
        self.num_qo_heads = int(model_config.num_q_heads)
        self.num_kv_heads = kv.num_kv_heads
        self.head_dim = kv.head_dim
        if self.num_qo_heads % self.num_kv_heads:
            raise ValueError(f"{self.num_qo_heads} q heads is not a multiple of {self.num_kv_heads} kv heads")
        group_size = self.num_qo_heads // self.num_kv_heads
        # At 32/8 heads (group 4) the tensor-core kernel takes 263-274 us a layer against the
        # CUDA-core kernel's 380 us (H200, 256 x ~1000 tokens), whatever the batch.
        self.use_tensor_cores = use_tensor_cores
        self._always_tensor_cores = group_size >= 4
        self.sm_scale = sm_scale
        self._pin = self.device.type == "cuda"
        self.groups = group_layers(layer_attentions(model_config, kv.num_layers), sm_scale)
        self._group_of_layer = self.groups.group_of_layer

        if kv.layout != "HND":
            raise ValueError(f"KV pool layout {kv.layout!r}: FlashInferBackend reads HND pages")
        # [num_pages, kv_heads, page_size, head_dim] per layer
        self._paged_kv = [(kv.k_buffer(layer), kv.v_buffer(layer)) for layer in range(kv.num_layers)]
        self._float_workspace = torch.zeros(
            workspace_mib * 1024 * 1024, dtype=torch.uint8, device=self.device
        )
        num_groups = self.groups.num_groups
        # per layer group: an int workspace, two pinned staging buffers and their plan count
        self._int_workspaces = [
            torch.zeros(_INT_WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
            for _ in range(num_groups)
        ]
        self._host_staging = [
            [torch.zeros(_INT_WORKSPACE_BYTES, dtype=torch.uint8, pin_memory=self._pin) for _ in range(2)]
            for _ in range(num_groups)
        ]
        self._num_plans = [0] * num_groups
        self._prefills = [
            self._adopt(
                BatchPrefillWithPagedKVCacheWrapper(self._float_workspace, "HND", backend=prefill_backend), g
            )
            for g in range(num_groups)
        ]
        self._decodes = [
            {
                tc: self._adopt(
                    BatchDecodeWithPagedKVCacheWrapper(
                        self._float_workspace, "HND", use_tensor_cores=tc, backend="fa2"
                    ),
                    g,
                )
                for tc in (False, True)
            }
            for g in range(num_groups)
        ]
        self._prefill, self._decode = self._prefills[0], self._decodes[0]  # layer group 0's
        self._xqa = self._xqa_decode(decode_kernel)
        if ragged_backend not in (None, *RAGGED_KERNELS):
            raise ValueError(f"ragged_backend={ragged_backend!r}: expected one of {list(RAGGED_KERNELS)}")
        if fp8_prefill not in FP8_PREFILL_PATHS:
            raise ValueError(f"fp8_prefill={fp8_prefill!r}: expected one of {list(FP8_PREFILL_PATHS)}")
        split = kv.quantized and fp8_prefill == "split"
        self._fp8_prefill = Fp8Prefill(self, prefill_backend, ragged_backend) if split else None
        self._range_host: dict[int, torch.Tensor] = {}
        self.graph_batch_sizes: list[int] = []
        self._graph_wrappers: dict[int, tuple[Any, ...]] = {}  # batch size -> one wrapper a group
        self._graph_metas: dict[int, FlashInferMeta] = {}

    def _xqa_decode(self, decode_kernel: str) -> XqaDecode | None:
        """The XQA decode path where it is asked for ("xqa") or chosen ("auto": FP8 pages it can
        read, layers it can run), else None (FA2 decode)."""
        if decode_kernel not in DECODE_KERNELS:
            raise ValueError(f"decode_kernel={decode_kernel!r}: expected one of {list(DECODE_KERNELS)}")
        if decode_kernel == "fa2":
            return None
        kv, supported, refusal = self.kv, xqa_supported(self.kv, self.device), xqa_refusal(self.groups)
        if decode_kernel == "xqa":
            if refusal is not None:
                raise ValueError(f"decode_kernel='xqa': {refusal}; use decode_kernel 'auto' or 'fa2'")
            if not supported:
                raise ValueError(
                    f"decode_kernel='xqa' needs sm90, head_dim <= 256 in multiples of 16 and page_size in "
                    f"(16, 32, 64, 128), got head_dim {kv.head_dim}, page_size {kv.page_size}"
                )
        elif not (kv.quantized and supported):
            return None
        elif refusal is not None:
            logger.info("FP8 KV decode runs FlashInfer FA2, not XQA: %s", refusal)
            return None
        return XqaDecode(kv, self.page_table, self.num_qo_heads, self.groups)

    # ---- eager path -------------------------------------------------------------------

    def plan(self, layout: BatchLayout) -> FlashInferMeta | XqaMeta | Fp8PrefillMeta:
        """Plan one pass: the decode kernel when every request extends by one, else prefill."""
        if layout.is_decode and self._xqa is not None:
            return self._xqa.plan(*self._slots_and_lens_gpu(layout))
        if not layout.is_decode and self._fp8_prefill is not None:
            return self._fp8_prefill.plan(layout)
        lens = self._lengths(layout.slots_cpu, layout.seq_lens_cpu)
        indices_gpu = self._page_indices_gpu(lens)
        if layout.is_decode:
            tensor_cores = self.decode_uses_tensor_cores(layout.batch_size)
            wrappers = [decode[tensor_cores] for decode in self._decodes]
            for wrapper in wrappers:
                self._plan_decode(wrapper, lens, indices_gpu)
            return FlashInferMeta(wrappers[0], layout.batch_size, tuple(wrappers[1:]))
        qo_indptr_cpu = self._indptr_host(layout.extend_lens_cpu)
        for wrapper in self._prefills:
            self._plan_pages(self._stage(wrapper), lens, indices_gpu, qo_indptr_cpu, causal=True)
        return FlashInferMeta(self._prefills[0], layout.num_tokens, tuple(self._prefills[1:]))

    def wants_new_kv(self, meta: Any) -> bool:
        return isinstance(meta, Fp8PrefillMeta)

    def decode_uses_tensor_cores(self, batch_size: int) -> bool:
        """Which decode kernel a batch of this many requests runs (module docstring)."""
        if self.use_tensor_cores is not None:
            return self.use_tensor_cores
        return self._always_tensor_cores or batch_size >= TENSOR_CORE_MIN_BATCH

    def forward(
        self,
        q: torch.Tensor,
        layer_id: int,
        meta: FlashInferMeta | XqaMeta | Fp8PrefillMeta,
        new_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """q [T, q_heads, head_dim] (T == meta.num_rows) -> attention output of the same shape;
        ``new_kv`` is read by the FP8 prefill (wants_new_kv) and ignored otherwise."""
        if isinstance(meta, XqaMeta):
            assert self._xqa is not None
            return self._xqa.forward(q, layer_id, meta)
        if isinstance(meta, Fp8PrefillMeta):
            assert self._fp8_prefill is not None
            return self._fp8_prefill.forward(q, layer_id, meta, new_kv)
        out = torch.empty_like(q)
        wrapper = meta.wrapper_of(self._group_of_layer[layer_id])
        return wrapper.run(q, self._paged_kv[layer_id], out=out, **self.kv_scales(layer_id))

    def kv_scales(self, layer_id: int) -> dict[str, float]:
        """The run() arguments of an FP8 cache's scales for this layer (none for bf16/fp16):
        FlashInfer folds k_scale into the softmax scale and multiplies the output by v_scale."""
        if not self.kv.quantized:
            return {}
        return {"k_scale": self.kv.k_scale[layer_id], "v_scale": self.kv.v_scale[layer_id]}

    # ---- CUDA-graph decode ------------------------------------------------------------

    def init_cuda_graphs(self, batch_sizes: list[int], max_seq_len: int) -> None:
        """Allocate the fixed index buffers and one graph-mode decode wrapper per batch size and
        layer group (the groups' wrappers share the index buffers: they read the same pages)."""
        if self._graph_wrappers:
            raise RuntimeError("init_cuda_graphs was already called")
        sizes = sorted(set(batch_sizes))
        if not sizes or sizes[0] < 1:
            raise ValueError(f"batch sizes must be positive, got {batch_sizes}")
        max_bs = sizes[-1]
        self.graph_batch_sizes = sizes
        if self._xqa is not None:
            self._xqa.init_cuda_graphs(max_bs, max_seq_len)
            self._graph_wrappers = {bs: () for bs in sizes}
            return
        max_pages = max_bs * (-(-max_seq_len // self.page_size))
        self._graph_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self._graph_indices = torch.zeros(max_pages, dtype=torch.int32, device=self.device)
        self._graph_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        for bs in sizes:
            # NOTE: read back by _plan_decode: capture and every replay plan the same way; the
            # 1 MiB spare is the allocator's 16-byte alignment of each of FlashInfer's buffers.
            scratch = split_scratch_bytes(bs, self.num_qo_heads, self.num_kv_heads, self.head_dim)
            no_split = scratch + 2**20 > self._float_workspace.numel()
            wrappers = tuple(
                self._graph_decode_wrapper(bs, no_split, g) for g in range(self.groups.num_groups)
            )
            self._graph_wrappers[bs] = wrappers
            self._graph_metas[bs] = FlashInferMeta(wrappers[0], bs, wrappers[1:])

    def _graph_decode_wrapper(self, bs: int, no_split: bool, group: int) -> Any:
        wrapper = BatchDecodeWithPagedKVCacheWrapper(
            self._float_workspace,
            "HND",
            use_cuda_graph=True,
            use_tensor_cores=self.decode_uses_tensor_cores(bs),
            paged_kv_indptr_buffer=self._graph_indptr[: bs + 1],
            paged_kv_indices_buffer=self._graph_indices,
            paged_kv_last_page_len_buffer=self._graph_last_page_len[:bs],
            backend="fa2",
        )
        wrapper._radixq_no_split = no_split
        return self._adopt(wrapper, group)

    def capture_meta(self, bs: int) -> FlashInferMeta | XqaMeta:
        """Plan the bs wrapper on bs dummy one-token requests reading page 0."""
        if self._xqa is not None:
            self._graph_wrapper(bs)  # checks bs was set up
            return self._xqa.capture_meta(bs)
        ones_cpu = self._host(torch.ones(bs, dtype=torch.int32))
        lens = _Lengths(
            slots_gpu=None,
            seq_lens_cpu=ones_cpu,
            kv_indptr_cpu=self._host(torch.arange(bs + 1, dtype=torch.int32)),
            last_page_len_cpu=ones_cpu,
            total_pages=bs,
        )
        indices_gpu = torch.zeros(bs, dtype=torch.int32, device=self.device)
        for wrapper in self._graph_wrapper(bs):
            self._plan_decode(wrapper, lens, indices_gpu)
        return self._graph_metas[bs]

    def plan_for_replay(self, layout: BatchLayout, bs: int) -> FlashInferMeta | XqaMeta:
        """Re-plan the captured bs wrapper; padding rows read the first page of row 0."""
        if not layout.is_decode:
            raise ValueError("CUDA-graph replay is for decode batches (every extend_len == 1)")
        batch_size = layout.batch_size
        if batch_size > bs:
            raise ValueError(f"{batch_size} requests do not fit a graph of batch size {bs}")
        if self._xqa is not None:
            self._graph_wrapper(bs)
            return self._xqa.plan_for_replay(*self._slots_and_lens_gpu(layout), bs)
        slots_cpu, seq_lens_cpu = layout.slots_cpu, layout.seq_lens_cpu
        if batch_size < bs:
            pad = bs - batch_size
            slots_cpu = torch.cat([slots_cpu, slots_cpu[:1].expand(pad)])
            seq_lens_cpu = torch.cat([seq_lens_cpu, torch.ones(pad, dtype=torch.int32)])
        lens = self._lengths(slots_cpu, seq_lens_cpu)
        if lens.total_pages > self._graph_indices.numel():
            raise ValueError(
                f"{lens.total_pages} KV pages exceed the graph buffer of {self._graph_indices.numel()}"
            )
        indices_gpu = self._page_indices_gpu(lens)
        for wrapper in self._graph_wrapper(bs):
            self._plan_decode(wrapper, lens, indices_gpu)
        return self._graph_metas[bs]

    # ---- helpers ----------------------------------------------------------------------

    def _graph_wrapper(self, bs: int) -> tuple[Any, ...]:
        """The graph-mode FlashInfer wrappers of batch size bs, one a layer group (none on the
        XQA path)."""
        if bs not in self._graph_wrappers:
            raise ValueError(f"batch size {bs} was not set up by init_cuda_graphs {self.graph_batch_sizes}")
        return self._graph_wrappers[bs]

    def _adopt(self, wrapper: Any, group: int = 0) -> Any:
        # NOTE: every wrapper of a layer group plans into the group's one int workspace; this is
        # safe because one pass plans each group once and plans and runs are ordered on one
        # stream (module docstring).
        wrapper._int_workspace_buffer = self._int_workspaces[group]
        wrapper._radixq_group = group
        return wrapper

    def _stage(self, wrapper: Any) -> Any:
        """Point the wrapper at its group's next pinned staging buffer before it plans."""
        group = getattr(wrapper, "_radixq_group", 0)
        wrapper._pin_memory_int_workspace_buffer = self._host_staging[group][self._num_plans[group] % 2]
        self._num_plans[group] += 1
        return wrapper

    def _options(self, wrapper: Any) -> PlanOptions:
        return self.groups.options[getattr(wrapper, "_radixq_group", 0)]

    def _host(self, t: torch.Tensor) -> torch.Tensor:
        return t.pin_memory() if self._pin else t

    def _slots_and_lens_gpu(self, layout: BatchLayout) -> tuple[torch.Tensor, torch.Tensor, int]:
        """(slots, sequence lengths) on the device in one copy from a fresh pinned buffer (the
        host allocator keeps it until the copy is done), and the longest length."""
        batch_size = layout.batch_size
        seq_lens_cpu = layout.seq_lens_cpu
        packed_cpu = self._empty_host(2 * batch_size)
        packed_cpu[:batch_size] = layout.slots_cpu
        packed_cpu[batch_size:] = seq_lens_cpu
        packed_gpu = packed_cpu.to(self.device, non_blocking=True)
        return packed_gpu[:batch_size], packed_gpu[batch_size:], int(seq_lens_cpu.max())

    def _empty_host(self, n: int) -> torch.Tensor:
        return torch.empty(n, dtype=torch.int32, pin_memory=self._pin)

    def _indptr_host(self, counts_cpu: torch.Tensor) -> torch.Tensor:
        """[0, cumsum(counts)] in a (pinned) host buffer: FlashInfer's indptr arrays."""
        indptr = self._empty_host(int(counts_cpu.shape[0]) + 1)
        indptr[0] = 0
        torch.cumsum(counts_cpu, 0, out=indptr[1:])
        return indptr

    def _plan_decode(self, wrapper: Any, lens: _Lengths, indices_gpu: torch.Tensor) -> None:
        self._stage(wrapper)
        no_split = getattr(wrapper, "_radixq_no_split", False)
        if wrapper.use_tensor_cores and getattr(wrapper, "_cached_module", None) is not None:
            self._replan_tensor_cores(wrapper, lens, indices_gpu, no_split)
            return
        self._plan_pages(wrapper, lens, indices_gpu, disable_split_kv=no_split)

    def _plan_pages(
        self,
        wrapper: Any,
        lens: _Lengths,
        indices_gpu: torch.Tensor,
        qo_indptr_cpu: torch.Tensor | None = None,
        **kw: Any,
    ) -> None:
        """FlashInfer's own plan over these pages. Its prefill and decode plans take the same
        arguments, but for the prefill's leading query offsets (and its ``causal`` in ``kw``)."""
        queries = () if qo_indptr_cpu is None else (qo_indptr_cpu,)
        options = self._options(wrapper)
        wrapper.plan(
            *queries,
            lens.kv_indptr_cpu,
            indices_gpu,
            lens.last_page_len_cpu,
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            self.page_size,
            sm_scale=options.sm_scale,
            window_left=options.window_left,
            logits_soft_cap=options.logits_soft_cap,
            q_data_type=self.kv.model_dtype,
            kv_data_type=self.kv.dtype,  # FP8 pages with bf16 queries for an FP8 cache
            seq_lens=lens.seq_lens_cpu,
            non_blocking=True,
            **kw,
        )

    def _replan_tensor_cores(
        self, wrapper: Any, lens: _Lengths, indices_gpu: torch.Tensor, no_split: bool
    ) -> None:
        """Re-plan a tensor-core decode wrapper that has planned once (same dtypes and heads).

        What FlashInfer 0.6's plan does on this path, minus its per-element Python max over
        the lengths (~0.5 ms at 256 requests): the buffers' uploads, then the module's plan.
        """
        # NOTE: private attributes of flashinfer-python 0.6.x (pinned in pyproject's gpu extra);
        # tests/gpu/test_flashinfer_backend.py re-plans both wrapper kinds against a dense oracle.
        batch_size = int(lens.seq_lens_cpu.shape[0])
        qo_indptr_host = self._range_host.get(batch_size)
        if qo_indptr_host is None:
            qo_indptr_host = self._range_host[batch_size] = torch.arange(batch_size + 1, dtype=torch.int32)
        if wrapper.is_cuda_graph_enabled:
            if batch_size != wrapper._fixed_batch_size:
                raise ValueError(
                    f"graph wrapper of batch size {wrapper._fixed_batch_size} planned for {batch_size}"
                )
            wrapper._paged_kv_indptr_buf.copy_(lens.kv_indptr_cpu, non_blocking=True)
            wrapper._paged_kv_last_page_len_buf.copy_(lens.last_page_len_cpu, non_blocking=True)
            wrapper._paged_kv_indices_buf[: indices_gpu.numel()].copy_(indices_gpu, non_blocking=True)
        else:
            wrapper._paged_kv_indptr_buf = lens.kv_indptr_cpu.to(self.device, non_blocking=True)
            wrapper._paged_kv_indices_buf = indices_gpu
            wrapper._paged_kv_last_page_len_buf = lens.last_page_len_cpu.to(self.device, non_blocking=True)
            wrapper._qo_indptr_buf = qo_indptr_host.to(self.device, non_blocking=True)
        wrapper._batch_size = batch_size
        wrapper._max_kv_len = int(lens.seq_lens_cpu.max())
        wrapper._plan_info = wrapper._cached_module.plan(
            wrapper._float_workspace_buffer,
            wrapper._int_workspace_buffer,
            wrapper._pin_memory_int_workspace_buffer,
            qo_indptr_host,
            lens.kv_indptr_cpu,
            lens.seq_lens_cpu,
            batch_size,  # total query rows
            batch_size,
            self.num_qo_heads,
            self.num_kv_heads,
            self.page_size,
            wrapper.is_cuda_graph_enabled,
            self.head_dim,
            self.head_dim,
            False,  # causal
            self._options(wrapper).window_left,  # as the wrapper's first plan (same group)
            -1,  # fixed_split_size
            no_split,  # disable_split_kv
            0,  # num_colocated_ctas
        )

    def _lengths(self, slots_cpu: torch.Tensor, seq_lens_cpu: torch.Tensor) -> _Lengths:
        """Per-request page counts on the host; slots and page offsets uploaded in one copy."""
        batch_size = int(slots_cpu.shape[0])
        num_pages = (seq_lens_cpu + (self.page_size - 1)) // self.page_size
        # packed = [slots (B) | kv_indptr (B + 1)], so one copy carries both to the GPU.
        packed_cpu = self._empty_host(2 * batch_size + 1)
        packed_cpu[:batch_size] = slots_cpu
        kv_indptr_cpu = packed_cpu[batch_size:]
        kv_indptr_cpu[0] = 0
        torch.cumsum(num_pages, 0, out=kv_indptr_cpu[1:])
        packed_gpu = packed_cpu.to(self.device, non_blocking=True)
        last_page_len = seq_lens_cpu - (num_pages - 1) * self.page_size
        return _Lengths(
            slots_gpu=packed_gpu,
            seq_lens_cpu=self._host(seq_lens_cpu.to(torch.int32)),
            kv_indptr_cpu=kv_indptr_cpu,
            last_page_len_cpu=self._host(last_page_len.to(torch.int32)),
            total_pages=int(kv_indptr_cpu[-1]),
        )

    def _page_indices_gpu(self, lens: _Lengths) -> torch.Tensor:
        """FlashInfer page indices: page_table[slot, 0:seq_len:page_size] // page_size per request.

        Page p of the flattened list belongs to request r = row[p] and is that request's
        page j = p - kv_indptr[r]; its first location is page_table[slot[r], j * page_size].
        """
        assert lens.slots_gpu is not None
        batch_size = (lens.slots_gpu.numel() - 1) // 2
        slots_gpu = lens.slots_gpu[:batch_size].long()
        kv_indptr_gpu = lens.slots_gpu[batch_size:]
        num_pages_gpu = kv_indptr_gpu[1:] - kv_indptr_gpu[:-1]
        row = torch.repeat_interleave(num_pages_gpu, output_size=lens.total_pages).long()
        page_in_row = torch.arange(lens.total_pages, device=self.device) - kv_indptr_gpu[row]
        locations = self.page_table[slots_gpu[row], page_in_row * self.page_size]
        if self.page_size > 1:
            locations = torch.div(locations, self.page_size, rounding_mode="floor")
        return locations.to(torch.int32)


def create(
    *,
    kv: KVPool,
    page_table: torch.Tensor,
    model_config: Any,
    page_size: int,
    device: torch.device | str,
    **kw: Any,
) -> FlashInferBackend:
    """Registry factory (see worker.attention.registry); kw are FlashInferBackend's options."""
    return FlashInferBackend(kv, page_table, model_config, page_size, device, **kw)


@dataclass(frozen=True)
class _Lengths:
    """Host-side page bookkeeping of one batch (int32, pinned on CUDA)."""

    slots_gpu: torch.Tensor | None  # [slots | kv_indptr] on the device, None for dummy plans
    seq_lens_cpu: torch.Tensor  # [B]
    kv_indptr_cpu: torch.Tensor  # [B + 1] pages before each request
    last_page_len_cpu: torch.Tensor  # [B] tokens in each request's last page
    total_pages: int
