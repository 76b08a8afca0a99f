"""Cascade (shared-prefix) attention through FlashInfer (EngineConfig.cascade_attention).

The same two-part split as worker.attention.torch_cascade (its docstring has the math), with
FlashInfer's kernels, for a layout that carries PrefixGroups::

    suffix pass:  every request, its pages past its group's prefix (all pages when in no
                  group): the decode wrapper (decode layouts) or the causal prefill wrapper,
                  in batch order, returning output and log-sum-exp
    prefix pass:  a non-causal prefill wrapper over the groups: group g's queries are the
                  grouped requests' rows gathered group by group (``rows_gpu``), its KV the
                  prefix pages of one member's page_table row (all members hold the same ones)
    merge:        flashinfer.merge_state of the two states on the grouped rows, scattered
                  back into the suffix output

A layout without groups runs the plain FlashInferBackend path unchanged.

Eager passes only. CUDA-graph replay is NOT covered: ``plan_for_replay`` is the plain
backend's (it ignores groups), and the scheduler (worker.scheduler.prepare) never gives a
graph batch size to a pass that has groups, so such decode steps run eagerly. Whether the
saved KV reads beat the graphs' saved launches is what benchmarks/prefix_cache.py's
``--cascade both`` measures.

Workspaces: both passes are planned before either runs, so the prefix wrapper has its own
int workspace and pinned staging buffers (the plain wrappers share theirs, see
worker.attention.flashinfer); the float workspace is shared, as FlashInfer's own
MultiLevelCascadeAttentionWrapper shares it between levels: the runs are ordered on one
stream. The LSEs that FlashInfer's run(return_lse=True) returns are in the convention its
merge_state expects (its cascade wrappers merge decode and prefill states the same way).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from flashinfer import BatchPrefillWithPagedKVCacheWrapper, merge_state

from worker.attention.flashinfer import (
    _INT_WORKSPACE_BYTES,
    FlashInferBackend,
    FlashInferMeta,
    _Lengths,
)
from worker.forward import BatchLayout, PrefixGroups


@dataclass(frozen=True)
class CascadeMeta:
    """One planned cascade pass."""

    suffix: FlashInferMeta  # planned over every request's own pages
    prefix_wrapper: Any  # planned over the groups' prefix pages
    rows_gpu: torch.Tensor  # int64 query rows of the grouped requests, group by group


class FlashInferCascadeBackend(FlashInferBackend):
    """FlashInferBackend that attends to each group's shared prefix once (module docstring)."""

    supports_cascade = True

    def __init__(self, *args: Any, prefill_backend: str = "fa2", **kw: Any) -> None:
        super().__init__(*args, prefill_backend=prefill_backend, **kw)
        self._prefix_wrapper = BatchPrefillWithPagedKVCacheWrapper(
            self._float_workspace, "HND", backend=prefill_backend
        )
        self._prefix_staging = [
            torch.zeros(_INT_WORKSPACE_BYTES, dtype=torch.uint8, pin_memory=self._pin) for _ in range(2)
        ]
        self._num_prefix_plans = 0

    def plan(self, layout: BatchLayout) -> Any:
        groups = layout.prefix_groups
        if groups is None:
            return super().plan(layout)
        prefix_lens_cpu = groups.prefix_lens_cpu.to(torch.int32)
        assert bool((prefix_lens_cpu <= layout.cached_lens_cpu).all()), "a shared prefix past cached_len"
        assert bool((prefix_lens_cpu % self.page_size == 0).all()), "a shared prefix of part of a page"
        lens, indices_gpu = self._spans(layout.slots_cpu, prefix_lens_cpu, layout.seq_lens_cpu)
        if layout.is_decode:
            wrapper = self._decode[self.decode_uses_tensor_cores(layout.batch_size)]
            self._plan_decode(wrapper, lens, indices_gpu)
            suffix = FlashInferMeta(wrapper, layout.batch_size)
        else:
            qo_indptr_cpu = self._indptr_host(layout.extend_lens_cpu)
            self._plan_pages(self._stage(self._prefill), lens, indices_gpu, qo_indptr_cpu, causal=True)
            suffix = FlashInferMeta(self._prefill, layout.num_tokens)
        rows_gpu = self._plan_prefixes(layout, groups)
        return CascadeMeta(suffix, self._prefix_wrapper, rows_gpu)

    def forward(
        self,
        q: torch.Tensor,
        layer_id: int,
        meta: Any,
        new_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """q [T, q_heads, head_dim] -> the attention output, exact for every kind of meta (a
        pass without groups runs FlashInferBackend's own, its FP8 prefill included)."""
        if not isinstance(meta, CascadeMeta):
            return super().forward(q, layer_id, meta, new_kv)
        paged_kv, scales = self._paged_kv[layer_id], self.kv_scales(layer_id)
        out, lse = meta.suffix.wrapper.run(q, paged_kv, out=torch.empty_like(q), return_lse=True, **scales)
        rows = meta.rows_gpu
        out_prefix, lse_prefix = meta.prefix_wrapper.run(
            q.index_select(0, rows), paged_kv, return_lse=True, **scales
        )
        merged, _ = merge_state(out_prefix, lse_prefix, out.index_select(0, rows), lse.index_select(0, rows))
        return out.index_copy_(0, rows, merged)

    # ---- helpers ----------------------------------------------------------------------

    def _plan_prefixes(self, layout: BatchLayout, groups: PrefixGroups) -> torch.Tensor:
        """Plan the prefix wrapper over the groups; the grouped query rows on the device."""
        members = groups.members()
        q_starts = [0, *torch.cumsum(layout.extend_lens_cpu, 0).tolist()]
        rows: list[int] = []
        group_rows: list[int] = []
        for group in members:
            start = len(rows)
            for i in group:
                rows.extend(range(q_starts[i], q_starts[i + 1]))
            group_rows.append(len(rows) - start)
        first = [group[0] for group in members]
        slots_cpu = layout.slots_cpu[first]
        lens, indices_gpu = self._spans(
            slots_cpu, torch.zeros(len(first), dtype=torch.int32), groups.prefix_lens_cpu[first]
        )
        qo_indptr_cpu = self._indptr_host(torch.tensor(group_rows, dtype=torch.int32))
        wrapper = self._prefix_wrapper
        wrapper._pin_memory_int_workspace_buffer = self._prefix_staging[self._num_prefix_plans % 2]
        self._num_prefix_plans += 1
        self._plan_pages(wrapper, lens, indices_gpu, qo_indptr_cpu, causal=False)
        rows_cpu = torch.tensor(rows, dtype=torch.int64)
        return rows_cpu.pin_memory().to(self.device, non_blocking=True) if self._pin else rows_cpu

    def _spans(
        self, slots_cpu: torch.Tensor, starts_cpu: torch.Tensor, ends_cpu: torch.Tensor
    ) -> tuple[_Lengths, torch.Tensor]:
        """Pages holding tokens [start, end) of each slot's row (start a multiple of the page
        size): host bookkeeping, and the FlashInfer page indices gathered on the device from
        page_table[slot, (first_page + j) * page_size] // page_size."""
        n, ps = int(slots_cpu.shape[0]), self.page_size
        first_page = starts_cpu.to(torch.int32) // ps
        num_pages = (ends_cpu.to(torch.int32) + (ps - 1)) // ps - first_page
        kv_lens = (ends_cpu - starts_cpu).to(torch.int32)
        # packed = [slots (n) | first pages (n) | kv_indptr (n + 1)]: one copy to the device
        packed_cpu = self._empty_host(3 * n + 1)
        packed_cpu[:n] = slots_cpu
        packed_cpu[n : 2 * n] = first_page
        kv_indptr_cpu = packed_cpu[2 * n :]
        kv_indptr_cpu[0] = 0
        torch.cumsum(num_pages, 0, out=kv_indptr_cpu[1:])
        total_pages = int(kv_indptr_cpu[-1])
        packed_gpu = packed_cpu.to(self.device, non_blocking=True)
        lens = _Lengths(
            slots_gpu=None,
            seq_lens_cpu=self._host(kv_lens),
            kv_indptr_cpu=kv_indptr_cpu,
            last_page_len_cpu=self._host((kv_lens - (num_pages - 1) * ps).to(torch.int32)),
            total_pages=total_pages,
        )
        slots_gpu = packed_gpu[:n].long()
        first_gpu = packed_gpu[n : 2 * n].long()
        indptr_gpu = packed_gpu[2 * n :].long()
        row = torch.repeat_interleave(indptr_gpu[1:] - indptr_gpu[:-1], output_size=total_pages)
        page_in_row = torch.arange(total_pages, device=self.device) - indptr_gpu[row] + first_gpu[row]
        locations = self.page_table[slots_gpu[row], page_in_row * ps]
        if ps > 1:
            locations = torch.div(locations, ps, rounding_mode="floor")
        return lens, locations.to(torch.int32)
