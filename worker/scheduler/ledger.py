"""SlotLedger: what a step reads of each running request, in preallocated arrays by slot.

Row ``slot`` describes the request holding that table slot; a step gathers the rows of its
batch with one index per array and moves lengths with one vectorised write:

    lengths   cached_len  device_len  max_device_len  alloc_len  prompt_len       int64
    stops     min_tokens (int64)  stop_on_eos (bool)  stop_ids (int64 x STOP_IDS, -1 unused)
              slow_stop (bool): stop strings, a grammar or more stop ids than fit: checked
              per request, every step
    sampling  seeds  top_k (int64)  temperature  top_p  min_p (float64)  greedy (bool)
              extras (bool): penalties, logit_bias, min_tokens or logprobs may apply

A Req binds its row when it is built and reads its lengths there (worker.scheduler.req).
Invariant: while a request holds its slot, its row is its own and only it (or a later chunk
of the same prompt) writes it. A released request's slot can be handed out again while a
step in flight still names the request, so release detaches it: ``lengths_of`` gives it its
lengths to keep (OwnLengths), read and written as a one-row ledger's.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from worker.engine.penalties import needs_token_history

if TYPE_CHECKING:
    from wire.schema import SamplingParams
    from worker.scheduler.req import PendingReq

STOP_IDS = 8  # stop token ids checked in bulk; a request with more is checked per request
_INT64 = (
    "cached_len",
    "device_len",
    "max_device_len",
    "alloc_len",
    "prompt_len",
    "min_tokens",
    "seeds",
    "top_k",
)
_FLOAT64 = ("temperature", "top_p", "min_p")
_BOOL = ("stop_on_eos", "slow_stop", "greedy", "extras")


class SamplingRow(NamedTuple):
    """One choice's sampling parameters as the sampler takes them; constant while it runs.

    Each field is the entry of the sampling column of the same name."""

    seeds: int
    temperature: float  # 1.0 where greedy (unused there)
    top_p: float
    top_k: int  # 0 = off
    min_p: float
    greedy: bool


def sampling_row(params: SamplingParams, seed: int, vocab_size: int) -> SamplingRow:
    greedy = params.greedy
    temperature = 1.0 if greedy else params.temperature
    return SamplingRow(seed, temperature, params.top_p, params.top_k_for(vocab_size), params.min_p, greedy)


def may_need_extras(params: SamplingParams) -> bool:
    """Whether the request may ask for penalties, logit_bias, min_tokens or logprobs (a superset
    of worker.scheduler.prepare.extras_of's answer, which the batch preparer asks only then)."""
    return bool(params.logprobs or params.logit_bias or params.min_tokens > 0 or needs_token_history(params))


class StopRows(NamedTuple):
    """A step's rows' stop conditions, gathered at launch (constant while a request runs) with
    each row's device_len right after the pass: the host's token count once its token is in."""

    lens: np.ndarray
    prompt_len: np.ndarray
    max_device_len: np.ndarray
    min_tokens: np.ndarray
    stop_on_eos: np.ndarray
    stop_ids: np.ndarray  # [B, STOP_IDS]
    slow_stop: np.ndarray

    def candidates(self, tokens: np.ndarray, eos_token_ids: np.ndarray) -> np.ndarray:
        """Rows whose newest token ``tokens[i]`` may end them: every row worker.scheduler.stop's
        ``check_stop`` could end (length reached, or past min_tokens an EOS or stop id), and
        the rows only it can judge (slow_stop)."""
        output_len = self.lens - self.prompt_len
        matched = self.stop_on_eos & np.isin(tokens, eos_token_ids)
        matched |= (self.stop_ids == tokens[:, None]).any(axis=1)
        ends = (self.lens >= self.max_device_len) | (matched & (output_len >= self.min_tokens))
        return np.flatnonzero(ends | self.slow_stop)


class OwnLengths:
    """One request's lengths outside the ledger, indexed as row 0 of a one-row ledger's arrays."""

    __slots__ = ("cached_len", "device_len", "max_device_len", "alloc_len")
    num_rows = 1

    def __init__(self, cached_len: int, device_len: int, max_device_len: int, alloc_len: int) -> None:
        self.cached_len = [cached_len]
        self.device_len = [device_len]
        self.max_device_len = [max_device_len]
        self.alloc_len = [alloc_len]


class SlotLedger:
    """The arrays of module docstring, ``num_rows`` long. ``vocab_size`` turns top_k off where
    it covers the vocabulary (worker.scheduler.prepare.sampling_row)."""

    def __init__(self, num_rows: int, vocab_size: int = sys.maxsize) -> None:
        self.num_rows = num_rows
        self.vocab_size = vocab_size
        for name in _INT64:
            setattr(self, name, np.zeros(num_rows, dtype=np.int64))
        for name in _FLOAT64:
            setattr(self, name, np.zeros(num_rows, dtype=np.float64))
        for name in _BOOL:
            setattr(self, name, np.zeros(num_rows, dtype=np.bool_))
        self.stop_ids = np.full((num_rows, STOP_IDS), -1, dtype=np.int64)
        # the arrays, declared for the type checker (set above)
        self.cached_len: np.ndarray
        self.device_len: np.ndarray
        self.max_device_len: np.ndarray
        self.alloc_len: np.ndarray
        self.prompt_len: np.ndarray
        self.min_tokens: np.ndarray
        self.seeds: np.ndarray
        self.top_k: np.ndarray
        self.temperature: np.ndarray
        self.top_p: np.ndarray
        self.min_p: np.ndarray
        self.stop_on_eos: np.ndarray
        self.slow_stop: np.ndarray
        self.greedy: np.ndarray
        self.extras: np.ndarray

    def bind(
        self,
        row: int,
        pending: PendingReq,
        cached_len: int,
        device_len: int,
        max_device_len: int,
        alloc_len: int,
    ) -> None:
        """Write row ``row`` for a request of ``pending`` with these lengths."""
        params = pending.sampling
        self.cached_len[row] = cached_len
        self.device_len[row] = device_len
        self.max_device_len[row] = max_device_len
        self.alloc_len[row] = alloc_len
        self.prompt_len[row] = pending.group.prompt_len
        self.min_tokens[row] = params.min_tokens
        self.stop_on_eos[row] = not params.ignore_eos
        ids = params.stop_token_ids
        self.stop_ids[row] = -1
        self.stop_ids[row, : min(len(ids), STOP_IDS)] = ids[:STOP_IDS]
        self.slow_stop[row] = bool(params.stop) or pending.grammar is not None or len(ids) > STOP_IDS
        sampling = sampling_row(params, pending.seed, self.vocab_size)
        self.seeds[row] = sampling.seeds
        self.temperature[row] = sampling.temperature
        self.top_p[row] = sampling.top_p
        self.top_k[row] = sampling.top_k
        self.min_p[row] = sampling.min_p
        self.greedy[row] = sampling.greedy
        self.extras[row] = may_need_extras(params)

    def lengths_of(self, row: int) -> OwnLengths:
        """Row ``row``'s lengths, to keep apart from the ledger (a released request's)."""
        return OwnLengths(
            int(self.cached_len[row]),
            int(self.device_len[row]),
            int(self.max_device_len[row]),
            int(self.alloc_len[row]),
        )

    def complete_forward(self, slots: np.ndarray) -> None:
        """GPU-side progress of decode rows ``slots`` after a pass: cached_len = device_len,
        device_len += 1 (worker.scheduler.req.Req.complete_forward, for many rows at once)."""
        self.cached_len[slots] = self.device_len[slots]
        self.device_len[slots] += 1

    def stop_rows(self, slots: np.ndarray) -> StopRows:
        """Rows ``slots``' stop conditions and device_len now (StopRows)."""
        return StopRows(
            self.device_len[slots],
            self.prompt_len[slots],
            self.max_device_len[slots],
            self.min_tokens[slots],
            self.stop_on_eos[slots],
            self.stop_ids[slots],
            self.slow_stop[slots],
        )
