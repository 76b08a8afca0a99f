"""FP8 weights (EngineConfig ``quantization = "fp8"``): e4m3 matrices with one scale per output
channel, activations quantized per token at run time, GEMMs in FP8 with float32 accumulation.

    W [N, K] (model dtype)  ->  W_q = W / w_scale[:, None] in e4m3, w_scale = max|W[n]| / 448
    x [T, K]                ->  x_q = x / x_scale[:, None] in e4m3, x_scale = max|x[t]| / 448
    y [T, N] = (x_q @ W_q^T) * x_scale[:, None] * w_scale[None, :]   (+ bias), in the model dtype

On CUDA (compute capability 8.9 and up) the GEMM is ``torch._scaled_mm`` with those row-wise
scales; elsewhere it is emulated: the same quantized values, multiplied in float32
(tests/unit/test_fp8_weights.py checks the model against transformers; the GPU path is checked
against this emulation on the device). Embeddings, routers and the LM head stay in the model
dtype. The norms and the gated activations before qkv/gate-up and down projections hand over
their output already quantized (worker.kernels.ops ``fp8=True``), so only o_proj quantizes its
own input. MoE experts (worker.models.moe) follow the same rule per expert: ``quantize_channels``
on the stacked [E, N, K] weights, per-token activations inside worker.kernels.moe.
Checkpoints published in FP8 load into the same layers (worker.models.fp8_checkpoint).
"""

from __future__ import annotations

import torch
from torch import nn

from worker.kernels.ops import FP8_MAX, Fp8Rows, quantize_fp8_rows
from worker.models.moe import SparseMoE
from worker.models.names import QUANTIZATIONS

# The projections that become Fp8Linear, by attribute name in the decoder's modules.
QUANTIZED_PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


class Fp8Linear(nn.Module):
    """y = x W^T (+ b) with W as e4m3 [N, K] and per-output-channel float32 scales.

    ``forward`` takes activations in the model dtype (quantized here per row) or already
    quantized as worker.kernels.ops.Fp8Rows."""

    def __init__(
        self,
        weight: torch.Tensor,
        weight_scale: torch.Tensor,
        bias: torch.Tensor | None,
        out_dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)  # float8_e4m3fn [N, K]
        self.weight_scale = nn.Parameter(weight_scale, requires_grad=False)  # float32 [N]
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.out_dtype = out_dtype
        self.in_features = int(weight.shape[1])
        self.out_features = int(weight.shape[0])

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Fp8Linear:
        """Quantize a linear layer's weight per output channel (the bias stays as it is)."""
        w = linear.weight.detach()
        data, scale = quantize_channels(w)
        bias = None if linear.bias is None else linear.bias.detach()
        return cls(data, scale, bias, w.dtype)

    def forward(self, x: torch.Tensor | Fp8Rows) -> torch.Tensor:
        rows = x if isinstance(x, Fp8Rows) else quantize_fp8_rows(x)
        if _scaled_mm_ok(rows.data):
            out = torch._scaled_mm(
                rows.data,
                self.weight.t(),
                scale_a=rows.scale[:, None],
                scale_b=self.weight_scale[None, :],
                out_dtype=self.out_dtype,
            )
        else:
            out = emulated_fp8_matmul(rows, self.weight, self.weight_scale).to(self.out_dtype)
        return out if self.bias is None else out + self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fp8 e4m3 per-channel"


def quantize_channels(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 data, float32 scale) of a weight [..., N, K] per output channel (its last-but-one
    axis): scale = max|W[..., n, :]| / 448, data = W / scale rounded (saturated)."""
    w32 = weight.float()
    scale = (w32.abs().amax(dim=-1) / FP8_MAX).clamp_(min=1e-12)
    data = (w32 / scale[..., None]).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return data, scale


def emulated_fp8_matmul(rows: Fp8Rows, weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """(x_q @ W_q^T) * x_scale * w_scale in float32: what the FP8 GEMM computes, on any device."""
    product = rows.data.float() @ weight.float().t()
    return product * rows.scale[:, None] * weight_scale[None, :]


def _scaled_mm_ok(data: torch.Tensor) -> bool:
    """Whether torch's FP8 GEMM runs here: CUDA with FP8 tensor cores (sm_89+), a non-empty batch."""
    if not data.is_cuda or data.shape[0] == 0:
        return False
    return torch.cuda.get_device_capability(data.device) >= (8, 9)


def fp8_matrices(model: nn.Module) -> int:
    """How many weight matrices of ``model`` are FP8 (a stack of experts counts once)."""
    linears = sum(isinstance(m, Fp8Linear) for m in model.modules())
    return linears + sum(2 for m in model.modules() if isinstance(m, SparseMoE) and m.w13_scale is not None)


def takes_fp8(module: object) -> bool:
    """Whether a projection wants its input as Fp8Rows (the fused norm / SiLU-mul kernels' output)."""
    return isinstance(module, Fp8Linear)


def quantize_model(model: nn.Module, quantization: str) -> int:
    """Replace the decoder's projections by Fp8Linear and MoE experts' stacked weights by FP8
    ones (``quantization == "fp8"``); returns how many weight matrices (a stack of experts
    counts once) were replaced (0 for "none" and "auto", and for weights already FP8). The
    model-dtype weights are released as each goes. Routers and the LM head stay in the model
    dtype."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization={quantization!r}: expected one of {list(QUANTIZATIONS)}")
    if quantization != "fp8":
        return 0
    replaced = 0
    for module in list(model.modules()):
        if isinstance(module, SparseMoE) and module.w13_scale is None:
            module.set_fp8(*quantize_channels(module.w13.detach()), *quantize_channels(module.w2.detach()))
            replaced += 2
        for name in QUANTIZED_PROJECTIONS:
            child = getattr(module, name, None)
            if isinstance(child, nn.Linear):
                setattr(module, name, Fp8Linear.from_linear(child))
                replaced += 1
    return replaced
