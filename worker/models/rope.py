"""Rotary position embedding (neox layout: the two halves of head_dim rotate together)."""

from __future__ import annotations

import math

import torch


def inverse_frequencies(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    """float32 [head_dim // 2] inverse frequencies, with "linear" or "llama3" scaling applied."""
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim)
    )
    rope_type = (scaling or {}).get("rope_type", scaling.get("type") if scaling else None) or "default"
    if rope_type == "default":
        return inv_freq
    assert scaling is not None
    factor = float(scaling["factor"])
    if rope_type == "linear":
        return inv_freq / factor
    if rope_type != "llama3":
        raise NotImplementedError(f"rope scaling type {rope_type!r} is not supported")
    low_freq_factor = float(scaling["low_freq_factor"])
    high_freq_factor = float(scaling["high_freq_factor"])
    old_context_len = float(scaling["original_max_position_embeddings"])
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths are slowed by `factor`, short ones kept, the band between interpolated.
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding:
    """cos/sin tables for every position up to ``max_positions``, float32 on ``device``.

    NOTE: deliberately not an nn.Module buffer, so casting the model to bfloat16 leaves the
    tables in float32; the model moves it along with itself via ``to``.
    """

    def __init__(
        self,
        head_dim: int,
        max_positions: int,
        theta: float,
        scaling: dict | None,
        device: torch.device | str,
    ) -> None:
        inv_freq = inverse_frequencies(head_dim, theta, scaling).to(device)
        positions = torch.arange(max_positions, dtype=torch.float32, device=device)
        freqs = torch.outer(positions, inv_freq)
        self.cos_cache = freqs.cos()  # [max_positions, head_dim // 2]
        self.sin_cache = freqs.sin()

    def to(self, device: torch.device | str) -> RotaryEmbedding:
        self.cos_cache = self.cos_cache.to(device)
        self.sin_cache = self.sin_cache.to(device)
        return self

    def apply(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Rotate x [T, heads, head_dim] by positions [T], computing in float32."""
        cos = self.cos_cache[positions].unsqueeze(1)
        sin = self.sin_cache[positions].unsqueeze(1)
        x1, x2 = x.float().chunk(2, dim=-1)
        out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        return out.to(x.dtype)
