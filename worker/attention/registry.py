"""Attention backends by name (worker.lazy's registry style); heavy backends are imported
only when chosen."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from worker.attention.names import ATTENTION_BACKENDS
from worker.lazy import load_callable

if TYPE_CHECKING:
    from worker.attention.base import AttentionBackend
    from worker.kvcache.pool import KVPool
    from worker.models.config import ModelConfig


def available_backends() -> list[str]:
    return sorted(ATTENTION_BACKENDS)


def resolve_backend_name(name: str, device: torch.device | str) -> str:
    """ "auto" -> "flashinfer" on CUDA, "sdpa" elsewhere; other names pass through checked."""
    if name == "auto":
        return "flashinfer" if torch.device(device).type == "cuda" else "sdpa"
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose from {['auto', *available_backends()]}")
    return name


def create_backend(
    name: str,
    *,
    kv: KVPool,
    page_table: torch.Tensor,
    model_config: ModelConfig,
    page_size: int,
    device: torch.device | str,
    **kw: Any,
) -> AttentionBackend:
    """Build the backend ``name`` ("torch", "sdpa", "flashinfer" or "auto") for this KV pool.

    Each backend module exposes ``create(*, kv, page_table, model_config, page_size, device, **kw)``.
    """
    resolved = resolve_backend_name(name, device)
    try:
        factory = load_callable(resolved, ATTENTION_BACKENDS, "attention backend")
    except ImportError as exc:
        raise ImportError(
            f"attention backend {resolved!r} needs a package that is missing ({exc}); "
            f"install it (pip install 'radixq[gpu]' for flashinfer) or set attention = \"torch\""
        ) from exc
    backend: AttentionBackend = factory(
        kv=kv, page_table=page_table, model_config=model_config, page_size=page_size, device=device, **kw
    )
    return backend
