"""The attention contract's CUDA-graph capability: off unless a backend declares it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from worker.attention.base import AttentionBackend
from worker.attention.registry import create_backend
from worker.forward import BatchLayout
from worker.kvcache.pool import KVPool


class _EagerOnly(AttentionBackend):
    """A backend written against the contract's two abstract methods only."""

    def plan(self, layout: BatchLayout) -> None:
        return None

    def forward(self, q: torch.Tensor, layer_id: int, meta: object) -> torch.Tensor:
        return q


def _decode_layout(batch_size: int) -> BatchLayout:
    ones = torch.ones(batch_size, dtype=torch.int32)
    return BatchLayout(
        slots_cpu=torch.arange(batch_size, dtype=torch.int32), cached_lens_cpu=ones, extend_lens_cpu=ones
    )


def test_a_backend_without_graph_hooks_says_so_and_refuses_them():
    backend = _EagerOnly()
    assert backend.supports_cuda_graphs is False
    calls = [
        lambda: backend.init_cuda_graphs([1, 2], max_seq_len=64),
        lambda: backend.capture_meta(2),
        lambda: backend.plan_for_replay(_decode_layout(2), 2),
    ]
    for call in calls:
        with pytest.raises(NotImplementedError, match="_EagerOnly does not support CUDA graphs"):
            call()


@pytest.mark.parametrize(("name", "cls"), [("torch", "TorchRefBackend"), ("auto", "TorchSdpaBackend")])
def test_torch_backends_do_not_support_cuda_graphs(name: str, cls: str):
    config = SimpleNamespace(num_q_heads=4, head_dim=8)
    kv = KVPool(1, 4, 4, 2, 8, torch.float32, "cpu")
    page_table = torch.zeros(3, 16, dtype=torch.int32)
    backend = create_backend(
        name, kv=kv, page_table=page_table, model_config=config, page_size=4, device="cpu"
    )
    assert type(backend).__name__ == cls
    assert backend.supports_cuda_graphs is False
    with pytest.raises(NotImplementedError, match=f"{cls} does not support CUDA graphs"):
        backend.capture_meta(1)
