"""Rotary position embedding (neox layout: the two halves of head_dim rotate together).

Scalings: "linear", "llama3", "longrope" (Phi-3.x / Phi-4). Every variant becomes the same
two tables, cos and sin [max_positions, head_dim // 2] in float32, which the fused kernels
(worker.kernels.ops) read; what differs between variants is only how the tables are filled:

- longrope: positions below ``original_max_position_embeddings`` rotate with the short
  factors, positions from there on with the long ones, and both tables carry the attention
  factor (mscale) that transformers multiplies cos and sin by.
- partial rotary (``rotary_dim`` < head_dim, Phi-4-mini): only rotary_dim dims of a head
  rotate. Their frequencies fill the first rotary_dim // 2 columns; the other columns hold
  cos 1, sin 0 (no rotation). The neox pairing of the kernels (dim i with i + head_dim // 2)
  then matches the checkpoint's pairing (i with i + rotary_dim // 2) once the q and k rows of
  each head are reordered at load by ``rotary_permutation`` (q.k is unchanged by a common
  reordering of both).
"""

from __future__ import annotations

import math

import torch


def _base_frequencies(dim: int, theta: float) -> torch.Tensor:
    exponents = torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim
    return 1.0 / (theta**exponents)


def rope_type_of(scaling: dict | None) -> str:
    return (scaling or {}).get("rope_type", (scaling or {}).get("type")) or "default"


def inverse_frequencies(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    """float32 [head_dim // 2] inverse frequencies, with "linear" or "llama3" scaling applied
    (longrope's two sets: longrope_frequencies)."""
    inv_freq = _base_frequencies(head_dim, theta)
    rope_type = rope_type_of(scaling)
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


def longrope_frequencies(
    dim: int, theta: float, scaling: dict, max_positions: int
) -> tuple[torch.Tensor, torch.Tensor, int, float]:
    """(short inv_freq, long inv_freq, original context length, attention factor) as
    transformers computes them for "longrope"."""
    original = int(scaling["original_max_position_embeddings"])
    base = _base_frequencies(dim, theta)
    short = base / torch.tensor(scaling["short_factor"], dtype=torch.float32, device="cpu")
    long = base / torch.tensor(scaling["long_factor"], dtype=torch.float32, device="cpu")
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        factor = float(scaling.get("factor") or max_positions / original)
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    return short, long, original, float(attention_factor)


def rotary_permutation(head_dim: int, rotary_dim: int) -> torch.Tensor:
    """int64 [head_dim]: new dim j of a head takes old dim perm[j], so that old rotary pair
    (i, i + rotary_dim // 2) lands on (i, i + head_dim // 2) and the pass-through dims fill
    the rest of each half (module docstring)."""
    half, rot_half = head_dim // 2, rotary_dim // 2
    passing = list(range(rotary_dim, head_dim))
    first = list(range(rot_half)) + passing[: half - rot_half]
    second = list(range(rot_half, rotary_dim)) + passing[half - rot_half :]
    return torch.tensor(first + second, dtype=torch.int64)


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
        rotary_dim: int = 0,
    ) -> None:
        dim = rotary_dim or head_dim
        # NOTE: built on the CPU whatever the default device (models are built under "meta")
        positions = torch.arange(max_positions, dtype=torch.float32, device="cpu")
        mscale = 1.0
        if rope_type_of(scaling) == "longrope":
            assert scaling is not None
            short, long, original, mscale = longrope_frequencies(dim, theta, scaling, max_positions)
            freqs = torch.where(
                positions[:, None] < original, torch.outer(positions, short), torch.outer(positions, long)
            )
        else:
            freqs = torch.outer(positions, inverse_frequencies(dim, theta, scaling))
        cos = torch.ones(max_positions, head_dim // 2, device="cpu")  # pass-through: no rotation
        sin = torch.zeros(max_positions, head_dim // 2, device="cpu")
        cos[:, : dim // 2] = freqs.cos() * mscale
        sin[:, : dim // 2] = freqs.sin() * mscale
        self.cos_cache = cos.to(device)  # [max_positions, head_dim // 2]
        self.sin_cache = sin.to(device)

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
