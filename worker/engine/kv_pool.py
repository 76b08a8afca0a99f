"""The paged KV cache: per layer one K and one V tensor of KV locations."""

from __future__ import annotations

import torch


class KVPool:
    """K and V buffers of shape [num_pages * page_size, num_kv_heads, head_dim] per layer.

    Location ``loc`` is a row of every layer's buffers; page p spans locations
    [p * page_size, (p + 1) * page_size). See worker.attention.base for the layout.
    """

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
        shape = (num_layers, num_pages * page_size, num_kv_heads, head_dim)
        self._k = torch.zeros(shape, dtype=dtype, device=self.device)
        self._v = torch.zeros(shape, dtype=dtype, device=self.device)

    @property
    def num_locations(self) -> int:
        return self.num_pages * self.page_size

    def k_cache(self, layer_id: int) -> torch.Tensor:
        return self._k[layer_id]

    def v_cache(self, layer_id: int) -> torch.Tensor:
        return self._v[layer_id]

    def store(self, layer_id: int, out_loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write k/v ([T, kv_heads, head_dim]) at locations out_loc ([T])."""
        self._k[layer_id].index_copy_(0, out_loc, k.to(self.dtype))
        self._v[layer_id].index_copy_(0, out_loc, v.to(self.dtype))

    @staticmethod
    def bytes_per_location(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        itemsize = torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * num_kv_heads * head_dim * itemsize
