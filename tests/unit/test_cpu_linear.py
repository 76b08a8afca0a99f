"""oneDNN linears on the CPU (worker.kernels.cpu_linear) against torch's F.linear (MKL), and
the engine routing its model's layers through them (or not, with ``onednn = false``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from worker.kernels import cpu_linear
from worker.kernels.cpu_linear import OneDnnLinear, linear, onednn_linears, use_onednn
from worker.llm import LLM

TINY = str(Path(__file__).resolve().parents[2] / "configs" / "tiny-llama.json")


@pytest.fixture(autouse=True)
def restore_switch() -> Iterator[None]:
    before = cpu_linear._ENABLED[0]
    yield
    cpu_linear._ENABLED[0] = before


@pytest.mark.parametrize(
    "x_shape",
    [(16, 96), (1, 96), (0, 96), (3, 5, 96)],
    ids=["rows", "one-row", "no-rows", "3d"],
)
@pytest.mark.parametrize("with_bias", [False, True])
def test_onednn_linear_equals_f_linear(x_shape: tuple[int, ...], with_bias: bool) -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(x_shape, generator=gen)
    weight = torch.randn(40, 96, generator=gen)
    bias = torch.randn(40, generator=gen) if with_bias else None
    use_onednn(True)
    assert cpu_linear._onednn_for(x, weight)  # the oneDNN path, not F.linear again
    out = linear(x, weight, bias)
    assert out.shape == (*x_shape[:-1], 40)
    torch.testing.assert_close(out, F.linear(x, weight, bias), atol=1e-5, rtol=1e-5)
    strided = torch.randn(96, 16, generator=gen).t()  # a transposed (non-contiguous) input
    torch.testing.assert_close(linear(strided, weight), F.linear(strided, weight), atol=1e-5, rtol=1e-5)


def test_switched_off_or_not_float32_is_exactly_f_linear() -> None:
    gen = torch.Generator().manual_seed(2)
    x, weight = torch.randn(7, 32, generator=gen), torch.randn(12, 32, generator=gen)
    use_onednn(False)
    assert torch.equal(linear(x, weight), F.linear(x, weight))
    use_onednn(True)
    x16, w16 = x.bfloat16(), weight.bfloat16()
    assert torch.equal(linear(x16, w16), F.linear(x16, w16))


def test_only_plain_linears_are_retyped() -> None:
    class Custom(nn.Linear):
        pass

    model = nn.Sequential(nn.Linear(4, 4), Custom(4, 4), nn.Sequential(nn.Linear(4, 2)))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    assert onednn_linears(model) == 2
    assert [type(m) for m in (model[0], model[1], model[2][0])] == [OneDnnLinear, Custom, OneDnnLinear]
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())


@pytest.mark.parametrize("onednn", [True, False])
def test_a_cpu_engine_routes_every_projection_through_onednn(onednn: bool) -> None:
    """Each decoder layer's four projections (qkv, o, gate_up, down) on CPU: oneDNN unless off."""
    llm = LLM(TINY, load_format="dummy", device="cpu", num_pages=8, onednn=onednn)
    layers = llm.engine.model.model.layers
    projections = [m for layer in layers for m in layer.modules() if isinstance(m, nn.Linear)]
    assert len(projections) == 4 * len(layers)
    expected = OneDnnLinear if onednn else nn.Linear
    assert all(type(m) is expected for m in projections)
    assert cpu_linear._ENABLED[0] is onednn
