"""The paged KV cache: per layer one K and one V buffer of pages, in the model's dtype or FP8."""

from __future__ import annotations

import torch

from worker.kvcache.lazy_zeros import lazy_zeros

FP8_E4M3_MAX = 448.0  # the largest finite float8_e4m3fn value
# Calibrated scales map the largest |k| or |v| seen at load to FP8_E4M3_MAX / HEADROOM, so
# later values up to HEADROOM times larger still fit before saturating.
HEADROOM = 2.0
KV_CACHE_DTYPES = {"auto": None, "fp8_e4m3": torch.float8_e4m3fn}


class KVPool:
    """K and V buffers of shape [num_pages, num_kv_heads, page_size, head_dim] per layer.

    Location ``loc`` is token ``loc % page_size`` of page ``loc // page_size`` (see
    worker.attention.base). Heads are outermost inside a page (FlashInfer's "HND" layout),
    so one head's keys of a page are one contiguous run of page_size * head_dim values:
    decode attention reads a head's KV in long runs.

    ``dtype`` is what the pages hold; ``model_dtype`` what the model computes in (queries,
    and what ``store`` takes and ``gather`` returns). They differ for an FP8 cache
    (``cache_dtype=torch.float8_e4m3fn``): a page then holds k / k_scale[layer] and
    v / v_scale[layer], saturated at +-448, and readers multiply back (FlashInfer takes the
    two scales per layer as its ``k_scale`` / ``v_scale``). Scales are 1.0 until
    ``set_scales`` (worker.engine.kv_calibration fits them at load).
    """

    layout = "HND"

    def __init__(
        self,
        num_layers: int,
        num_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        cache_dtype: torch.dtype | None = None,
    ) -> None:
        self.num_layers = num_layers
        self.num_pages = num_pages
        self.page_size = page_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.model_dtype = dtype
        self.dtype = cache_dtype or dtype
        self.quantized = self.dtype == torch.float8_e4m3fn
        self.device = torch.device(device)
        self.k_scale = [1.0] * num_layers
        self.v_scale = [1.0] * num_layers
        shape = (num_layers, num_pages, num_kv_heads, page_size, head_dim)
        self._k = lazy_zeros(shape, self.dtype, self.device)  # CPU: resident as pages are written
        self._v = lazy_zeros(shape, self.dtype, self.device)

    def k_buffer(self, layer_id: int) -> torch.Tensor:
        """The layer's K pages, [num_pages, num_kv_heads, page_size, head_dim]."""
        return self._k[layer_id]

    def v_buffer(self, layer_id: int) -> torch.Tensor:
        return self._v[layer_id]

    def set_scales(self, k_scale: list[float], v_scale: list[float]) -> None:
        """Per-layer scales of an FP8 cache; set before any KV is stored (and before CUDA
        graphs are captured: FlashInfer bakes the scales into the captured launches)."""
        if len(k_scale) != self.num_layers or len(v_scale) != self.num_layers:
            raise ValueError(f"{len(k_scale)} / {len(v_scale)} scales for {self.num_layers} layers")
        if not all(s > 0 for s in (*k_scale, *v_scale)):
            raise ValueError("KV scales must be positive")
        self.k_scale, self.v_scale = list(k_scale), list(v_scale)

    def gather(self, layer_id: int, locs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V at locations locs ([N]) as [N, kv_heads, head_dim] each, in model_dtype."""
        page, off = self._split(locs)
        k, v = self._k[layer_id][page, :, off], self._v[layer_id][page, :, off]
        if not self.quantized:
            return k, v
        return self._dequantize(k, self.k_scale[layer_id]), self._dequantize(v, self.v_scale[layer_id])

    def store(self, layer_id: int, out_loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write k/v ([T, kv_heads, head_dim]) at locations out_loc ([T])."""
        page, off = self._split(out_loc)
        if self.quantized:
            k, v = self._quantize(k, self.k_scale[layer_id]), self._quantize(v, self.v_scale[layer_id])
        self._k[layer_id][page, :, off] = k.to(self.dtype)
        self._v[layer_id][page, :, off] = v.to(self.dtype)

    def _quantize(self, x: torch.Tensor, scale: float) -> torch.Tensor:
        # the cast alone would turn values past 448 into NaN: saturate first
        return (x.float() * (1.0 / scale)).clamp_(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(self.dtype)

    def _dequantize(self, x: torch.Tensor, scale: float) -> torch.Tensor:
        return (x.float() * scale).to(self.model_dtype)

    def _split(self, locs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        locs = locs.long()
        return torch.div(locs, self.page_size, rounding_mode="floor"), locs % self.page_size

    @staticmethod
    def bytes_per_location(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        """KV bytes of one token over all layers, ``dtype`` being what the pages hold."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * num_kv_heads * head_dim * itemsize


def cache_dtype_of(name: str) -> torch.dtype | None:
    """An EngineConfig ``kv_cache_dtype`` as the pages' dtype (None: the model's dtype)."""
    if name not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype={name!r}: expected one of {sorted(KV_CACHE_DTYPES)}")
    return KV_CACHE_DTYPES[name]
