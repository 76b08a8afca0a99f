"""The attention backend contract shared by the engine, the models and every backend.

Layout of the KV cache (see worker.kvcache.pool.KVPool): per layer one K and one V tensor
of pages, [num_pages, num_kv_heads, page_size, head_dim] (FlashInfer's "HND" layout). A KV
*location* ``loc`` names one token's slot in the pool: token ``loc % page_size`` of page
``loc // page_size``. ``page_table[slot, i]`` is the location of token i of the request in
``slot``; a page's tokens are consecutive locations, so a request's row holds runs of
``page_size`` consecutive locations, each starting at a multiple of page_size.

One forward pass over a batch of B requests and T = sum(extend_lens) new tokens:

    request i:  [ cached_lens[i] tokens already in KV | extend_lens[i] new tokens ]
                 positions 0 .. cached-1                 positions cached .. seq_len-1

Queries are the T new tokens, concatenated request by request. Each new token attends
causally to every earlier token of its own request, cached ones included.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class PrefixGroups:
    """Requests of a pass that share the KV pages of a prefix (host-side, int32 [B] each).

    Request i is in group ``group_ids_cpu[i]`` (-1: in none). Every member of a group holds
    the same ``prefix_lens_cpu[i]`` tokens (whole pages, the same page locations in their
    page_table rows; 0 outside groups), all of them already cached: prefix_len <= cached_len.
    A group has at least two members. Backends may attend to a group's prefix once for all
    its queries (cascade attention) or ignore this and read each row whole; both are exact.
    Built by the scheduler (worker.scheduler.groups) when EngineConfig.cascade_attention is on.
    """

    group_ids_cpu: torch.Tensor
    prefix_lens_cpu: torch.Tensor

    @property
    def num_groups(self) -> int:
        return int(self.group_ids_cpu.max()) + 1 if self.group_ids_cpu.numel() else 0

    def members(self) -> list[list[int]]:
        """Per group, its requests' indices in the batch, ascending."""
        out: list[list[int]] = [[] for _ in range(self.num_groups)]
        for i, g in enumerate(self.group_ids_cpu.tolist()):
            if g >= 0:
                out[g].append(i)
        return out


@dataclass(frozen=True)
class BatchLayout:
    """Host-side shape of one forward pass: what a backend needs to plan it.

    All tensors are int32 on the CPU (pinned where the device is CUDA), one entry a request.
    """

    slots_cpu: torch.Tensor  # rows of page_table
    cached_lens_cpu: torch.Tensor  # tokens whose KV is already in the pool
    extend_lens_cpu: torch.Tensor  # new tokens computed in this pass (>= 1)
    prefix_groups: PrefixGroups | None = None  # shared-prefix groups, for cascade attention

    @property
    def batch_size(self) -> int:
        return int(self.slots_cpu.shape[0])

    @property
    def seq_lens_cpu(self) -> torch.Tensor:
        return self.cached_lens_cpu + self.extend_lens_cpu

    @property
    def num_tokens(self) -> int:
        return int(self.extend_lens_cpu.sum())

    @property
    def is_decode(self) -> bool:
        """True when every request extends by exactly one token."""
        return bool((self.extend_lens_cpu == 1).all())


class AttentionBackend(ABC):
    """Paged attention over the KV pool.

    Contract: ``plan`` is called once per forward pass, before the model runs, and returns
    opaque metadata; ``forward`` is then called once per layer with that metadata. The
    caller has already stored this pass's K/V at their ``out_loc`` locations in the pool
    for that layer (ForwardBatch.attention does it), so ``forward`` only reads the pool.

    CUDA graphs (worker.engine.graph.GraphRunner) are used only when ``supports_cuda_graphs``
    is true; a backend that sets it implements the three graph hooks below, which the base
    class leaves unsupported. Their order: ``init_cuda_graphs`` once; per batch size,
    ``capture_meta`` and then the captured passes (which must read their metadata only
    from fixed device buffers); per decode step, ``plan_for_replay`` and then the replay.
    """

    supports_cuda_graphs: ClassVar[bool] = False
    # Whether ``plan`` uses ``layout.prefix_groups`` (cascade attention); others read each
    # request's row whole, which is just as exact.
    supports_cascade: ClassVar[bool] = False

    @abstractmethod
    def plan(self, layout: BatchLayout) -> Any:
        """Build per-pass metadata (index tensors, FlashInfer plan) for ``layout``."""

    @abstractmethod
    def forward(self, q: torch.Tensor, layer_id: int, meta: Any) -> torch.Tensor:
        """Attend: q is [T, num_q_heads, head_dim]; returns [T, num_q_heads, head_dim]."""

    def init_cuda_graphs(self, batch_sizes: list[int], max_seq_len: int) -> None:
        """Allocate fixed-address metadata for decode graphs of each of ``batch_sizes``.

        Called once, before any capture. ``max_seq_len`` bounds every request's length."""
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graphs")

    def capture_meta(self, batch_size: int) -> Any:
        """Metadata of a decode pass over ``batch_size`` dummy one-token requests, to warm up
        and capture with; it lives in the buffers that ``plan_for_replay`` rewrites."""
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graphs")

    def plan_for_replay(self, layout: BatchLayout, batch_size: int) -> Any:
        """Rewrite, in place, the metadata captured for ``batch_size`` so that a replay
        attends for ``layout``: a decode layout (``is_decode``) of at most ``batch_size``
        requests. Rows past ``layout.batch_size`` are padding whose outputs are garbage.

        Runs on the stream that then replays, after the previous pass was enqueued there.
        Returns the same metadata object that ``capture_meta(batch_size)`` returned."""
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graphs")
