"""The attention backends and FlashInfer kernels by name, torch-free (the settings
``attention``, ``decode_kernel`` and ``prefill_ragged_kernel`` take their choices from here;
worker.attention.registry builds them)."""

from __future__ import annotations

# name -> "module:factory"; the factory is called with the keyword arguments of create_backend.
ATTENTION_BACKENDS: dict[str, str] = {
    "torch": "worker.attention.torch_ref:create",  # the per-request reference (the oracle)
    "sdpa": "worker.attention.torch_sdpa:create",  # batched torch SDPA: the default off CUDA
    "flashinfer": "worker.attention.flashinfer:create",
}
ATTENTION_CHOICES = ("auto", *ATTENTION_BACKENDS)  # "auto": flashinfer on CUDA, else sdpa
DECODE_KERNELS = ("auto", "fa2", "xqa")  # FlashInfer decode: "auto" picks XQA over FP8 pages on sm90
RAGGED_KERNELS = ("fa2", "fa3")  # FlashInfer, prefill over FP8 pages: the pass's own bf16 K/V
