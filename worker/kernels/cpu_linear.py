"""Linear layers on the CPU through oneDNN: about half MKL's time for the engine's products.

torch's ``F.linear`` on a float32 CPU tensor calls MKL's sgemm. oneDNN's JIT kernels (in
every torch CPU build, reached through ``torch.ops.mkldnn._linear_pointwise``) ran a SmolLM2
decode step's linear layers in half the time on the dev box (docs/performance.md, CPU engine).
Their results differ from MKL's in the last bits (another summation order), as any two BLAS
libraries' do; the tests hold greedy tokens to transformers' on the same weights.

``use_onednn(False)`` (the engine setting ``onednn = false``) keeps torch's default for
ablation. Anything but float32 on the CPU always takes ``F.linear``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

_ENABLED = [True]  # NOTE: one switch per process, set by the engine from its config


def use_onednn(enabled: bool) -> None:
    """Switch oneDNN linears on or off for this process (the engine does, at start)."""
    _ENABLED[0] = enabled and torch.backends.mkldnn.is_available()


def _onednn_for(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return _ENABLED[0] and x.device.type == "cpu" and x.dtype == weight.dtype == torch.float32


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``: x [..., in], weight [out, in] -> [..., out]."""
    if not _onednn_for(x, weight):
        return F.linear(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


class OneDnnLinear(nn.Linear):
    """nn.Linear whose product goes through ``linear`` (same parameters, same state dict)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


def onednn_linears(model: nn.Module) -> int:
    """Route every plain nn.Linear of ``model`` through ``linear``; returns how many.

    NOTE: the model code builds its layers without knowing the device's kernels, so the engine
    retypes them after loading: OneDnnLinear adds no state to nn.Linear, only its forward.
    Subclasses of nn.Linear (quantized layers) keep their own forward.
    """
    count = 0
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = OneDnnLinear
            count += 1
    return count
