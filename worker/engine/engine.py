"""Engine: the loaded model, the KV pool, the attention backend, the GPU tables and the sampler."""

from __future__ import annotations

import functools
import logging
import os
from typing import TYPE_CHECKING, Any

import torch

from worker.distributed import broadcast
from worker.engine.config import EngineConfig
from worker.engine.logprobs import pack_with_tokens, raw_logprobs, unpack
from worker.forward import ForwardBatch, ForwardInput, ForwardOutput
from worker.kvcache.pool import KVPool, cache_dtype_of
from worker.models.moe import SparseMoE

if TYPE_CHECKING:
    from worker.attention.base import AttentionBackend
    from worker.engine.graph import GraphRunner
    from worker.engine.split import SplitDecode

log = logging.getLogger(__name__)


def rank_device(device: str, rank: int, size: int) -> torch.device:
    """The device of tensor-parallel rank ``rank``: ``cuda:{rank}`` among the visible devices
    (CUDA_VISIBLE_DEVICES names the group's GPUs), the CPU for every rank on CPU."""
    dev = torch.device(device)
    if dev.type != "cuda" or size == 1:
        return dev
    visible = torch.cuda.device_count()
    if visible < size:
        raise StartupError(
            f"tensor_parallel_size={size} needs {size} GPUs, {visible} visible "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})"
        )
    return torch.device("cuda", rank)


class StartupError(ValueError):
    """A configuration the device cannot hold, found while the engine starts; names the option."""


