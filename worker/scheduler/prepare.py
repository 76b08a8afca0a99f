"""BatchPreparer: a pass's ForwardInput from a list of requests, in a few vectorised host steps.

Per pass the host does O(B) list work, packs every per-pass value into two pinned host
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
from itertools import compress
from typing import TYPE_CHECKING, NamedTuple

import torch

from worker.engine.logprobs import logprob_rows
from worker.engine.penalties import PenaltyRow, build_penalties, penalty_row
from worker.engine.sampler import SamplingTensors
from worker.forward import BatchLayout, ForwardInput
from worker.kvcache.table import TableManager
from worker.scheduler.intake import choice_seed
from worker.scheduler.req import PendingReq, Req

if TYPE_CHECKING:
    from wire.schema import SamplingParams
    from worker.engine.engine import Engine

ROWS = "rows"  # one entry per computed token, padding rows included
REQUESTS = "requests"  # one entry per request
Column = torch.Tensor | Sequence[int] | Sequence[float] | Sequence[bool]  # one field's host values


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
        parts = [
            c if isinstance(c, torch.Tensor) else torch.tensor(c, dtype=self.dtype)
            for c in (columns[name] for name, _ in self.fields)
        ]
        sizes = self.sizes(num_rows, batch_size)
        assert [int(p.numel()) for p in parts] == sizes, f"{self.dtype} columns do not match their lengths"
        pin = device.type == "cuda"
        host = torch.empty(sum(sizes), dtype=self.dtype, pin_memory=pin)
        torch.cat(parts, out=host)
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


def _sampling_columns(rows: Sequence[SamplingRow], steps: list[int]) -> dict[str, Column]:
    columns: dict[str, Column] = dict(zip(SamplingRow._fields, zip(*rows, strict=True), strict=True))
    columns["steps"] = steps
    return columns


def _sampling_tensors(views: Mapping[str, torch.Tensor], columns: Mapping[str, Column]) -> SamplingTensors:
    """SamplingTensors over packed device views; the flags come from the host columns.

    A filter runs when a sampled (not greedy) row uses it: top_k > 0, top_p < 1, min_p > 0."""
    sampled = [not g for g in columns["greedy"]]
    return SamplingTensors(
        temperature=views["temperature"],
        top_p=views["top_p"],
        top_k=views["top_k"],
        min_p=views["min_p"],
        seeds=views["seeds"],
        steps=views["steps"],
        greedy=views["greedy"].bool(),
        all_greedy=not any(sampled),
        # NOTE: top_k and min_p are never negative, top_p never above 1 (SamplingParams' bounds)
        use_top_k=any(compress(columns["top_k"], sampled)),
        use_top_p=min(compress(columns["top_p"], sampled), default=1.0) < 1.0,
        use_min_p=any(compress(columns["min_p"], sampled)),
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
    """Builds each pass's ForwardInput."""

    def __init__(self, engine: Engine, tables: TableManager) -> None:
        self.engine = engine
        self.tables = tables
        self.device = engine.device
        self._rows: dict[PendingReq, SamplingRow] = {}
        self._extras: dict[PendingReq, Extras | None] = {}

    def prepare(self, reqs: list[Req]) -> ForwardInput:
        """The pass for ``reqs`` (pages already allocated up to each device_len); its copies are
        queued on the engine's scheduler stream when it has one (overlap), else the current one."""
        stream = self.engine.scheduler_stream
        if stream is None:
            return self._prepare(reqs)
        if self.tables.has_pending_tokens:
            # NOTE: a reused slot's previous owner may still have its last token write in flight.
            stream.wait_stream(self.engine.stream)
        with torch.cuda.stream(stream):
            return self._prepare(reqs)

    def _prepare(self, reqs: list[Req]) -> ForwardInput:
        engine, tables = self.engine, self.tables
        tables.flush()
        batch_size = len(reqs)
        slots = torch.tensor([r.slot for r in reqs], dtype=torch.int64)
        cached = torch.tensor([r.cached_len for r in reqs], dtype=torch.int64)
        device_lens = [r.device_len for r in reqs]
        extend = torch.tensor(device_lens, dtype=torch.int64) - cached
        num_tokens = int(extend.sum())
        graph_bs = None
        if num_tokens == batch_size:
            graph_bs = engine.graph_batch_size(batch_size)
            pad = (graph_bs or batch_size) - batch_size
            load_slots = torch.cat([slots, torch.full((pad,), tables.dummy_slot, dtype=torch.int64)])
            positions = torch.cat([cached, torch.zeros(pad, dtype=torch.int64)])
            out_loc = torch.cat(
                [
                    tables.page_table_cpu[slots, cached].long(),
                    torch.full((pad,), engine.dummy_loc, dtype=torch.int64),
                ]
            )
            sample_idx = torch.arange(batch_size, dtype=torch.int64)
        else:
            load_slots = torch.repeat_interleave(slots, extend)
            ends = torch.cumsum(extend, 0)
            positions = torch.arange(num_tokens, dtype=torch.int64) + torch.repeat_interleave(
                cached - (ends - extend), extend
            )
            out_loc = tables.page_table_cpu[load_slots, positions].long()
            sample_idx = ends - 1
        produces = [r.produces_token for r in reqs]
        columns = _sampling_columns(
            [self._row(r.pending) for r in reqs],
            [max(0, d - r.prompt_len) for d, r in zip(device_lens, reqs, strict=True)],
        )
        columns.update(
            load_slots=load_slots,
            positions=positions,
            out_loc=out_loc,
            sample_idx=sample_idx,
            write_slots=[r.slot if p else tables.dummy_slot for r, p in zip(reqs, produces, strict=True)],
            write_pos=[d if p else 0 for d, p in zip(device_lens, produces, strict=True)],
        )
        num_rows = int(load_slots.numel())
        views = {
            **PASS_INT64.pack(columns, num_rows, batch_size, self.device),
            **PASS_FLOAT32.pack(columns, num_rows, batch_size, self.device),
        }
        sampling = _sampling_tensors(views, columns)
        extras = [self._extra(r.pending) for r in reqs]
        if any(e is not None for e in extras):  # NOTE: the fast path stops here
            sampling = self._with_extras(sampling, reqs, extras, device_lens)
        layout = BatchLayout(
            slots_cpu=slots.to(torch.int32),
            cached_lens_cpu=cached.to(torch.int32),
            extend_lens_cpu=extend.to(torch.int32),
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

    def _row(self, pending: PendingReq) -> SamplingRow:
        row = self._rows.get(pending)
        if row is None:
            if len(self._rows) > 4 * self.tables.max_running_reqs:
                self._rows.clear()  # NOTE: entries of finished requests; rebuilt on demand
            vocab_size = self.engine.vocab_size
            row = self._rows[pending] = sampling_row(pending.sampling, pending.seed, vocab_size)
        return row

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
