"""The attention backend contract shared by the engine, the models and every backend.

Layout of the KV cache (see worker.kvcache.pool.KVPool): per layer one K and one V tensor
of pages, [num_pages, num_kv_heads, page_size, head_dim] (FlashInfer's "HND" layout). A KV
*location* ``loc`` names one token's slot in the pool: token ``loc % page_size`` of page
``loc // page_size``. ``page_table[slot, i]`` is the location of token i of the request in
``slot``; a page's tokens are consecutive locations, so a request's row holds runs of
``page_size`` consecutive locations, each starting at a multiple of page_size.

One forward pass over a batch of B requests and T = sum(extend_lens) new tokens:

    request i:  [ cached_lens[i] tokens already in KV | extend_lens[i] new tokens ]
                 positions 0 .. cached-1                 positions cached .. seq_len-1

Queries are the T new tokens, concatenated request by request. Each new token attends
causally to every earlier token of its own request, cached ones included.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import torch

    from worker.forward import BatchLayout


class AttentionBackend(ABC):
    """Paged attention over the KV pool.

    Contract: ``plan`` is called once per forward pass, before the model runs, and returns
    opaque metadata; ``forward`` is then called once per layer with that metadata. The
    caller has already stored this pass's K/V at their ``out_loc`` locations in the pool
    for that layer (ForwardBatch.attention does it), so ``forward`` reads the pool; when
    ``wants_new_kv(meta)`` it is also handed those K/V as the model computed them (``new_kv``,
    before an FP8 pool rounded them) and attends to them from there instead.

    CUDA graphs (worker.engine.graph.GraphRunner) are used only when ``supports_cuda_graphs``
    is true; a backend that sets it implements the three graph hooks below, which the base
    class leaves unsupported. Their order: ``init_cuda_graphs`` once; per batch size,
    ``capture_meta`` and then the captured passes (which must read their metadata only
    from fixed device buffers); per decode step, ``plan_for_replay`` and then the replay.
    """

    supports_cuda_graphs: ClassVar[bool] = False

    @abstractmethod
    def plan(self, layout: BatchLayout) -> Any:
        """Build per-pass metadata (index tensors, FlashInfer plan) for ``layout``."""

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,
        layer_id: int,
        meta: Any,
        new_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Attend: q is [T, num_q_heads, head_dim]; returns [T, num_q_heads, head_dim].

        ``new_kv``: this pass's keys and values, [T, num_kv_heads, head_dim] each in the model
        dtype (unit last stride; rows and heads may be strided), given exactly when
        ``wants_new_kv(meta)``; backends that do not want them ignore the argument."""

    def wants_new_kv(self, meta: Any) -> bool:
        """Whether ``forward`` with this metadata attends this pass's own keys and values from
        its ``new_kv`` argument rather than from the pool (FlashInfer's prefill over FP8 pages
        does: worker.attention.flashinfer_fp8_prefill). The caller then passes them."""
        return False

    def init_cuda_graphs(self, batch_sizes: list[int], max_seq_len: int) -> None:
        """Allocate fixed-address metadata for decode graphs of each of ``batch_sizes``.

        Called once, before any capture. ``max_seq_len`` bounds every request's length."""
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graphs")

    def capture_meta(self, batch_size: int) -> Any:
        """Metadata of a decode pass over ``batch_size`` dummy one-token requests, to warm up
        and capture with; it lives in the buffers that ``plan_for_replay`` rewrites."""
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graphs")

    def plan_for_replay(self, layout: BatchLayout, batch_size: int) -> Any:
        """Rewrite, in place, the metadata captured for ``batch_size`` so that a replay
        attends for ``layout``: a decode layout (``is_decode``) of at most ``batch_size``
        requests. Rows past ``layout.batch_size`` are padding whose outputs are garbage.

        Runs on the stream that then replays, after the previous pass was enqueued there.
        Returns the same metadata object that ``capture_meta(batch_size)`` returned."""
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graphs")
