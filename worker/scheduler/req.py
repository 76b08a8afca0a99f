"""The request ledger: pending requests, running requests and their three lengths.

    input_ids (host):  [ prompt ............ | generated ... ]
                       0          cached_len         device_len     max_device_len
                       |-- KV computed --|-- extend --|-- remain_len --|

Invariant where a Req is built: 0 <= cached_len < device_len <= max_device_len.
Two hands move a running request: right after its forward pass (before the sampled token is
known) ``complete_forward`` sets cached_len = device_len and device_len += 1; later the host
appends the token to ``input_ids``. So len(input_ids) may trail device_len by one step.
A Req's lengths are one row of the scheduler's SlotLedger (worker.scheduler.ledger), where a
decode step moves every running request's at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from wire.schema import SamplingParams
from worker.scheduler.ledger import OwnLengths, SlotLedger
from worker.scheduler.messages import ChoiceOutput, TokenLogprobs

if TYPE_CHECKING:
    from worker.engine.grammar import Matcher


def output_reserve(remain_len: int, ratio: float) -> int:
    """KV tokens held for a request that may still generate ``remain_len`` tokens: ``ratio``
    of them, rounded up (SchedulerConfig.output_reserve_ratio)."""
    return math.ceil(ratio * remain_len)


@dataclass(eq=False)
class RequestGroup:
    """One GenerateRequest: its n choices share the prompt; answered once all are done."""

    uid: str
    prompt_len: int
    n: int
    choices: dict[int, ChoiceOutput] = field(default_factory=dict)
    cached_tokens: int | None = None  # prefix-cache hit of the first admission
    first_token_at_ms: int = 0  # wall clock when the first token of any choice reached the host
    held_back: list[PendingReq] = field(default_factory=list)  # siblings waiting for the prompt KV
    slots: int = 0  # its choices holding a table slot now (admitted, not yet released)

    @property
    def done(self) -> bool:
        return len(self.choices) == self.n


@dataclass(eq=False)
class PendingReq:
    """Arrived, holds no resources. ``input_ids`` is the prompt plus anything generated before a
    retraction. ``chunk`` is the in-progress ChunkedReq when its prompt is being prefilled."""

    group: RequestGroup
    index: int  # choice index within the group
    input_ids: list[int]
    sampling: SamplingParams  # per choice (seed already offset by index)
    max_device_len: int
    seed: int  # sampling.seed, or one drawn at intake: draws do not depend on batching
    chunk: ChunkedReq | None = None
    logprobs: list[TokenLogprobs] = field(default_factory=list)  # of generated tokens, if asked
    grammar: Matcher | None = None  # structured output: this choice's matcher (worker.engine.grammar)

    @property
    def rid(self) -> str:
        return f"{self.group.uid}#{self.index}"


class _LedgerColumn:
    """A length of a Req kept in its ledger row: ``req.<name>`` reads and writes
    ``req._ledger.<name>[req._row]`` (an int)."""

    def __init__(self, name: str, writable: bool = True) -> None:
        self.name = name
        self.writable = writable

    def __get__(self, req: Req | None, owner: type) -> Any:
        if req is None:
            return self
        return int(getattr(req._ledger, self.name)[req._row])

    def __set__(self, req: Req, value: int) -> None:
        if not self.writable:
            raise AttributeError(f"{self.name} is fixed when a request is built")
        getattr(req._ledger, self.name)[req._row] = value


class Req:
    """A running request: holds a table slot, KV pages and a locked prefix-cache handle.

    Its lengths live in ``ledger`` (worker.scheduler.ledger) at row ``slot``, where a step reads
    and moves the lengths of its whole batch at once; the columns below read one row. Built
    without a ledger (tests, a lone request), it keeps a one-row ledger of its own."""

    __slots__ = ("pending", "slot", "handle", "matched_len", "finished", "released", "_ledger", "_row")
    produces_token = True  # NOTE: a class attribute, read per row in the step's hot loop

    def __init__(
        self,
        pending: PendingReq,
        slot: int,
        cached_len: int,
        device_len: int,
        max_device_len: int,
        handle: Any,
        matched_len: int,
        alloc_len: int,
        ledger: SlotLedger | None = None,
    ) -> None:
        assert 0 <= cached_len < device_len <= max_device_len, (
            f"ledger broken: cached_len={cached_len} device_len={device_len} max_device_len={max_device_len}"
        )
        self.pending = pending
        self.slot = slot
        self.handle = handle  # prefix-cache handle locked for [0, matched_len)
        self.matched_len = matched_len  # tokens at the head of the slot's row owned by the prefix cache
        self.finished = False
        # NOTE: under overlap a request can be released before its last batch is processed
        self.released = False
        if ledger is None:
            ledger, self._row = SlotLedger(1), 0
        else:
            self._row = slot
        self._ledger: SlotLedger | OwnLengths = ledger
        ledger.bind(self._row, pending, cached_len, device_len, max_device_len, alloc_len)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.rid}, slot={self.slot}, cached_len={self.cached_len}, "
            f"device_len={self.device_len}, max_device_len={self.max_device_len})"
        )

    # row ``_row`` of ``_ledger``; alloc_len: tokens of the slot's row backed by pages (whole pages)
    cached_len = _LedgerColumn("cached_len")
    device_len = _LedgerColumn("device_len")
    max_device_len = _LedgerColumn("max_device_len", writable=False)
    alloc_len = _LedgerColumn("alloc_len")

    def reads_row(self, ledger: SlotLedger) -> bool:
        """Whether its lengths are row ``slot`` of ``ledger`` (so a bulk write there moves them)."""
        return self._ledger is ledger and self._row == self.slot

    def detach(self) -> None:
        """Keep this request's row to itself: its slot is being released (module ledger)."""
        if isinstance(self._ledger, SlotLedger):
            self._ledger, self._row = self._ledger.lengths_of(self._row), 0

    @property
    def input_ids(self) -> list[int]:
        return self.pending.input_ids

    @property
    def rid(self) -> str:
        return self.pending.rid

    @property
    def sampling(self) -> SamplingParams:
        return self.pending.sampling

    @property
    def seed(self) -> int:
        return self.pending.seed

    @property
    def prompt_len(self) -> int:
        return self.pending.group.prompt_len

    @property
    def extend_len(self) -> int:
        return self.device_len - self.cached_len

    @property
    def remain_len(self) -> int:
        return self.max_device_len - self.device_len

    @property
    def can_decode(self) -> bool:
        return self.remain_len > 0 and not self.finished

    @property
    def output_ids(self) -> list[int]:
        return self.input_ids[self.prompt_len :]

    @property
    def max_tokens(self) -> int:
        return self.max_device_len - self.prompt_len

    def complete_forward(self) -> None:
        """GPU-side progress after a pass, before the token is known."""
        ledger, row = self._ledger, self._row
        ledger.cached_len[row] = ledger.device_len[row]
        ledger.device_len[row] += 1

    def append_host(self, token_id: int) -> None:
        """Host-side progress once the sampled token has arrived."""
        self.pending.input_ids.append(token_id)
        if self.pending.grammar is not None:
            self.pending.grammar.accept(token_id)


class ChunkedReq(Req):
    """A non-final chunk of a prompt: computes KV only, produces no token, never decodes."""

    __slots__ = ()
    produces_token = False

    @property
    def can_decode(self) -> bool:
        return False

    def complete_forward(self) -> None:
        self.cached_len = self.device_len  # NOTE: spent; the next chunk is a new Req built from it

    def append_host(self, token_id: int) -> None:
        raise AssertionError("a chunked request samples no token")
