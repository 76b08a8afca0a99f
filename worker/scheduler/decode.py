"""DecodeManager: the running set, recomputed in one place each step."""

from __future__ import annotations

from worker.scheduler.req import Req, output_reserve


class DecodeManager:
    def __init__(self) -> None:
        self.running: list[Req] = []  # in admission order

    @property
    def runnable(self) -> bool:
        return len(self.running) > 0

    def update(self, batch: list[Req]) -> None:
        """running := (running ∪ batch) filtered by can_decode — the only place it grows."""
        seen = {id(r) for r in self.running}
        merged = self.running + [r for r in batch if id(r) not in seen]
        self.running = [r for r in merged if r.can_decode]

    def remove(self, req: Req) -> None:
        self.running = [r for r in self.running if r is not req]

    def reserved_tokens(self, ratio: float) -> int:
        """KV tokens the running requests are expected to still need."""
        return sum(output_reserve(r.remain_len, ratio) for r in self.running)
