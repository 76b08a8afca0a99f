"""FlashInfer's XQA decode kernel (TensorRT-LLM's) over the pool's pages, for worker.attention.flashinfer.

On sm90 with e4m3 pages XQA runs its Hopper FP8 kernel (TMA loads of the pages, FP8 tensor-core
MMAs, queries and probabilities rounded to e4m3 by the kernel), which reads an FP8 cache at
bandwidth where FlashInfer's FA2 templates convert every tile to bf16 first
(docs/performance.md has the measurements that chose it). It takes a dense block table
[batch, pages per request] of page indices and the sequence lengths instead of indptr/indices.

    XqaDecode(kv, page_table, ...)                 buffers for every decode batch
    meta = xqa.plan(slots_gpu, lens_gpu, max_len)  eager: a fresh [B, pages] table
    meta = xqa.capture_meta(bs)                    graph buffers, fixed width
    meta = xqa.plan_for_replay(slots_gpu, lens_gpu, max_len, bs)
    out = xqa.forward(q, layer, meta)

``slots_gpu`` and ``lens_gpu`` are the batch's slots and sequence lengths already on the device
(int32, uploaded by the caller from a fresh pinned buffer); ``max_len`` is the longest length,
known on the host.

Scales: FlashInfer folds the layer's k_scale into bmm1 (with the softmax scale) and its v_scale
into bmm2; XQA turns them into its query and KV scales itself.

Per-layer options (worker.attention.plan_groups): XQA takes the sliding window and the softmax
scale at run time (``window_left``, ``bmm1_scale``), so one meta serves every layer; a window
builds its own module (``use_sliding_window``), whose kernel skips the keys before the window of
the request's last token (TensorRT-LLM's mha_sm90.cu, linear block tables). It has no logit
soft-cap: ``xqa_refusal`` names it, and the backend decodes such a model through FA2.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from worker.attention.plan_groups import LayerGroups
from worker.kvcache.pool import KVPool

PAGE_SIZES = (16, 32, 64, 128)
_SEMAPHORE_BYTES = 8 * 1024 * 1024  # XQA reserves the workspace's first 8 MiB for semaphores
_SCRATCH_BYTES = 56 * 1024 * 1024  # multi-block partial results (a few MiB at most here)


def xqa_supported(kv: KVPool, device: torch.device) -> bool:
    """Whether XQA can read this pool: CUDA sm90 (Hopper), a page size it takes, head_dim <= 256."""
    if device.type != "cuda" or kv.page_size not in PAGE_SIZES or kv.head_dim % 16 or kv.head_dim > 256:
        return False
    return torch.cuda.get_device_capability(device)[0] == 9


def xqa_refusal(groups: LayerGroups) -> str | None:
    """What of these layers' options XQA cannot run (it has no logit soft-cap), or None."""
    capped = [layer for layer, g in enumerate(groups.group_of_layer) if groups.options[g].logits_soft_cap > 0]
    if not capped:
        return None
    return f"XQA has no attention-logit soft-cap ({len(capped)} of {len(groups.group_of_layer)} layers cap)"


@dataclass(frozen=True)
class XqaMeta:
    """One planned decode pass: block table [rows, width] and lengths [rows] on the device."""

    block_tables: torch.Tensor  # int32, contiguous rows (XQA reads width as the row stride)
    seq_lens: torch.Tensor  # int32 [rows] (XQA reads them as uint32)
    num_rows: int


