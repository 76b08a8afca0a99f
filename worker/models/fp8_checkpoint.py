"""FP8 checkpoints as published (worker.models.checkpoint_quant names the schemes) loaded into
the engine's FP8 layers (worker.models.fp8) without a model-dtype copy of the weights.

Three steps, around the usual load (checkpoint -> family weight map -> shard -> parameters):

1. ``fp8_modules``: which parameters take FP8, read from the safetensors headers alone (the
   family's weight map run over meta tensors); ``prepare_fp8`` makes those projections
   Fp8Linear and those MoE blocks FP8 while the model is still on the meta device.
2. ``per_channel_tensors``: the checkpoint's tensors with each e4m3 ``X.weight`` followed by
   ``X.weight_scale`` float32 [out], one scale per output channel, whatever the checkpoint's
   scales are:

       [out, 1] or [out]         per channel: as they are
       one value                 per tensor: broadcast to every channel (exact)
       [ceil(out/bn), ceil(in/bk)] blocks: W = data * block scale in float32, chunk by chunk on
                                 the load device, then quantize_channels(W) (a second rounding)

   Static activation scales and KV scales are dropped (activations are quantized per token at
   run time; the KV cache follows kv_cache_dtype). With ``dequantize_to`` (quantization
   "none") each FP8 weight is instead data * scale in that dtype, exactly.
3. ``quantize_strays``: a weight stored in the model dtype (a layer the checkpoint left
   unquantized) whose parameter is FP8 (a fused module with an FP8 piece, or quantization
   "fp8") is quantized per channel, as quantization "fp8" does.

Per-channel scales are per row, so they concatenate where the model fuses rows (q/k/v,
gate/up, stacked experts: worker.models.weights derives a scale piece for each weight piece).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from worker.models.checkpoint_quant import Fp8Scheme
from worker.models.fp8 import QUANTIZED_PROJECTIONS, Fp8Linear, quantize_channels
from worker.models.moe import SparseMoE
from worker.models.weights import piece_table

if TYPE_CHECKING:
    from worker.models.config import ModelConfig
    from worker.models.weights import WeightMap

FP8 = torch.float8_e4m3fn
Weights = Iterable[tuple[str, torch.Tensor]]
# Per-tensor activation, zero-point and KV-cache tensors of the published formats: not weights.
_DROPPED = (
    ".input_scale",
    ".input_zero_point",
    ".weight_zero_point",
    ".output_scale",
    ".k_scale",
    ".v_scale",
)
_CHUNK_ELEMENTS = 1 << 24  # float32 elements of a block dequantization chunk (64 MiB)


class Checkpoint:
    """The safetensors files of a directory: tensor names in file order, each tensor read on
    demand (so a weight and its scale meet whatever file each lies in)."""

    def __init__(self, model_dir: Path) -> None:
        from safetensors import safe_open

        files = sorted(model_dir.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"{model_dir} holds no *.safetensors files")
        self._handles = [safe_open(str(f), framework="pt", device="cpu") for f in files]
        self.file_of: dict[str, Any] = {}
        for handle in self._handles:
            for name in handle.keys():
                self.file_of[name] = handle

    def read(self, name: str) -> torch.Tensor:
        return self.file_of[name].get_tensor(name)

    def meta(self, name: str) -> torch.Tensor:
        """A meta tensor of the stored shape; e4m3 for FP8 tensors, float32 for the others."""
        view = self.file_of[name].get_slice(name)
        dtype = FP8 if view.get_dtype() == "F8_E4M3" else torch.float32
        return torch.empty(view.get_shape(), dtype=dtype, device="meta")


def per_channel_tensors(
    ckpt: Checkpoint,
    scheme: Fp8Scheme,
    device: torch.device,
    *,
    meta: bool = False,
    dequantize_to: torch.dtype | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's (name, tensor) pairs with FP8 weights per channel (module docstring);
    ``meta``: shapes and dtypes only, from the headers."""
    read = ckpt.meta if meta else ckpt.read
    for name in ckpt.file_of:
        if name.endswith(_DROPPED) or name.endswith(f".{scheme.scale_suffix}"):
            continue  # a scale is read with its weight
        tensor = read(name)
        if tensor.dtype == torch.float8_e5m2:
            raise ValueError(f"checkpoint tensor {name!r} is float8_e5m2; radixq runs e4m3 weights")
        if tensor.dtype != FP8:
            yield name, tensor
            continue
        scale_name = name.removesuffix("weight") + scheme.scale_suffix
        if not name.endswith(".weight") or scale_name not in ckpt.file_of:
            raise ValueError(f"checkpoint tensor {name!r} is FP8 but has no {scale_name!r}")
        if meta:
            yield name, tensor
            yield f"{name}_scale", torch.empty(tensor.shape[0], device="meta")
            continue
        data, scale = tensor.to(device), read(scale_name).to(device, torch.float32)
        if dequantize_to is not None:
            yield name, dequantize(data, scale, scheme, name).to(dequantize_to)
        else:
            data, channel = to_per_channel(data, scale, scheme, name)
            yield name, data
            yield f"{name}_scale", channel


