"""Duties a pool shares: any consumer can do them, and the pool needs each about once per period.

Trimming acknowledged entries, forgetting dead consumers and sweeping every partition for
entries nobody renews are idempotent, and one consumer doing them serves all. Done by each of W
consumers every period, they cost W times what the pool needs (at 1,000 consumers, most of
the queue's commands). So a consumer that sees W live workers does a duty every
``every_s x W`` on average, at a random phase (uniform in [0.5, 1.5) of that; the first time
anywhere in [0, 1)): the pool as a whole does it about once per ``every_s``, whatever its size.
A lone consumer does it every ``every_s`` exactly. The wait is judged against the pool size of
each step, so a pool that shrinks (its consumers died) shortens the waits of the survivors.
"""

from __future__ import annotations

import random


class PoolDuty:
    def __init__(self, every_s: float, start_s: float, rng: random.Random) -> None:
        self.every_s = every_s
        self.rng = rng
        self._since = start_s
        self._share = rng.random()  # of the first wait, when the pool is larger than one

    def due(self, now_s: float, live: int) -> bool:
        if live <= 1:
            return now_s - self._since >= self.every_s
        return now_s - self._since >= self.every_s * live * self._share

    def done(self, now_s: float) -> None:
        self._since = now_s
        self._share = self.rng.uniform(0.5, 1.5)