class XqaDecode:
    """The XQA decode path of one FlashInfer backend: its workspace and graph buffers."""

    def __init__(self, kv: KVPool, page_table: torch.Tensor, num_qo_heads: int, groups: LayerGroups) -> None:
        from flashinfer.decode import xqa_batch_decode_with_kv_cache

        if (refusal := xqa_refusal(groups)) is not None:
            raise ValueError(refusal)
        self._run = xqa_batch_decode_with_kv_cache
        self.kv = kv
        self.page_table = page_table
        self.page_size = kv.page_size
        self.device = page_table.device
        self.num_qo_heads = num_qo_heads
        default_scale = kv.head_dim**-0.5
        # per layer: (window_left, softmax scale)
        self._layer_options = [
            (o.window_left, default_scale if o.sm_scale is None else o.sm_scale)
            for o in (groups.options[g] for g in groups.group_of_layer)
        ]
        self._paged_kv = [(kv.k_buffer(layer), kv.v_buffer(layer)) for layer in range(kv.num_layers)]
        # NOTE: zeroed once; XQA leaves its semaphores as it found them after every launch.
        self._workspace = torch.zeros(
            _SEMAPHORE_BYTES + _SCRATCH_BYTES, dtype=torch.uint8, device=self.device
        )
        self._columns: torch.Tensor | None = None  # arange(width) * page_size, for the gather
        self._graph_tables: torch.Tensor | None = None
        self._graph_lens: torch.Tensor | None = None

    def init_cuda_graphs(self, max_bs: int, max_seq_len: int) -> None:
        width = -(-max_seq_len // self.page_size)
        self._graph_tables = torch.zeros((max_bs, width), dtype=torch.int32, device=self.device)
        self._graph_lens = torch.ones(max_bs, dtype=torch.int32, device=self.device)

    def plan(self, slots_gpu: torch.Tensor, lens_gpu: torch.Tensor, max_len: int) -> XqaMeta:
        """Eager decode of len(slots_gpu) requests: a block table as wide as the longest."""
        width = -(-max_len // self.page_size)
        return XqaMeta(self._gather(slots_gpu, width), lens_gpu, int(slots_gpu.shape[0]))

    def capture_meta(self, bs: int) -> XqaMeta:
        tables, lens = self._graph_buffers()
        tables[:bs].zero_()  # page 0: any page in the pool will do for a dummy pass
        lens[:bs].fill_(1)
        return XqaMeta(tables[:bs], lens[:bs], bs)

    def plan_for_replay(
        self, slots_gpu: torch.Tensor, lens_gpu: torch.Tensor, max_len: int, bs: int
    ) -> XqaMeta:
        """Rewrite the graph buffers for these requests; rows past them (padding) read one
        token of whatever page their stale row names (a page of the pool), output ignored."""
        tables, lens = self._graph_buffers()
        batch_size = int(slots_gpu.shape[0])
        width = -(-max_len // self.page_size)
        if width > tables.shape[1]:
            raise ValueError(f"{width} pages per request exceed the graph table's {tables.shape[1]}")
        tables[:batch_size, :width] = self._gather(slots_gpu, width)
        lens[:batch_size].copy_(lens_gpu)
        if batch_size < bs:
            lens[batch_size:bs].fill_(1)
        return XqaMeta(tables[:bs], lens[:bs], bs)

    def forward(self, q: torch.Tensor, layer_id: int, meta: XqaMeta) -> torch.Tensor:
        out = torch.empty_like(q)
        k_scale, v_scale = self.kv.k_scale[layer_id], self.kv.v_scale[layer_id]
        window_left, sm_scale = self._layer_options[layer_id]
        width = meta.block_tables.shape[1]
        return self._run(
            q, self._paged_kv[layer_id], self._workspace, meta.block_tables, meta.seq_lens,
            width * self.page_size, bmm1_scale=k_scale * sm_scale, bmm2_scale=v_scale,
            window_left=window_left, out=out, kv_layout="HND", enable_pdl=False,
        )  # fmt: skip

    def _gather(self, slots_gpu: torch.Tensor, width: int) -> torch.Tensor:
        """[B, width] page indices: page_table[slot, j * page_size] // page_size."""
        if self._columns is None or self._columns.numel() < width:
            columns = max(width, 64)
            self._columns = torch.arange(columns, device=self.device, dtype=torch.int64) * self.page_size
        rows = slots_gpu.long()[:, None]
        locations = self.page_table[rows, self._columns[None, :width]]
        return torch.div(locations, self.page_size, rounding_mode="floor").to(torch.int32)

    def _graph_buffers(self) -> tuple[Any, Any]:
        if self._graph_tables is None or self._graph_lens is None:
            raise RuntimeError("init_cuda_graphs was not called")
        return self._graph_tables, self._graph_lens
