"""EngineConfig: the options the engine reads (model, device, KV pool, kernels, graphs,
tensor parallelism), built once at the edge and frozen; the scheduler's own are
worker.scheduler.config.SchedulerConfig. Each field is declared once, with its help, choices and
check (worker.options): the TOML loader, the environment, the flags and docs/configuration.md read it here."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from worker.attention.names import ATTENTION_CHOICES, DECODE_KERNELS, RAGGED_KERNELS
from worker.kernels.moe_tiles import FP8_SUMS
from worker.kvcache.names import KV_CACHE_DTYPES, KV_SCALES
from worker.models.aliases import DEFAULT_MODEL
from worker.models.names import DTYPES, LOAD_FORMATS, QUANTIZATIONS
from worker.options import at_least, check_options, option, within


@dataclass(frozen=True)
class EngineConfig:
    """Options of one engine. ``resolved()`` turns "auto" values into concrete ones.

    ``num_pages`` None sizes the KV pool from ``mem_fraction`` of free device memory (CUDA)
    or from ``cpu_kv_gib`` (CPU). ``max_seq_len`` None means the model's context length.
    """

    model: str = option(
        DEFAULT_MODEL,
        "alias, HF directory, `.gguf` file, `org/name` hub id (downloaded when not in the Hugging Face cache), "
        "or config.json for dummy weights",
        flags=("--model", "-m"),
    )
    load_format: str = option("auto", "`auto`, `safetensors`, `gguf`, `dummy`", choices=LOAD_FORMATS)
    device: str = option("auto", "`auto` (cuda when a GPU is there), `cpu`, `cuda`")
    dtype: str = option(
        "auto", "`auto` (bfloat16 on CUDA, float32 on CPU), `float32`, `float16`, `bfloat16`", choices=DTYPES
    )
    page_size: int = option(16, "tokens per KV page (prefix sharing is by whole pages)", check=at_least(1))
    num_pages: int | None = option(
        None,
        "KV pool size; empty: from `mem_fraction` of free GPU memory, or `cpu_kv_gib` on CPU",
        check=at_least(1),
    )
    mem_fraction: float = option(
        0.85, "share of free GPU memory for the KV pool", check=within(0, 1, low_open=True)
    )
    cpu_kv_gib: float = option(1.0, "KV pool size on CPU (resident only as its pages are first written)")
    cpu_threads: int = option(
        0,
        "torch threads of a CPU engine (0: every core the process may use, within a container's CPU quota); "
        "`radixq run --workers N` gives each worker cores / N unless this is a count",
        check=at_least(0, "0: every core"),
    )
    max_running_reqs: int = option(256, "requests decoding at once", check=at_least(1))
    max_seq_len: int | None = option(None, "context length; empty: the model's", check=at_least(2))
    kv_cache_dtype: str = option(
        "auto",
        "`auto` (the model's dtype) or `fp8_e4m3`: half the KV bytes, twice the tokens in memory",
        choices=KV_CACHE_DTYPES,
    )
    quantization: str = option(
        "auto",
        "`auto` (FP8 checkpoints in FP8, others in the model dtype), `none` (the model dtype; an FP8 "
        "checkpoint is dequantized at load), or `fp8`: projection weights in e4m3 with per-channel scales, "
        "activations quantized per token, FP8 GEMMs (emulated in float32 on CPU); embeddings and LM head "
        "stay in the model dtype",
        choices=QUANTIZATIONS,
    )
    kv_scales: str = option(
        "calibrated", "FP8 KV scales: `calibrated` per layer at load, or `unit` (1.0)", choices=KV_SCALES
    )
    overlap: bool = option(True, "overlap scheduling (false: plain loop, for debugging)")
    attention: str = option(
        "auto",
        "`auto` (`flashinfer` on CUDA, else `sdpa`), `flashinfer`, `sdpa` (torch SDPA, decode rows batched), "
        "`torch` (the per-request reference)",
        choices=ATTENTION_CHOICES,
    )
    decode_kernel: str = option(
        "auto",
        "FlashInfer decode kernel: `auto` (XQA over FP8 KV pages on Hopper, FA2 otherwise), `fa2`, `xqa`",
        choices=DECODE_KERNELS,
    )
    prefill_ragged_kernel: str = option(
        "fa2",
        "FlashInfer prefill over FP8 KV pages: the kernel for the pass's own bf16 keys and values, `fa2` "
        "or `fa3` (Hopper); cached prefixes are read from the pages by FA2 either way",
        choices=RAGGED_KERNELS,
    )
    cuda_graph: bool = option(True, "CUDA graphs for decode batches up to `cuda_graph_max_bs`")
    cuda_graph_max_bs: int | None = option(
        None,
        "largest decode batch captured as a CUDA graph; empty: `max_running_reqs` (a larger decode batch "
        "runs eagerly, host-bound)",
        check=at_least(1),
    )
    decode_split_sms: int = option(
        0,
        "experimental (CUDA, one GPU): a decode pass of at least `decode_split_min_batch` requests is cut in "
        "two halves whose layers interleave, each half's attention on a green context of this many SMs and "
        "its other kernels on the rest of the GPU, so attention and GEMMs overlap; eager (no CUDA graph); "
        "needs cuda-python (`cuda-bindings`); 0: off",
        check=at_least(0, "0: off"),
    )
    decode_split_min_batch: int = option(
        512, "smallest decode batch that `decode_split_sms` splits", check=at_least(2)
    )
    triton: bool = option(True, "fused Triton kernels on CUDA (false: the torch paths, for ablation)")
    moe_fp8_sums: str = option(
        "fast",
        "FP8 MoE experts on CUDA, the gate/up GEMM: `fast` (FP8 tensor cores, the whole sum in their "
        "accumulator), `tile` (FP8 tensor cores, sums moved to float32 every K tile), `exact` (products in "
        "fp16: the expert loop's values, prefill MoE ~1.6x slower); all three as far from float64 as the "
        "loop: docs/models.md",
        choices=FP8_SUMS,
    )
    onednn: bool = option(
        True,
        "float32 linear layers on CPU through oneDNN, about twice MKL's speed here (false: torch's default, "
        "MKL, for ablation)",
    )
    cache_dir: str = option("", "where converted models are cached (empty: `~/.cache/radixq/models`)")
    tensor_parallel_size: int = option(
        1,
        "processes (GPUs) one model is split over, one per rank on `cuda:0..N-1` of the worker's "
        "`CUDA_VISIBLE_DEVICES` (`--gpus`); rank 0 schedules, the others follow its batches; structured "
        "output is refused with N > 1. When it pays over a pool of TP=1 workers: docs/engine.md, Tensor parallelism",
        flags=("--tensor-parallel-size", "--tp"),
        check=at_least(1),
    )

    def __post_init__(self) -> None:
        check_options(self)

    @property
    def graph_max_bs(self) -> int:
        """The largest decode batch captured: ``cuda_graph_max_bs``, else ``max_running_reqs``
        (never more: no decode batch is larger)."""
        return min(self.cuda_graph_max_bs or self.max_running_reqs, self.max_running_reqs)

    def resolved(self) -> EngineConfig:
        """A copy with device "auto" resolved (cuda when available, else cpu)."""
        if self.device != "auto":
            return self
        import torch

        return dataclasses.replace(self, device="cuda" if torch.cuda.is_available() else "cpu")
