"""GraphRunner: decode passes captured as CUDA graphs, one per batch size, replayed per step.

A captured pass reads three static rows (load slots, positions, out_loc) of ``max_bs``
entries, gathers its input ids from ``token_pool`` and runs the whole model, logits
included. Requests are padded to the next captured size with the dummy request (dummy slot,
position 0, the engine's dummy KV location), so padding rows write only the dummy page and
their logits are ignored. Attention metadata lives in the backend's fixed graph buffers
(the graph hooks of worker.attention.base.AttentionBackend), re-planned per step by
``backend.plan_for_replay`` on the engine stream before ``run``.

Sampling is not captured: the engine samples eagerly from the logits a replay returns, so
penalties, logit_bias, min_tokens and logprobs (whose shapes vary with the batch's requests)
run the same way after a replay as after an eager pass.
"""

from __future__ import annotations

import bisect
import logging
import time
from typing import TYPE_CHECKING

import torch

from worker.forward import BatchLayout, ForwardBatch

if TYPE_CHECKING:
    from worker.engine.engine import Engine
    from worker.forward import ForwardInput

logger = logging.getLogger(__name__)


def graph_batch_sizes(max_bs: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 16 up to max_bs (and max_bs itself)."""
    sizes = [bs for bs in (1, 2, 4, 8) if bs < max_bs] + list(range(16, max_bs, 16))
    return sorted({*sizes, max_bs})


def fitting_batch_size(batch_sizes: list[int], batch_size: int) -> int | None:
    """The smallest of ``batch_sizes`` (sorted) holding ``batch_size`` requests, or None."""
    i = bisect.bisect_left(batch_sizes, batch_size)
    return batch_sizes[i] if i < len(batch_sizes) else None


class GraphRunner:
    """The engine's decode passes, one captured graph per batch size (backend permitting)."""

    def __init__(self, engine: Engine, batch_sizes: list[int]) -> None:
        self.engine = engine
        self.batch_sizes = sorted(batch_sizes)
        max_bs = self.batch_sizes[-1]
        device = engine.device
        # rows: load slots, positions, out_loc; idle entries point at the dummy request.
        self._inputs = torch.zeros((3, max_bs), dtype=torch.int64, device=device)
        self._inputs[0].fill_(engine.page_table.shape[0] - 1)
        self._inputs[2].fill_(engine.dummy_loc)
        self._sample_idx = torch.arange(max_bs, dtype=torch.int64, device=device)
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.replays = 0  # decode passes run from a graph
        # NOTE: every graph writes its logits into this one buffer; a graph's own output would
        # stay allocated in the pool, which at 1,024 sizes x a 152k vocabulary is ~10 GiB.
        vocab = engine.model_config.vocab_size
        self._logits = torch.empty((max_bs, vocab), dtype=engine.dtype, device=device)
        engine.backend.init_cuda_graphs(self.batch_sizes, max_seq_len=engine.max_seq_len)
        start = time.perf_counter()
        stream = engine.stream if engine.stream is not None else torch.cuda.Stream(device)
        pool = torch.cuda.graph_pool_handle()
        with torch.inference_mode():
            for bs in reversed(self.batch_sizes):
                with torch.cuda.stream(stream):
                    meta = engine.backend.capture_meta(bs)
                    for _ in range(2):  # warm-up: Triton compiles, cuBLAS picks its kernels
                        self._pass(bs, meta)
                stream.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    self._pass(bs, meta)
                self._graphs[bs] = graph
        torch.cuda.synchronize(device)
        logger.info(
            "captured %d CUDA graphs (bs <= %d) in %.1f s",
            len(self._graphs),
            max_bs,
            time.perf_counter() - start,
        )

    def _pass(self, bs: int, meta: object) -> None:
        engine = self.engine
        load_slots, positions, out_loc = self._inputs[:, :bs]
        ones = torch.ones(bs, dtype=torch.int32)
        batch = ForwardBatch(
            input_ids=engine.token_pool[load_slots, positions].to(torch.int64),
            positions=positions,
            out_loc=out_loc,
            sample_idx=self._sample_idx[:bs],
            layout=BatchLayout(slots_cpu=ones, cached_lens_cpu=ones - 1, extend_lens_cpu=ones),
            backend=engine.backend,
            attn_meta=meta,
            kv=engine.kv,
        )
        engine.model(batch, logits_out=self._logits[:bs])

    def close(self) -> None:
        """Destroy every graph (a launch still running finishes first: CUDA frees it after)."""
        for graph in self._graphs.values():
            graph.reset()
        self._graphs.clear()

    def batch_size_for(self, batch_size: int) -> int | None:
        """The smallest captured size holding ``batch_size`` requests, or None (run eagerly)."""
        return fitting_batch_size(self.batch_sizes, batch_size)

    def run(self, fi: ForwardInput) -> torch.Tensor:
        """Replay the pass of ``fi`` (padded to fi.graph_bs, already planned): logits [B, vocab]."""
        bs = fi.graph_bs
        assert bs is not None and fi.load_slots.numel() == bs
        self._inputs[0, :bs].copy_(fi.load_slots)
        self._inputs[1, :bs].copy_(fi.positions)
        self._inputs[2, :bs].copy_(fi.out_loc)
        self._graphs[bs].replay()
        self.replays += 1
        return self._logits[: fi.batch_size]
