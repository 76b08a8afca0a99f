"""The paged KV cache: per layer one K and one V buffer of pages."""

from __future__ import annotations

import torch


class KVPool:
    """K and V buffers of shape [num_pages, num_kv_heads, page_size, head_dim] per layer.

    Location ``loc`` is token ``loc % page_size`` of page ``loc // page_size`` (see
    worker.attention.base). Heads are outermost inside a page (FlashInfer's "HND" layout),
    so one head's keys of a page are one contiguous run of page_size * head_dim values:
    decode attention reads a head's KV in long runs.
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
    ) -> None:
        self.num_layers = num_layers
        self.num_pages = num_pages
        self.page_size = page_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        shape = (num_layers, num_pages, num_kv_heads, page_size, head_dim)
        self._k = torch.zeros(shape, dtype=dtype, device=self.device)
        self._v = torch.zeros(shape, dtype=dtype, device=self.device)

    def k_buffer(self, layer_id: int) -> torch.Tensor:
        """The layer's K pages, [num_pages, num_kv_heads, page_size, head_dim]."""
        return self._k[layer_id]

    def v_buffer(self, layer_id: int) -> torch.Tensor:
        return self._v[layer_id]

    def gather(self, layer_id: int, locs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V at locations locs ([N]) as [N, kv_heads, head_dim] each."""
        page, off = self._split(locs)
        return self._k[layer_id][page, :, off], self._v[layer_id][page, :, off]

    def store(self, layer_id: int, out_loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write k/v ([T, kv_heads, head_dim]) at locations out_loc ([T])."""
        page, off = self._split(out_loc)
        self._k[layer_id][page, :, off] = k.to(self.dtype)
        self._v[layer_id][page, :, off] = v.to(self.dtype)

    def _split(self, locs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        locs = locs.long()
        return torch.div(locs, self.page_size, rounding_mode="floor"), locs % self.page_size

    @staticmethod
    def bytes_per_location(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        itemsize = torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * num_kv_heads * head_dim * itemsize
