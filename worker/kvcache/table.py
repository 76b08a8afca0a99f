"""TableManager: request slots and the per-slot rows of the page table and token pool."""

from __future__ import annotations

import numpy as np
import torch


class TableManager:
    """Hands out slots 0..max_running_reqs-1 from a free list.

    ``page_table_cpu`` is the host twin of the device ``page_table`` (raw KV locations, as if
    page_size were 1; ``page_table_np`` is the same memory as a numpy array, for gathers);
    row ``dummy_slot`` (the last one) is the padding slot, never handed out: padding requests
    read it and tokens nobody needs are written there.

    On CUDA the device side of every write is deferred: writes queue up on the host and
    ``flush`` applies them all with one pinned copy and one scatter per table, on the current
    stream. Invariant: whoever reads the device tables flushes first (the batch preparer does,
    before each pass). On CPU writes go straight through and ``flush`` does nothing.
    """

    def __init__(self, max_running_reqs: int, page_table: torch.Tensor, token_pool: torch.Tensor) -> None:
        assert page_table.shape == token_pool.shape and page_table.shape[0] == max_running_reqs + 1
        self.max_running_reqs = max_running_reqs
        self.page_table = page_table
        self.token_pool = token_pool
        self.page_table_cpu = torch.zeros(page_table.shape, dtype=torch.int32)
        self.page_table_np = self.page_table_cpu.numpy()
        self.dummy_slot = max_running_reqs
        self._free_slots = list(range(max_running_reqs - 1, -1, -1))
        self._is_free = [True] * max_running_reqs  # NOTE: mirrors _free_slots, for O(1) checks
        self._deferred = page_table.device.type == "cuda"
        # queued device writes: (slot index [n], position [n], value [n]) int64 triples
        self._pending_locations: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self._pending_tokens: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    @property
    def max_seq_len(self) -> int:
        return int(self.page_table.shape[1])

    @property
    def num_free_slots(self) -> int:
        return len(self._free_slots)

    def allocate(self) -> int:
        slot = self._free_slots.pop()
        self._is_free[slot] = False
        return slot

    def free(self, slot: int) -> None:
        assert 0 <= slot < self.max_running_reqs and not self._is_free[slot], f"bad free of slot {slot}"
        self._is_free[slot] = True
        self._free_slots.append(slot)

    def write_locations(self, slot: int, start: int, locations: torch.Tensor) -> None:
        """Set page-table entries [start, start + len) of ``slot`` on both sides."""
        end = start + int(locations.numel())
        self.page_table_cpu[slot, start:end] = locations
        if not self._deferred:
            self.page_table[slot, start:end].copy_(locations, non_blocking=True)
            return
        positions = torch.arange(start, end, dtype=torch.int64)
        slots = torch.full_like(positions, slot)
        self._pending_locations.append((slots, positions, locations.to(torch.int64)))

    def write_location_entries(
        self, slots: np.ndarray, positions: np.ndarray, locations: torch.Tensor
    ) -> None:
        """Set page_table[slots[i], positions[i]] = locations[i] on both sides (int64 index arrays)."""
        self.page_table_np[slots, positions] = locations.numpy()
        slots_t, positions_t = torch.from_numpy(slots), torch.from_numpy(positions)
        if self._deferred:
            self._pending_locations.append((slots_t, positions_t, locations.to(torch.int64)))
        else:
            self.page_table[slots_t, positions_t] = locations.to(torch.int32)

    def write_tokens(self, slot: int, start: int, token_ids: list[int]) -> None:
        """Set token-pool entries [start, start + len) of ``slot`` (prompt tokens at admission)."""
        if not self._deferred:
            tokens_cpu = torch.tensor(token_ids, dtype=torch.int32)
            self.token_pool[slot, start : start + len(token_ids)].copy_(tokens_cpu, non_blocking=True)
            return
        positions = torch.arange(start, start + len(token_ids), dtype=torch.int64)
        slots = torch.full_like(positions, slot)
        self._pending_tokens.append((slots, positions, torch.tensor(token_ids, dtype=torch.int64)))

    @property
    def has_pending_tokens(self) -> bool:
        return bool(self._pending_tokens)

    def flush(self) -> None:
        """Apply the queued device writes: one pinned host-to-device copy, one scatter a table."""
        if not (self._pending_locations or self._pending_tokens):
            return
        writes = self._pending_locations + self._pending_tokens
        num_locations = sum(int(w[0].numel()) for w in self._pending_locations)
        self._pending_locations, self._pending_tokens = [], []
        packed_cpu = torch.empty(
            (3, sum(int(w[0].numel()) for w in writes)), dtype=torch.int64, pin_memory=True
        )
        for row in range(3):
            torch.cat([w[row] for w in writes], out=packed_cpu[row])
        packed = packed_cpu.to(self.page_table.device, non_blocking=True)
        pt, tok = packed[:, :num_locations], packed[:, num_locations:]
        if pt.shape[1]:
            self.page_table[pt[0], pt[1]] = pt[2].to(torch.int32)
        if tok.shape[1]:
            self.token_pool[tok[0], tok[1]] = tok[2].to(torch.int32)