class Engine:
    """Runs one forward pass per ForwardInput and returns the sampled tokens (and logprobs).

    ``page_table`` and ``token_pool`` ([max_running_reqs + 1, max_seq_len] int32, on the
    device) are the GPU tables the scheduler's TableManager indexes by slot; the last row is
    the dummy slot. ``stream`` and ``graph_runner`` are the hooks for CUDA streams and graphs
    (None on CPU: then the pass runs eagerly on the current stream).

    The KV pool holds one page more than ``num_pages``: the dummy page, never handed out. The
    dummy slot's page_table row points at it, so padding requests write KV nowhere real.
    With overlap on CUDA, the scheduler queues its metadata copies on ``scheduler_stream``
    and each pass runs on ``stream`` after waiting for them.
    """

    def __init__(self, config: EngineConfig) -> None:
        from worker.distributed import all_reduce_min, tp_info
        from worker.engine.sampler import Sampler
        from worker.models.loader import load_model, resolve_dtype

        config = config.resolved()
        self.config = config
        self.tp = tp_info()
        if self.tp.size != config.tensor_parallel_size:
            raise ValueError(
                f"tensor_parallel_size={config.tensor_parallel_size} but this process is in a group of "
                f"{self.tp.size}: a tensor-parallel group runs in a worker's scheduler processes "
                "(radixq worker / run; worker.scheduler.tp), not in this process"
            )
        self.device = rank_device(config.device, self.tp.rank, self.tp.size)
        if config.decode_split_sms and (self.device.type != "cuda" or self.tp.size > 1):
            raise StartupError(
                f"decode_split_sms={config.decode_split_sms} needs one CUDA GPU (device {self.device.type}, "
                f"tensor_parallel_size {self.tp.size}): set it to 0"
            )
        if self.device.index is not None:  # a TP rank's own GPU; plain "cuda" stays the current one
            torch.cuda.set_device(self.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        self.kv_dtype = cache_dtype_of(config.kv_cache_dtype) or self.dtype  # what the KV pages hold
        from worker.kernels.ops import triton_scope

        # NOTE: every pass of this engine (eager, captured, calibration) runs inside this scope,
        # so another engine of the process with the other setting never changes this one's kernels.
        self.kernels = functools.partial(triton_scope, config.triton)
        self.cpu_threads: int | None = None  # torch threads of a CPU engine (worker.engine.threads)
        if self.device.type == "cpu":
            from worker.engine.threads import apply_cpu_threads

            self.cpu_threads = apply_cpu_threads(config.cpu_threads)
            log.info(
                "CPU engine: torch threads %d (cpu_threads %d), OMP_WAIT_POLICY %s, GOMP_SPINCOUNT %s",
                self.cpu_threads, config.cpu_threads,
                os.environ.get("OMP_WAIT_POLICY", "unset"), os.environ.get("GOMP_SPINCOUNT", "unset"),
            )  # fmt: skip
        self.loaded = load_model(
            config.model,
            load_format=config.load_format,
            dtype=self.dtype,
            device=self.device,
            cache_dir=config.cache_dir or None,
            quantization=config.quantization,
            tp_rank=self.tp.rank,
            tp_size=self.tp.size,
        )
        moe_layers = [m for m in self.loaded.model.modules() if isinstance(m, SparseMoE)]
        for module in moe_layers:
            module.fp8_sums = config.moe_fp8_sums
        if moe_layers:
            from worker.kernels.moe_tiles import check_tiles_file

            check_tiles_file()
        from worker.kernels.cpu_linear import onednn_linears, use_onednn

        use_onednn(config.onednn)
        if self.device.type == "cpu" and config.onednn:
            onednn_linears(self.loaded.model)
        model_config = self.loaded.config
        self.model_config = model_config
        self.eos_token_ids = frozenset(model_config.eos_token_ids)
        self.page_size = config.page_size
        # NOTE: every rank allocates the same pages (the leader's scheduler hands them out for all)
        self.num_pages = all_reduce_min(config.num_pages or self._pages_from_memory(config), self.device)
        capacity = self.num_pages * self.page_size - self.page_size
        limit = min(
            config.max_seq_len or model_config.max_position_embeddings, model_config.max_position_embeddings
        )
        self.max_seq_len = min(limit, capacity)
        if self.max_seq_len < 2:
            raise ValueError(f"num_pages={self.num_pages} x page_size={self.page_size}: KV pool too small")
        self.kv = KVPool(
            num_layers=model_config.num_layers,
            num_pages=self.num_pages + 1,
            page_size=self.page_size,
            num_kv_heads=model_config.num_kv_heads,
            head_dim=model_config.head_dim,
            dtype=self.dtype,
            device=self.device,
            cache_dtype=self.kv_dtype,
        )
        # whole pages: a request's last page may reach past max_seq_len
        table_shape = (config.max_running_reqs + 1, -(-self.max_seq_len // self.page_size) * self.page_size)
        self.page_table = torch.zeros(table_shape, dtype=torch.int32, device=self.device)
        self.token_pool = torch.zeros(table_shape, dtype=torch.int32, device=self.device)
        self.dummy_loc = self.num_pages * self.page_size  # first location of the dummy page
        self.page_table[-1].fill_(self.dummy_loc)
        self._backend_args: dict[str, Any] = dict(
            kv=self.kv,
            page_table=self.page_table,
            model_config=model_config,
            page_size=self.page_size,
            device=self.device,
            **({"decode_kernel": config.decode_kernel} if config.decode_kernel != "auto" else {}),
            **(
                {"ragged_backend": config.prefill_ragged_kernel}
                if config.prefill_ragged_kernel != "fa2"
                else {}
            ),
        )
        self.backend = self.new_attention_backend()
        # a split decode pass's second half plans into a backend of its own (worker.engine.split)
        self.split: SplitDecode | None = None
        if config.decode_split_sms:
            from worker.engine.split import SplitDecode

            try:
                self.split = SplitDecode.on_gpu(
                    self.new_attention_backend(),
                    config.decode_split_sms,
                    config.decode_split_min_batch,
                    self.device.index if self.device.index is not None else torch.cuda.current_device(),
                )
            except RuntimeError as exc:  # no cuda-python, a driver without green contexts, too many SMs
                raise StartupError(
                    f"decode_split_sms={config.decode_split_sms}: {str(exc).splitlines()[0][:300]}"
                ) from exc
        self.sampler = Sampler()
        if self.kv.quantized and config.kv_scales == "calibrated":
            from worker.engine.kv_calibration import calibrate_kv_scales, calibration_ids

            with self.kernels():
                calibrate_kv_scales(self, calibration_ids(self))  # before CUDA graphs bake the scales in
        # NOTE: both streams are set (CUDA + overlap) or both None; typed Any for that reason.
        self.stream: Any = None  # the engine stream, where passes run
        self.scheduler_stream: Any = None  # where the scheduler copies batch metadata
        self.graph_runner: GraphRunner | None = None  # CUDA graphs: replays captured decode batch sizes
        if self.device.type == "cuda":
            self._setup_cuda(config)

    def new_attention_backend(self) -> AttentionBackend:
        """An attention backend over this engine's KV pool and page table (the engine's own, or
        a split decode pass's second one: a plan lives in its backend's buffers)."""
        from worker.attention.registry import create_backend

        return create_backend(self.config.attention, **self._backend_args)

    def _setup_cuda(self, config: EngineConfig) -> None:
        if config.overlap:
            self.stream = torch.cuda.Stream(self.device)
            self.scheduler_stream = torch.cuda.Stream(self.device)
        if config.cuda_graph and self.backend.supports_cuda_graphs:
            from worker.engine.graph import GraphRunner, graph_batch_sizes

            max_bs = config.graph_max_bs
            try:
                with self.kernels():
                    self.graph_runner = GraphRunner(self, graph_batch_sizes(max_bs))
            except torch.OutOfMemoryError as exc:
                raise StartupError(
                    f"capturing CUDA graphs up to {max_bs} requests ran out of GPU memory after the KV "
                    f"pool took mem_fraction={config.mem_fraction} of it: lower mem_fraction or "
                    f"cuda_graph_max_bs ({exc})"
                ) from exc
            except RuntimeError as exc:
                if "Buffer overflow" not in str(exc):  # FlashInfer's workspace, too small for a plan
                    raise
                raise StartupError(
                    f"FlashInfer's workspace cannot plan a {max_bs}-request CUDA graph: lower "
                    f"cuda_graph_max_bs or max_running_reqs ({exc})"
                ) from exc

    def close(self) -> None:
        """Destroy the CUDA graphs; later decode passes run eagerly. NOTE: a tensor-parallel rank
        leaves its group (worker.distributed.close_tp) only after this: NCCL keeps a communicator
        until every graph that captured one of its collectives is destroyed."""
        if self.graph_runner is not None:
            self.graph_runner.close()
            self.graph_runner = None

    def _pages_from_memory(self, config: EngineConfig) -> int:
        mc = self.model_config
        per_page = (
            KVPool.bytes_per_location(mc.num_layers, mc.num_kv_heads, mc.head_dim, self.kv_dtype)
            * self.page_size
        )
        if self.device.type == "cuda":
            free_bytes, _ = torch.cuda.mem_get_info(self.device)
            budget = free_bytes * config.mem_fraction
        else:
            want = config.max_running_reqs * (config.max_seq_len or mc.max_position_embeddings)
            budget = min(config.cpu_kv_gib * 2**30, want * per_page / self.page_size)
        return max(2, int(budget // per_page))

    @property
    def model(self) -> torch.nn.Module:
        return self.loaded.model

    # ---- what the scheduler asks of the engine (worker.scheduler.prepare) --------------------

    @property
    def vocab_size(self) -> int:
        return self.model_config.vocab_size

    @property
    def kv_bytes_per_token_layer(self) -> int:
        """KV bytes one cached token takes in one layer (as the pages hold it, FP8 or not)."""
        return KVPool.bytes_per_location(1, self.kv.num_kv_heads, self.kv.head_dim, self.kv.dtype)

    def graph_batch_size(self, batch_size: int) -> int | None:
        """The captured CUDA-graph batch size a decode pass of ``batch_size`` requests is padded
        to, or None when it runs eagerly (no graphs, or more requests than captured)."""
        return self.graph_runner.batch_size_for(batch_size) if self.graph_runner is not None else None

    @torch.inference_mode()
    def forward(self, fi: ForwardInput) -> ForwardOutput:
        """Run the pass and sample: ``sample(fi, forward_logits(fi))`` (logprobs, when asked
        for, come back in the same copy as the tokens: worker.engine.logprobs)."""
        return self.sample(fi, self.forward_logits(fi))

    @torch.inference_mode()
    def forward_logits(self, fi: ForwardInput) -> torch.Tensor:
        """Run the pass: logits [B, vocab] on the device, nothing sampled yet.

        Nothing here waits for the GPU: under overlap the host returns while the pass runs."""
        if self.stream is None:
            with self.kernels():
                return self._logits(fi)
        self.stream.wait_stream(self.scheduler_stream)
        copied = (fi.load_slots, fi.sampling.temperature, *fi.sampling.side_buffers)
        for t in copied:  # buffers copied on the scheduler stream
            t.record_stream(self.stream)
        with torch.cuda.stream(self.stream), self.kernels():
            return self._logits(fi)

    @torch.inference_mode()
    def sample(
        self, fi: ForwardInput, logits: torch.Tensor, token_bitmask: torch.Tensor | None = None
    ) -> ForwardOutput:
        """Sample the pass's tokens from its logits, write each into token_pool, start its copy
        to the host. ``token_bitmask``: structured output's host bitmask for this batch
        (worker.engine.grammar), copied to the device here without waiting."""
        if self.stream is None:
            with self.kernels():
                return self._sample(fi, logits, token_bitmask)
        with torch.cuda.stream(self.stream), self.kernels():
            return self._sample(fi, logits, token_bitmask)

    def _logits(self, fi: ForwardInput) -> torch.Tensor:
        if self.split is not None and self.split.applies(fi):
            return self.split.logits(self, fi)
        if fi.graph_bs is not None:
            assert self.graph_runner is not None, "a graph batch size without captured graphs"
            self.backend.plan_for_replay(fi.layout, fi.graph_bs)
            return self.graph_runner.run(fi)
        input_ids = self.token_pool[fi.load_slots, fi.positions].to(torch.int64)
        batch = ForwardBatch(
            input_ids=input_ids,
            positions=fi.positions,
            out_loc=fi.out_loc,
            sample_idx=fi.sample_idx,
            layout=fi.layout,
            backend=self.backend,
            attn_meta=self.backend.plan(fi.layout),
            kv=self.kv,
        )
        return self.model(batch)

    def _sample(
        self, fi: ForwardInput, logits: torch.Tensor, token_bitmask: torch.Tensor | None
    ) -> ForwardOutput:
        if token_bitmask is not None:
            token_bitmask = token_bitmask.to(self.device, non_blocking=True)
        logits = logits[: fi.batch_size]
        wanted = fi.sampling.logprobs
        # raw logprobs: before penalties and the grammar's mask change the logits
        raw = raw_logprobs(logits, wanted) if wanted is not None else None
        next_tokens = self.sampler.sample(logits, fi.sampling, token_bitmask).to(torch.int32)
        if self.tp.size > 1:
            # NOTE: the ranks' logits are the same, but an unseeded request draws its seed per
            # process (intake.choice_seed): rank 0's tokens are every rank's
            broadcast(next_tokens)
        self.token_pool[fi.write_slots, fi.write_pos] = next_tokens
        packed = pack_with_tokens(next_tokens, raw, wanted)  # the tokens alone without logprobs
        copy_done = None
        if self.device.type == "cuda":
            packed_cpu = torch.empty(packed.shape, dtype=torch.int32, pin_memory=True)
            packed_cpu.copy_(packed, non_blocking=True)
            copy_done = torch.cuda.Event()
            copy_done.record()
            packed = packed_cpu
        next_tokens_cpu, logprobs_cpu = unpack(packed, fi.batch_size, wanted)
        return ForwardOutput(next_tokens_cpu, copy_done, logprobs_cpu)
