"""The values that cross the scheduler -> engine -> model boundary, one immutable each."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import torch

    from worker.attention.base import AttentionBackend, BatchLayout
    from worker.engine.logprobs import HostLogprobs
    from worker.kvcache.pool import KVPool


@dataclass(frozen=True)
class ForwardBatch:
    """What a model's forward reads: this pass's tokens and how to attend.

    ``input_ids``, ``positions`` and ``out_loc`` are device tensors of length T (the new
    tokens of every request, request by request). ``sample_idx`` [B] indexes the last new
    token of each request in those: only those rows get logits.
    """

    input_ids: torch.Tensor  # int64 [T]
    positions: torch.Tensor  # int64 [T]
    out_loc: torch.Tensor  # int64 [T] KV locations this pass writes
    sample_idx: torch.Tensor  # int64 [B]
    layout: BatchLayout
    backend: AttentionBackend
    attn_meta: Any
    kv: KVPool

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int) -> torch.Tensor:
        """Store this pass's k/v ([T, kv_heads, head_dim]) for the layer, then attend with q."""
        self.kv.store(layer_id, self.out_loc, k, v)
        return self.backend.forward(q, layer_id, self.attn_meta)


class ForwardOutput(NamedTuple):
    """What the engine returns for one pass: the host copy of its sampled tokens, and of their
    logprobs for the requests that asked (None when none did).

    The tokens themselves stay on the device in the engine's token_pool, where the next
    pass reads them; the host needs them only for stop checks and results."""

    next_tokens_cpu: torch.Tensor  # int32 [B] (valid once copy_done is done)
    copy_done: Any  # torch.cuda.Event on CUDA, None on CPU (copy already complete)
    logprobs_cpu: HostLogprobs | None = None  # valid once copy_done is done
