"""DecodeManager: the running set, recomputed in one place each step."""

from __future__ import annotations

import numpy as np

from worker.scheduler.ledger import SlotLedger
from worker.scheduler.req import Req

NO_SLOTS = np.empty(0, dtype=np.int64)


class DecodeManager:
    """The running requests by slot, in admission order; their lengths are ``ledger``'s rows."""

    def __init__(self, ledger: SlotLedger) -> None:
        self.ledger = ledger
        self._running: dict[int, Req] = {}  # slot -> request, in admission order
        self._slots: np.ndarray | None = None  # the keys of _running as an array; None: stale

    @property
    def running(self) -> list[Req]:
        """The running requests, oldest first (a copy)."""
        return list(self._running.values())

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def runnable(self) -> bool:
        return len(self._running) > 0

    def slots(self) -> np.ndarray:
        """The running requests' slots, aligned with ``running`` (int64; do not write)."""
        if self._slots is None:
            self._slots = np.fromiter(self._running, dtype=np.int64, count=len(self._running))
        return self._slots

    def update(self, prefills: list[Req], decoded: np.ndarray) -> None:
        """running := (running ∪ batch) filtered by can_decode — the only place it grows.

        The batch is ``prefills`` and the running requests at slots ``decoded``, after their
        pass. NOTE: only the batch is filtered: a running request's can_decode changes when its
        lengths move (in a batch) or when it finishes (``remove``), nowhere else."""
        ledger = self.ledger
        done = decoded[ledger.device_len[decoded] >= ledger.max_device_len[decoded]]
        for slot in done.tolist():
            del self._running[slot]
        joined = False
        for req in prefills:
            if req.can_decode:
                self._running[req.slot] = req
                joined = True
        if len(done) or joined:
            self._slots = None

    def remove(self, req: Req) -> None:
        """Drop ``req`` if it runs (its slot may run another request by now: then nothing)."""
        if self._running.get(req.slot) is req:
            del self._running[req.slot]
            self._slots = None

    def reserved_tokens(self, ratio: float) -> int:
        """KV tokens the running requests are expected to still need (output_reserve each)."""
        slots = self.slots()
        remain = self.ledger.max_device_len[slots] - self.ledger.device_len[slots]
        return int(np.ceil(ratio * remain).sum())
