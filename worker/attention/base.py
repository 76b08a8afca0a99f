"""The attention backend contract shared by the engine, the models and every backend.

Layout of the KV cache (see worker.engine.kv_pool.KVPool): per layer one K and one V tensor
of shape [num_pages * page_size, num_kv_heads, head_dim]. A KV *location* is a row of those
tensors. ``page_table[slot, i]`` is the location of token i of the request in ``slot``
(indexed as if page_size were 1, whatever the real page size); pages are runs of
``page_size`` consecutive locations starting at a multiple of page_size, so the page of
location ``loc`` is ``loc // page_size``.

One forward pass over a batch of B requests and T = sum(extend_lens) new tokens:

    request i:  [ cached_lens[i] tokens already in KV | extend_lens[i] new tokens ]
                 positions 0 .. cached-1                 positions cached .. seq_len-1

Queries are the T new tokens, concatenated request by request. Each new token attends
causally to every earlier token of its own request, cached ones included.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class BatchLayout:
    """Host-side shape of one forward pass: what a backend needs to plan it.

    All tensors are int32 on the CPU (pinned where the device is CUDA), one entry a request.
    """

    slots_cpu: torch.Tensor  # rows of page_table
    cached_lens_cpu: torch.Tensor  # tokens whose KV is already in the pool
    extend_lens_cpu: torch.Tensor  # new tokens computed in this pass (>= 1)

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
    """

    @abstractmethod
    def plan(self, layout: BatchLayout) -> Any:
        """Build per-pass metadata (index tensors, FlashInfer plan) for ``layout``."""

    @abstractmethod
    def forward(self, q: torch.Tensor, layer_id: int, meta: Any) -> torch.Tensor:
        """Attend: q is [T, num_q_heads, head_dim]; returns [T, num_q_heads, head_dim]."""
