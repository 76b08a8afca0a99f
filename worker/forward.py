"""The values that cross the scheduler -> engine -> model boundary, one immutable each.

The scheduler builds a ForwardInput (its BatchLayout says what to attend to),
the engine turns it into the ForwardBatch a model reads, and returns a ForwardOutput."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

if TYPE_CHECKING:
    import torch

    from worker.attention.base import AttentionBackend
    from worker.engine.logprobs import HostLogprobs
    from worker.engine.sampler import SamplingTensors
    from worker.kvcache.pool import KVPool


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


@dataclass(frozen=True)
class ForwardInput:
    """Everything one pass needs, already on the device except ``layout``.

    Request i's new tokens are T entries laid out request by request. The engine gathers
    input ids as ``token_pool[load_slots, positions]`` and writes request i's sampled token to
    ``token_pool[write_slots[i], write_pos[i]]`` (the dummy slot when it produces none).
    """

    layout: BatchLayout
    load_slots: torch.Tensor  # int64 [T]
    positions: torch.Tensor  # int64 [T]
    out_loc: torch.Tensor  # int64 [T] KV locations written this pass
    sample_idx: torch.Tensor  # int64 [B] last new token of each request
    write_slots: torch.Tensor  # int64 [B]
    write_pos: torch.Tensor  # int64 [B]
    sampling: SamplingTensors
    # A decode pass replayed by the CUDA graph of this batch size: load_slots, positions and
    # out_loc are then padded to graph_bs entries (dummy slot, position 0, the dummy KV
    # location). Attention is planned by the engine, on its own stream.
    graph_bs: int | None = None

    @property
    def batch_size(self) -> int:
        return self.layout.batch_size


class Lanes(Protocol):
    """Where a half of a split decode pass runs its kernels (worker.engine.split.Lanes):
    ``on("attention")`` or ``on("gemm")`` holds a block on that stream, after the half's last
    kernel; ``join`` makes the current stream wait for the half."""

    def on(self, kind: str) -> AbstractContextManager[None]: ...

    def join(self) -> None: ...


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
    # a half of a split decode pass (worker.engine.split): its attention runs on the lanes'
    # attention stream, the rest of its layers on their other stream; None: one stream
    lanes: Lanes | None = None

    @property
    def wants_new_kv(self) -> bool:
        """Whether attention takes this pass's K/V as computed, besides the pool
        (AttentionBackend.wants_new_kv): the model then hands them to ``backend.forward``."""
        return self.backend.wants_new_kv(self.attn_meta)

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int) -> torch.Tensor:
        """Store this pass's k/v ([T, kv_heads, head_dim]) for the layer, then attend with q (and
        k/v themselves when the backend wants them)."""
        self.kv.store(layer_id, self.out_loc, k, v)
        return self.attend(q, layer_id, (k, v) if self.wants_new_kv else None)

    def attend(
        self, q: torch.Tensor, layer_id: int, new_kv: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> torch.Tensor:
        """The backend's attention for the layer, this pass's K/V already in the pool (on the
        attention stream of a split pass's half)."""
        if self.lanes is None:
            return self.backend.forward(q, layer_id, self.attn_meta, new_kv)
        with self.lanes.on("attention"):
            return self.backend.forward(q, layer_id, self.attn_meta, new_kv)


class ForwardOutput(NamedTuple):
    """What the engine returns for one pass: the host copy of its sampled tokens, and of their
    logprobs for the requests that asked (None when none did).

    The tokens themselves stay on the device in the engine's token_pool, where the next
    pass reads them; the host needs them only for stop checks and results."""

    next_tokens_cpu: torch.Tensor  # int32 [B] (valid once copy_done is done)
    copy_done: Any  # torch.cuda.Event on CUDA, None on CPU (copy already complete)
    logprobs_cpu: HostLogprobs | None = None  # valid once copy_done is done