def _blocks_of(scale: torch.Tensor, rows: slice, cols: int, block: tuple[int, int]) -> torch.Tensor:
    """The block scales [ceil(out/bn), ceil(in/bk)] spread over weight rows ``rows`` (start a
    multiple of bn) and all ``cols`` columns: one float32 value per weight element."""
    bn, bk = block
    start, stop = rows.start, rows.stop
    spread = scale[start // bn : -(-stop // bn)].repeat_interleave(bn, 0).repeat_interleave(bk, 1)
    return spread[: stop - start, :cols]


def _check_scale(data: torch.Tensor, scale: torch.Tensor, scheme: Fp8Scheme, name: str) -> None:
    out, cols = data.shape
    if scheme.weight_scales == "block":
        assert scheme.block is not None
        want = (-(-out // scheme.block[0]), -(-cols // scheme.block[1]))
        ok = tuple(scale.shape) == want
    else:
        want = (out, 1)
        ok = scale.numel() == 1 or (scale.numel() == out and scale.dim() <= 2 and scale.shape[0] == out)
    if data.dim() != 2 or not ok:
        raise ValueError(
            f"checkpoint tensor {name!r} {tuple(data.shape)}: its {scheme.method} {scheme.weight_scales} "
            f"scale has shape {tuple(scale.shape)}, expected {want}"
        )


def _row_chunks(data: torch.Tensor, block_rows: int) -> Iterator[slice]:
    """Row ranges of about _CHUNK_ELEMENTS elements, each starting at a multiple of block_rows."""
    out, cols = data.shape
    step = max(block_rows, _CHUNK_ELEMENTS // max(cols, 1) // block_rows * block_rows)
    for start in range(0, out, step):
        yield slice(start, min(start + step, out))


def dequantize(data: torch.Tensor, scale: torch.Tensor, scheme: Fp8Scheme, name: str) -> torch.Tensor:
    """data * scale in float32 (a block scale spread over its block)."""
    _check_scale(data, scale, scheme, name)
    if scheme.weight_scales != "block":
        return data.float() * scale.reshape(-1, 1)
    assert scheme.block is not None
    out = torch.empty(data.shape, dtype=torch.float32, device=data.device)
    for rows in _row_chunks(data, scheme.block[0]):
        out[rows] = data[rows].float() * _blocks_of(scale, rows, data.shape[1], scheme.block)
    return out


def to_per_channel(
    data: torch.Tensor, scale: torch.Tensor, scheme: Fp8Scheme, name: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 [out, in], float32 [out]) with weight ~ data * scale[:, None]: the same values
    for per-channel and per-tensor scales; block-scaled weights dequantized and quantized
    again per channel (scale = max|W[n]| / 448), a chunk of rows at a time."""
    _check_scale(data, scale, scheme, name)
    if scheme.weight_scales != "block":
        return data, scale.reshape(-1).expand(data.shape[0]).contiguous()
    assert scheme.block is not None
    out_data = torch.empty_like(data)
    out_scale = torch.empty(data.shape[0], dtype=torch.float32, device=data.device)
    for rows in _row_chunks(data, scheme.block[0]):
        w = data[rows].float() * _blocks_of(scale, rows, data.shape[1], scheme.block)
        out_data[rows], out_scale[rows] = quantize_channels(w)
    return out_data, out_scale


def fp8_modules(
    net: nn.Module, weight_map: WeightMap, ckpt: Checkpoint, scheme: Fp8Scheme, config: ModelConfig
) -> set[str]:
    """The parameters of ``net`` (unsharded names) that some FP8 checkpoint weight fills."""
    table = piece_table(net)
    stream = per_channel_tensors(ckpt, scheme, torch.device("meta"), meta=True)
    return {
        table[name].param
        for name, tensor in weight_map.canonical(stream, config)
        if tensor.dtype == FP8 and name in table
    }


def prepare_fp8(net: nn.Module, wanted: Callable[[str], bool]) -> int:
    """Make FP8 (empty, on the meta device) each projection and MoE block whose weight
    parameter ``wanted`` names; returns how many weight matrices (a stack of experts counts
    once) are FP8."""
    count = 0
    for prefix, module in list(net.named_modules()):
        at = f"{prefix}." if prefix else ""
        if isinstance(module, SparseMoE) and (wanted(f"{at}w13") or wanted(f"{at}w2")):
            w13, w2 = module.w13, module.w2
            module.set_fp8(*_empty_fp8(w13.shape), *_empty_fp8(w2.shape))
            count += 2
        for name in QUANTIZED_PROJECTIONS:
            child = getattr(module, name, None)
            if isinstance(child, nn.Linear) and wanted(f"{at}{name}.weight"):
                data, scale = _empty_fp8(child.weight.shape)
                setattr(module, name, Fp8Linear(data, scale, child.bias, child.weight.dtype))
                count += 1
    return count


def _empty_fp8(shape: torch.Size) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty(shape, dtype=FP8, device="meta"), torch.empty(shape[:-1], device="meta")


def quantize_strays(weights: Weights, net: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Canonical (name, tensor) pairs with each model-dtype weight whose parameter is FP8
    quantized per channel (``name`` and ``name_scale``), on the parameter's device."""
    params = dict(net.named_parameters())
    fp8_dest = {
        name: params[piece.param].device
        for name, piece in piece_table(net).items()
        if params[piece.param].dtype == FP8
    }
    for name, tensor in weights:
        if name in fp8_dest and tensor.dtype != FP8:
            data, scale = quantize_channels(tensor.to(fp8_dest[name]))
            yield name, data
            yield f"{name}_scale", scale
        else:
            yield name, tensor
