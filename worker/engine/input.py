"""ForwardInput: the one immutable value the scheduler hands the engine for a pass."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from worker.attention.base import BatchLayout
    from worker.engine.sampler import SamplingTensors


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
