"""Step: one launched batch, handed from launch to processing; Stats: what the steps add up to."""

from __future__ import annotations

from typing import Any, NamedTuple

import msgspec

from worker.forward import ForwardInput, ForwardOutput
from worker.scheduler.ledger import StopRows
from worker.scheduler.req import Req


class Step(NamedTuple):
    reqs: list[Req]
    is_prefill: bool
    input: ForwardInput
    output: ForwardOutput | None  # None while a constrained step waits to sample (_sample_constrained)
    logits: Any = None  # that step's logits on the device, until then
    stops: StopRows | None = None  # the rows' stop conditions, gathered at launch


class Stats(msgspec.Struct):
    prefill_tokens: int = 0  # tokens computed by prefill passes (chunks included)
    decode_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from the prefix cache at admission
    steps: int = 0
    retractions: int = 0
    decode_steps: int = 0  # steps without prefill rows
    # decode steps run eagerly (no captured graph holds their batch), by batch size
    eager_decode_batches: dict[int, int] = msgspec.field(default_factory=dict)

    def eager_summary(self) -> str:
        """One line: how many decode steps ran eagerly, and their batch sizes."""
        eager = sum(self.eager_decode_batches.values())
        if not eager:
            return f"eager decode steps: 0 of {self.decode_steps}"
        sizes = sorted(self.eager_decode_batches)
        return f"eager decode steps: {eager} of {self.decode_steps} (batch sizes {sizes[0]}-{sizes[-1]})"
