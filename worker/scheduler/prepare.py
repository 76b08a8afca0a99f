"""BatchPreparer: a pass's ForwardInput from a list of requests, in a few vectorised host steps.

Per pass the host gathers the batch's rows of the SlotLedger (worker.scheduler.ledger: lengths
and sampling parameters by slot) with numpy, packs every per-pass value into two pinned host
tensors, PASS_INT64 and PASS_FLOAT32 (the tables below name each field, its length and its
place), and issues two host-to-device copies on the current (scheduler) stream; every
ForwardInput and SamplingTensors tensor is a view of those. Attention is left unplanned: the
engine plans on its own stream, where FlashInfer's shared plan buffers are safe to overwrite.

Decode batches that fit a captured CUDA graph are padded to its batch size with the dummy
request (dummy slot, position 0, the dummy KV location), so replays never touch real KV.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch

from worker.engine.logprobs import logprob_rows
from worker.engine.penalties import PenaltyRow, build_penalties, penalty_row
from worker.engine.sampler import SamplingTensors
from worker.forward import BatchLayout, ForwardInput
from worker.kvcache.table import TableManager
from worker.scheduler.intake import choice_seed
from worker.scheduler.ledger import SamplingRow, SlotLedger, sampling_row
from worker.scheduler.req import PendingReq, Req

if TYPE_CHECKING:
    from wire.schema import SamplingParams
    from worker.engine.engine import Engine

ROWS = "rows"  # one entry per computed token, padding rows included
REQUESTS = "requests"  # one entry per request
Column = (
    np.ndarray | torch.Tensor | Sequence[int] | Sequence[float] | Sequence[bool]
)  # one field's host values


@dataclass(frozen=True)
class Packed:
    """Fields of one dtype laid back to back in one host tensor, copied to the device at once."""

    dtype: torch.dtype
    fields: tuple[tuple[str, str], ...]  # (name, ROWS or REQUESTS), in packing order

    def sizes(self, num_rows: int, batch_size: int) -> list[int]:
        return [num_rows if length == ROWS else batch_size for _, length in self.fields]

    def pack(
        self,
        columns: Mapping[str, Column],
        num_rows: int,
        batch_size: int,
        device: torch.device,
    ) -> dict[str, torch.Tensor]:
        """One device tensor holding ``columns`` in field order; its views by field name.

        On CUDA the host side is pinned and the copy does not wait (current stream)."""
        sizes = self.sizes(num_rows, batch_size)
        pin = device.type == "cuda"
        host = torch.empty(sum(sizes), dtype=self.dtype, pin_memory=pin)
        host_np = host.numpy()
        start = 0
        for (name, _), size in zip(self.fields, sizes, strict=True):
            column = columns[name]
            assert len(column) == size, f"{self.dtype} column {name} holds {len(column)} values, not {size}"
            host_np[start : start + size] = column
            start += size
        packed = host.to(device, non_blocking=True) if pin else host.to(device)
        return dict(zip((name for name, _ in self.fields), packed.split(sizes), strict=True))


# Field names are those of ForwardInput and SamplingTensors (greedy is packed as int64 and
# viewed as bool); a pass packs all of them, a sampling-only batch the sampling ones.
SAMPLING_INT64 = Packed(
    torch.int64, (("seeds", REQUESTS), ("steps", REQUESTS), ("top_k", REQUESTS), ("greedy", REQUESTS))
)
SAMPLING_FLOAT32 = Packed(
    torch.float32, (("temperature", REQUESTS), ("top_p", REQUESTS), ("min_p", REQUESTS))
)
PASS_INT64 = Packed(
    torch.int64,
    (
        ("load_slots", ROWS),
        ("positions", ROWS),
        ("out_loc", ROWS),
        ("sample_idx", REQUESTS),
        ("write_slots", REQUESTS),
        ("write_pos", REQUESTS),
        *SAMPLING_INT64.fields,
    ),
)
PASS_FLOAT32 = SAMPLING_FLOAT32


def _sampling_columns(rows: Sequence[SamplingRow], steps: Column) -> dict[str, Column]:
    columns: dict[str, Column] = dict(zip(SamplingRow._fields, zip(*rows, strict=True), strict=True))
    columns["steps"] = steps
    return columns


def _sampling_tensors(views: Mapping[str, torch.Tensor], columns: Mapping[str, Column]) -> SamplingTensors:
    """SamplingTensors over packed device views; the flags come from the host columns.

    A filter runs when a sampled (not greedy) row uses it: top_k > 0, top_p < 1, min_p > 0."""
    sampled = ~np.asarray(columns["greedy"], dtype=np.bool_)
    return SamplingTensors(
        temperature=views["temperature"],
        top_p=views["top_p"],
        top_k=views["top_k"],
        min_p=views["min_p"],
        seeds=views["seeds"],
        steps=views["steps"],
        greedy=views["greedy"].bool(),
        all_greedy=not sampled.any(),
        # NOTE: top_k and min_p are never negative, top_p never above 1 (SamplingParams' bounds)
        use_top_k=bool((np.asarray(columns["top_k"])[sampled] != 0).any()),
        use_top_p=bool((np.asarray(columns["top_p"], dtype=np.float64)[sampled] < 1.0).any()),
        use_min_p=bool((np.asarray(columns["min_p"], dtype=np.float64)[sampled] != 0).any()),
    )


def sampling_tensors(
    params: list[SamplingParams],
    steps: list[int],
    device: torch.device | str,
    seeds: list[int] | None = None,
    vocab_size: int | None = None,
) -> SamplingTensors:
    """The SamplingTensors a pass builds for these requests (for tests and benchmarks).

    ``steps[i]`` is request i's output position. A request without a seed gets ``seeds[i]``
    if given, else one drawn as at intake. Without ``vocab_size`` only top_k -1/0 is off."""
    if len(steps) != len(params) or (seeds is not None and len(seeds) != len(params)):
        raise ValueError(f"params ({len(params)}), steps ({len(steps)}) and seeds must align")
    vocab = vocab_size if vocab_size is not None else sys.maxsize
    if seeds is None:
        seeds = [choice_seed(p) for p in params]
    rows = [
        sampling_row(p, p.seed if p.seed is not None else seed, vocab)
        for p, seed in zip(params, seeds, strict=True)
    ]
    columns = _sampling_columns(rows, steps)
    device = torch.device(device)
    views = {
        **SAMPLING_INT64.pack(columns, 0, len(params), device),
        **SAMPLING_FLOAT32.pack(columns, 0, len(params), device),
    }
    return _sampling_tensors(views, columns)


class BatchPreparer:
    """Builds each pass's ForwardInput from the batch's rows of ``ledger``."""

    def __init__(self, engine: Engine, tables: TableManager, ledger: SlotLedger) -> None:
        self.engine = engine
        self.tables = tables
        self.ledger = ledger
        self.device = engine.device
        self._extras: dict[PendingReq, Extras | None] = {}

    def prepare(
        self, reqs: list[Req], slots: np.ndarray | None = None, num_prefills: int | None = None
    ) -> ForwardInput:
        """The pass for ``reqs`` (pages already allocated up to each device_len); its copies are
        queued on the engine's scheduler stream when it has one (overlap), else the current one.

        ``slots``: the requests' slots (int64, as ``reqs``); ``num_prefills``: the leading
        requests that may be prompt chunks (the rest are running requests, which all produce a
        token); by default every request is looked at."""
        if slots is None:
            slots = np.fromiter((r.slot for r in reqs), dtype=np.int64, count=len(reqs))
        if num_prefills is None:
            num_prefills = len(reqs)
        stream = self.engine.scheduler_stream
        if stream is None:
            return self._prepare(reqs, slots, num_prefills)
        if self.tables.has_pending_tokens:
            # NOTE: a reused slot's previous owner may still have its last token write in flight.
            stream.wait_stream(self.engine.stream)
        with torch.cuda.stream(stream):
            return self._prepare(reqs, slots, num_prefills)

    def _prepare(self, reqs: list[Req], slots: np.ndarray, num_prefills: int) -> ForwardInput:
        engine, tables, ledger = self.engine, self.tables, self.ledger
        tables.flush()
        batch_size = len(reqs)
        cached = ledger.cached_len[slots]
        device_lens = ledger.device_len[slots]
        extend = device_lens - cached
        num_tokens = int(extend.sum())
        graph_bs = engine.graph_batch_size(batch_size) if num_tokens == batch_size else None
        if num_tokens == batch_size:
            num_rows = graph_bs or batch_size
            load_slots = np.full(num_rows, tables.dummy_slot, dtype=np.int64)
            load_slots[:batch_size] = slots
            positions = np.zeros(num_rows, dtype=np.int64)
            positions[:batch_size] = cached
            out_loc = np.full(num_rows, engine.dummy_loc, dtype=np.int64)
            out_loc[:batch_size] = tables.page_table_np[slots, cached]
            sample_idx = np.arange(batch_size, dtype=np.int64)
        else:
            load_slots = np.repeat(slots, extend)
            ends = np.cumsum(extend)
            positions = np.arange(num_tokens, dtype=np.int64) + np.repeat(cached - (ends - extend), extend)
            out_loc = tables.page_table_np[load_slots, positions]
            sample_idx = ends - 1
            num_rows = num_tokens
        write_slots, write_pos = slots, device_lens
        silent = [i for i in range(num_prefills) if not reqs[i].produces_token]
        if silent:  # NOTE: a prompt chunk samples a token nobody needs: into the dummy slot
            write_slots, write_pos = slots.copy(), device_lens.copy()
            write_slots[silent], write_pos[silent] = tables.dummy_slot, 0
        columns: dict[str, Column] = {
            "load_slots": load_slots,
            "positions": positions,
            "out_loc": out_loc,
            "sample_idx": sample_idx,
            "write_slots": write_slots,
            "write_pos": write_pos,
            "seeds": ledger.seeds[slots],
            "steps": np.maximum(device_lens - ledger.prompt_len[slots], 0),
            "top_k": ledger.top_k[slots],
            "greedy": ledger.greedy[slots],
            "temperature": ledger.temperature[slots],
            "top_p": ledger.top_p[slots],
            "min_p": ledger.min_p[slots],
        }
        views = {
            **PASS_INT64.pack(columns, num_rows, batch_size, self.device),
            **PASS_FLOAT32.pack(columns, num_rows, batch_size, self.device),
        }
        sampling = _sampling_tensors(views, columns)
        if ledger.extras[slots].any():  # NOTE: the fast path stops here
            extras = [self._extra(r.pending) for r in reqs]
            if any(e is not None for e in extras):
                sampling = self._with_extras(sampling, reqs, extras, device_lens.tolist())
        layout = BatchLayout(
            slots_cpu=torch.from_numpy(slots.astype(np.int32)),
            cached_lens_cpu=torch.from_numpy(cached.astype(np.int32)),
            extend_lens_cpu=torch.from_numpy(extend.astype(np.int32)),
        )
        return ForwardInput(
            layout=layout,
            load_slots=views["load_slots"],
            positions=views["positions"],
            out_loc=views["out_loc"],
            sample_idx=views["sample_idx"],
            write_slots=views["write_slots"],
            write_pos=views["write_pos"],
            sampling=sampling,
            graph_bs=graph_bs,
        )

    # ---- penalties and logprobs (worker.engine.penalties, worker.engine.logprobs) ----------

    def _extra(self, pending: PendingReq) -> Extras | None:
        if pending in self._extras:
            return self._extras[pending]
        if len(self._extras) > 4 * self.tables.max_running_reqs:
            self._extras.clear()  # NOTE: entries of finished requests; rebuilt on demand
        extra = extras_of(pending.sampling, self.engine.eos_token_ids, self.engine.vocab_size)
        self._extras[pending] = extra
        return extra

    def _with_extras(
        self, sampling: SamplingTensors, reqs: list[Req], extras: list[Extras | None], device_lens: list[int]
    ) -> SamplingTensors:
        penalties = build_penalties(
            [e.penalty if e is not None else None for e in extras],
            [r.slot for r in reqs],
            [r.prompt_len for r in reqs],
            device_lens,
            self.tables.token_pool,
        )
        logprobs = logprob_rows([e.top_logprobs if e is not None else None for e in extras], self.device)
        return replace(sampling, penalties=penalties, logprobs=logprobs)


class Extras(NamedTuple):
    """What a request asks beyond plain sampling; constant while it runs."""

    penalty: PenaltyRow | None
    top_logprobs: int | None  # None: no logprobs


def extras_of(params: SamplingParams, eos_token_ids: frozenset[int], vocab_size: int) -> Extras | None:
    """None when the request asks for no penalty and no logprobs (the fast path)."""
    penalty = penalty_row(params, eos_token_ids, vocab_size)
    top = params.top_logprobs if params.logprobs else None
    return Extras(penalty, top) if penalty is not None or top is not None else None
