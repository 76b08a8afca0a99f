"""BatchPreparer: a pass's ForwardInput from a list of requests, in a few vectorised host steps.

Per pass the host does O(B) list work, builds two packed pinned tensors (int64 and float32)
and issues two host-to-device copies on the current (scheduler) stream; every ForwardInput
tensor is a view of those. Attention is left unplanned: the engine plans on its own stream,
where FlashInfer's shared plan buffers are safe to overwrite.

Decode batches that fit a captured CUDA graph are padded to its batch size with the dummy
request (dummy slot, position 0, the dummy KV location), so replays never touch real KV.
Layout of the packed int64 tensor (R = padded rows, B = requests):

    load_slots R | positions R | out_loc R | sample_idx B | write_slots B | write_pos B
    | seeds B | steps B | top_k B | greedy B
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from worker.attention.base import BatchLayout
from worker.engine.input import ForwardInput
from worker.engine.sampler import SamplingTensors
from worker.scheduler.req import PendingReq, Req
from worker.scheduler.table import TableManager

if TYPE_CHECKING:
    from worker.engine.engine import Engine

# (seed, temperature, top_p, top_k, min_p, greedy) of one choice; constant while it runs
_SamplingRow = tuple[int, float, float, int, float, bool]


def _sampling_row(pending: PendingReq, vocab_size: int) -> _SamplingRow:
    p = pending.sampling
    seed = p.seed if p.seed is not None else pending.seed
    return (seed, 1.0 if p.greedy else p.temperature, p.top_p, p.top_k_for(vocab_size), p.min_p, p.greedy)


class BatchPreparer:
    def __init__(self, engine: Engine, tables: TableManager) -> None:
        self.engine = engine
        self.tables = tables
        self.device = engine.device
        self._pin = self.device.type == "cuda"
        self._rows: dict[PendingReq, _SamplingRow] = {}

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
        runner = engine.graph_runner
        graph_bs = None
        if num_tokens == batch_size and runner is not None:
            graph_bs = runner.batch_size_for(batch_size)
        if num_tokens == batch_size:
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
        rows = [self._row(r.pending) for r in reqs]
        produces = [r.produces_token for r in reqs]
        write_slots = [r.slot if p else tables.dummy_slot for r, p in zip(reqs, produces, strict=True)]
        write_pos = [d if p else 0 for d, p in zip(device_lens, produces, strict=True)]
        steps = [max(0, d - r.prompt_len) for d, r in zip(device_lens, reqs, strict=True)]
        seeds, temperature, top_p, top_k, min_p, greedy = zip(*rows, strict=True)
        ints = self._pack(
            [load_slots, positions, out_loc, sample_idx]
            + [
                torch.tensor(v, dtype=torch.int64)
                for v in (write_slots, write_pos, seeds, steps, top_k, greedy)
            ],
            torch.int64,
        )
        floats = self._pack(
            [torch.tensor(v, dtype=torch.float32) for v in (temperature, top_p, min_p)], torch.float32
        )
        r = int(load_slots.numel())
        b = batch_size
        i_views = ints.split([r, r, r, b, b, b, b, b, b, b])
        f_views = floats.split([b, b, b])
        sampled = [not g for g in greedy]
        sampling = SamplingTensors(
            temperature=f_views[0],
            top_p=f_views[1],
            top_k=i_views[8],
            min_p=f_views[2],
            seeds=i_views[6],
            steps=i_views[7],
            greedy=i_views[9].bool(),
            all_greedy=all(greedy),
            use_top_k=any(k > 0 and s for k, s in zip(top_k, sampled, strict=True)),
            use_top_p=any(p < 1.0 and s for p, s in zip(top_p, sampled, strict=True)),
            use_min_p=any(p > 0.0 and s for p, s in zip(min_p, sampled, strict=True)),
        )
        layout = BatchLayout(
            slots_cpu=slots.to(torch.int32),
            cached_lens_cpu=cached.to(torch.int32),
            extend_lens_cpu=extend.to(torch.int32),
        )
        return ForwardInput(
            layout=layout,
            load_slots=i_views[0],
            positions=i_views[1],
            out_loc=i_views[2],
            sample_idx=i_views[3],
            write_slots=i_views[4],
            write_pos=i_views[5],
            sampling=sampling,
            graph_bs=graph_bs,
        )

    def _row(self, pending: PendingReq) -> _SamplingRow:
        row = self._rows.get(pending)
        if row is None:
            if len(self._rows) > 4 * self.tables.max_running_reqs:
                self._rows.clear()  # NOTE: entries of finished requests; rebuilt on demand
            row = self._rows[pending] = _sampling_row(pending, self.engine.model_config.vocab_size)
        return row

    def _pack(self, parts: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        """Concatenate ``parts`` into one (pinned) host tensor and start its copy to the device."""
        total = sum(int(p.numel()) for p in parts)
        host = torch.empty(total, dtype=dtype, pin_memory=self._pin)
        torch.cat(parts, out=host)
        if not self._pin:
            return host.to(self.device)
        return host.to(self.device, non_blocking=True)
