"""Prefill over FP8 KV pages through FlashInfer at the model dtype's rate (FlashInferBackend's
prefill when its pool is FP8; decode stays XQA's or FA2's).

FlashInfer 0.6's FA2 prefill template, with bf16 queries over FP8 pages, dequantizes every KV
tile in its inner loop and is compute-bound there (36% of the GPU time of an 8B FP8 prefill
pass). This path reads FP8 pages only for what was cached before the pass::

    ragged:  every request's new rows against its own new keys and values as the model
             computed them (``new_kv``, model dtype), BatchPrefillWithRaggedKVCacheWrapper,
             causal, with the log-sum-exp
    prefix:  the rows of the requests with cached_len > 0 (worker.attention.prefix_rows)
             against keys [0, cached_len) of their FP8 pages, the paged wrapper, not causal
             (every prefix key precedes every new row), with the log-sum-exp
    merge:   flashinfer.merge_state_in_place of the two on those rows: the softmax over the
             union of both key sets, exactly

Requests without a prefix run the ragged part alone; a pass with none plans no paged part.

Layer groups (worker.attention.plan_groups) keep their options in both parts; a scale and a
soft-cap act on each logit, so the merge stays exact. A sliding window does not split this way:
FlashInfer places the rows it is given at the end of the KV it is given (its window keeps key k
for row i when ``k >= kv_len - qo_len + i - window_left``, causal or not), so over the prefix
alone a window would reach qo_len keys too far back. A windowed group's prefix part therefore
attends those requests' rows *whole*: causal over pages [0, seq_len) (the prefix and this pass's
keys as the pool holds them: the paged path) and overwrites the ragged rows; its requests without
a prefix still run ragged. tests/gpu/test_flashinfer_fp8_prefill.py checks FlashInfer's window
offset, and both kinds of group against a float32 oracle.

Numerics: the pass's own keys and values enter at the model dtype, as an unquantized cache's
would (decode later reads them from the FP8 pages): closer to exact attention than reading
them back rounded to e4m3.

Workspaces: a group plans its ragged wrapper into the group's int workspace and staging buffers
(FlashInferBackend's; its paged prefill and decode wrappers do not plan in a pass that comes
here) and its prefix wrapper into a workspace of its own, since both plans of a pass precede
both runs. The float workspace is shared: the runs are ordered on one stream. Eager passes only
(prefill is never graph-captured).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from flashinfer import (
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    merge_state_in_place,
)

from worker.attention.prefix_rows import PrefixRows, prefix_rows

if TYPE_CHECKING:
    from worker.attention.flashinfer import FlashInferBackend
    from worker.forward import BatchLayout

# How FlashInferBackend prefills over FP8 pages: "split" (this module), "paged" (the FA2 paged
# wrapper over whole rows; benchmarks/prefill_attention.py compares the two).
FP8_PREFILL_PATHS = ("split", "paged")


@dataclass(frozen=True)
class Fp8PrefillMeta:
    """One planned pass: per layer group its ragged wrapper and (when some request has a
    prefix) its prefix wrapper, and the rows the prefix part covers."""

    num_rows: int  # query rows (tokens) of the pass
    ragged: tuple[Any, ...]  # a planned ragged wrapper a group
    prefix: tuple[Any, ...]  # a planned paged wrapper a group; () when no request has a prefix
    whole: tuple[bool, ...]  # per group: its prefix part attends whole rows (a window)
    rows: PrefixRows | None
    rows_gpu: torch.Tensor | None  # int64 rows to gather when rows.span is None


class Fp8Prefill:
    """The split prefill of one FlashInferBackend over an FP8 pool (module docstring)."""

    def __init__(
        self, backend: FlashInferBackend, prefill_backend: str = "fa2", ragged_backend: str | None = None
    ) -> None:
        """``ragged_backend``: FlashInfer's kernel family for the ragged part ("fa2", or "fa3" on
        Hopper: bf16 K/V, what FA3 reads at its rate); None takes ``prefill_backend``, which the
        paged prefix part (FP8 pages) always uses."""
        self.backend = backend
        num_groups = backend.groups.num_groups
        workspace = backend._float_workspace
        ragged = ragged_backend or prefill_backend
        self._ragged = [
            backend._adopt(BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD", backend=ragged), g)
            for g in range(num_groups)
        ]
        self._prefix = [
            backend._adopt(BatchPrefillWithPagedKVCacheWrapper(workspace, "HND", backend=prefill_backend), g)
            for g in range(num_groups)
        ]
        int_bytes = backend._int_workspaces[0].numel()
        for wrapper in self._prefix:  # NOTE: its own, not the group's: both plan in one pass
            wrapper._int_workspace_buffer = torch.zeros(int_bytes, dtype=torch.uint8, device=backend.device)
        self._prefix_staging = [
            [torch.zeros(int_bytes, dtype=torch.uint8, pin_memory=backend._pin) for _ in range(2)]
            for _ in range(num_groups)
        ]
        self._num_prefix_plans = 0
        self._whole = tuple(options.window_left >= 0 for options in backend.groups.options)

    def plan(self, layout: BatchLayout) -> Fp8PrefillMeta:
        """Plan every group's ragged part, and its prefix part over the requests with one."""
        b = self.backend
        qo_indptr_cpu = b._indptr_host(layout.extend_lens_cpu)
        for wrapper in self._ragged:
            self._plan_ragged(b._stage(wrapper), qo_indptr_cpu)
        ragged = tuple(self._ragged)
        rows = prefix_rows(layout)
        if rows is None:
            return Fp8PrefillMeta(layout.num_tokens, ragged, (), self._whole, None, None)
        rows_indptr_cpu = b._indptr_host(rows.extend_lens_cpu)
        pages: dict[
            bool, tuple[Any, torch.Tensor]
        ] = {}  # whole rows or prefix only -> (lengths, page indices)
        staging = self._num_prefix_plans % 2
        self._num_prefix_plans += 1
        for group, wrapper in enumerate(self._prefix):
            whole = self._whole[group]
            if whole not in pages:
                lens = b._lengths(rows.slots_cpu, rows.seq_lens_cpu if whole else rows.cached_lens_cpu)
                pages[whole] = (lens, b._page_indices_gpu(lens))
            wrapper._pin_memory_int_workspace_buffer = self._prefix_staging[group][staging]
            lens, indices_gpu = pages[whole]
            b._plan_pages(wrapper, lens, indices_gpu, rows_indptr_cpu, causal=whole)
        rows_gpu = None
        if rows.rows_cpu is not None:
            rows_gpu = b._host(rows.rows_cpu).to(b.device, non_blocking=True)
        return Fp8PrefillMeta(layout.num_tokens, ragged, tuple(self._prefix), self._whole, rows, rows_gpu)

    def _plan_ragged(self, wrapper: Any, qo_indptr_cpu: torch.Tensor) -> None:
        """Causal over each request's own new tokens: its queries and keys are the same rows."""
        b = self.backend
        options = b._options(wrapper)
        wrapper.plan(
            qo_indptr_cpu,
            qo_indptr_cpu,
            b.num_qo_heads,
            b.num_kv_heads,
            b.head_dim,
            causal=True,
            window_left=options.window_left,
            logits_soft_cap=options.logits_soft_cap,
            sm_scale=options.sm_scale,
            q_data_type=b.kv.model_dtype,
            kv_data_type=b.kv.model_dtype,
            non_blocking=True,
        )

    def forward(
        self,
        q: torch.Tensor,
        layer_id: int,
        meta: Fp8PrefillMeta,
        new_kv: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> torch.Tensor:
        """q [T, q_heads, head_dim]; new_kv: this pass's k and v, [T, kv_heads, head_dim] each in
        the model dtype (AttentionBackend.forward) -> the attention output, [T, q_heads, head_dim]."""
        if new_kv is None:
            raise ValueError(
                "FlashInfer's prefill over FP8 pages attends the pass's own keys and values as "
                "computed: pass new_kv (AttentionBackend.wants_new_kv)"
            )
        k, v = new_kv
        b = self.backend
        group = b._group_of_layer[layer_id]
        out = torch.empty_like(q)
        rows = meta.rows
        if rows is None:
            return meta.ragged[group].run(q, k, v, out=out)
        span, rows_gpu = rows.span, meta.rows_gpu
        if span is not None:
            q_rows = q[span[0] : span[1]]
        else:
            assert rows_gpu is not None, "rows to merge: a span or a gather"
            q_rows = q.index_select(0, rows_gpu)
        out_rows, lse_rows = meta.prefix[group].run(
            q_rows,
            b._paged_kv[layer_id],
            out=torch.empty_like(q_rows),
            return_lse=True,
            **b.kv_scales(layer_id),
        )
        if meta.whole[group]:
            meta.ragged[group].run(q, k, v, out=out)
        else:
            _, lse = meta.ragged[group].run(q, k, v, out=out, return_lse=True)
            if span is not None:
                merge_state_in_place(out[span[0] : span[1]], lse[span[0] : span[1]], out_rows, lse_rows)
                return out
            assert rows_gpu is not None
            merge_state_in_place(
                out_rows, lse_rows, out.index_select(0, rows_gpu), lse.index_select(0, rows_gpu)
            )
        if span is not None:
            out[span[0] : span[1]].copy_(out_rows)
            return out
        assert rows_gpu is not None
        return out.index_copy_(0, rows_gpu, out_rows)
