"""Which checkpoints published quantized radixq loads, torch-free: a config.json's
``quantization_config`` read into an ``Fp8Scheme`` (how its FP8 weights are scaled and what
their scale tensors are called), or refused in one line naming the scheme (worker.preflight
runs this before a Redis or an engine starts; worker.models.fp8_checkpoint loads the tensors).

Accepted, all with e4m3 weights, symmetric, one float32 scale per weight region
(weight ~ data * scale):

    compressed-tensors  format float-quantized / naive-quantized, weights {num_bits 8, type
                        float, strategy channel | tensor | block}, input activations none or
                        8-bit float (dynamic per token, dynamic per tensor, or static per tensor)
                        tensors X.weight, X.weight_scale ([out, 1], a scalar, or
                        [ceil(out / bn), ceil(in / bk)] for block_structure [bn, bk])
    fp8                 fmt e4m3, activation_scheme dynamic | static;
                        weight_block_size [bn, bk]: X.weight, X.weight_scale_inv (blocks);
                        none: X.weight, X.weight_scale (per tensor)
    fbgemm_fp8          X.weight, X.weight_scale [out, 1] (per channel)

The engine runs one FP8 scheme (worker.models.fp8): per-output-channel weight scales and
per-token activation scales computed at run time. Per-tensor scales broadcast to per-channel
exactly; block scales are re-scaled per channel at load (a rounding, measured in
docs/models.md); static input scales (``input_scale``) are not used: activations are quantized
per token at run time, whose scale never clips and is never coarser than one per tensor.
Layers the checkpoint keeps unquantized (``ignore``, ``modules_to_not_convert``) are stored in
the model dtype and loaded as such.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SUPPORTED_SCHEMES = (
    "compressed-tensors FP8 (float-quantized: channel, tensor or block weight scales)",
    "fp8 (e4m3: per-tensor or weight_block_size block scales)",
    "fbgemm_fp8",
)
_CT_FORMATS = ("float-quantized", "naive-quantized")


@dataclass(frozen=True)
class Fp8Scheme:
    """How a checkpoint's e4m3 weights are scaled. ``weight_scales``: "channel" (scale
    [out, 1] or [out]), "tensor" (one value), "block" (``block`` = (rows, cols) of a weight
    block, scale [ceil(out / rows), ceil(in / cols)]); ``scale_suffix``: the scale tensor's
    name after the weight's module (``X.weight`` -> ``X.<scale_suffix>``)."""

    method: str
    weight_scales: str
    scale_suffix: str = "weight_scale"
    block: tuple[int, int] | None = None


def parse_quantization(quant: Any) -> Fp8Scheme:
    """The Fp8Scheme of a ``quantization_config``; ValueError naming the scheme otherwise."""
    if not isinstance(quant, dict):
        raise ValueError(_refusal(f"quantization_config {quant!r}"))
    method = str(quant.get("quant_method", "unknown"))
    if method == "compressed-tensors":
        return _compressed_tensors(quant)
    if method == "fp8":
        fmt = str(quant.get("fmt", "e4m3"))
        if fmt != "e4m3":
            raise ValueError(_refusal(f"quant_method 'fp8' with fmt {fmt!r}"))
        activations = str(quant.get("activation_scheme", "dynamic"))
        if activations not in ("dynamic", "static"):
            raise ValueError(_refusal(f"quant_method 'fp8' with activation_scheme {activations!r}"))
        block = quant.get("weight_block_size")
        if block:
            return Fp8Scheme("fp8", "block", "weight_scale_inv", _block_of(block, "fp8 weight_block_size"))
        return Fp8Scheme("fp8", "tensor")
    if method == "fbgemm_fp8":
        return Fp8Scheme("fbgemm_fp8", "channel")
    raise ValueError(_refusal(f"quant_method {method!r}"))


def _compressed_tensors(quant: dict[str, Any]) -> Fp8Scheme:
    sparsity = quant.get("sparsity_config") or {}
    if sparsity and sparsity.get("format", "dense") != "dense":
        raise ValueError(_refusal(f"compressed-tensors sparsity format {sparsity.get('format')!r}"))
    groups = quant.get("config_groups") or {}
    if not groups:
        raise ValueError(_refusal("compressed-tensors without config_groups"))
    schemes = set()
    for name, group in groups.items():
        fmt = str(group.get("format") or quant.get("format") or "float-quantized")
        if fmt not in _CT_FORMATS:
            raise ValueError(_refusal(f"compressed-tensors format {fmt!r} (group {name!r})"))
        schemes.add(_ct_group(name, group))
    if len(schemes) > 1:
        raise ValueError(
            _refusal(
                f"compressed-tensors groups with different FP8 weight scales {sorted(map(str, schemes))}"
            )
        )
    return schemes.pop()


def _ct_group(name: str, group: dict[str, Any]) -> Fp8Scheme:
    weights = group.get("weights") or {}
    what = f"compressed-tensors group {name!r}: weights {_describe(weights)}"
    acts = group.get("input_activations")
    if acts:
        what += f", input activations {_describe(acts)}"
    if group.get("output_activations"):
        raise ValueError(_refusal(f"{what} with quantized output activations"))
    fp8_weights = weights.get("num_bits") == 8 and weights.get("type") == "float"
    strategy = str(weights.get("strategy"))
    if not fp8_weights or not weights.get("symmetric", True) or weights.get("dynamic", False):
        raise ValueError(_refusal(what))
    if acts and not (
        acts.get("num_bits") == 8 and acts.get("type") == "float" and acts.get("symmetric", True)
    ):
        raise ValueError(_refusal(what))
    if acts and str(acts.get("strategy")) not in ("token", "tensor", "group"):
        raise ValueError(_refusal(what))
    if strategy == "block":
        return Fp8Scheme("compressed-tensors", "block", block=_block_of(weights.get("block_structure"), what))
    if strategy not in ("channel", "tensor"):
        raise ValueError(_refusal(what))
    return Fp8Scheme("compressed-tensors", strategy)


def _block_of(value: Any, what: str) -> tuple[int, int]:
    if not (isinstance(value, list | tuple) and len(value) == 2 and all(int(v) > 0 for v in value)):
        raise ValueError(_refusal(f"{what} block {value!r}"))
    return int(value[0]), int(value[1])


def _describe(args: dict[str, Any]) -> str:
    """A compressed-tensors QuantizationArgs in a few words: 'int 8-bit channel static'."""
    dynamic = "dynamic" if args.get("dynamic") else "static"
    return f"{args.get('type', '?')} {args.get('num_bits', '?')}-bit {args.get('strategy', '?')} {dynamic}"


def _refusal(scheme: str) -> str:
    return (
        f"{scheme} is not supported (checkpoints quantized as published: {'; '.join(SUPPORTED_SCHEMES)}; "
        'radixq quantizes bf16 weights itself with quantization = "fp8")'
    )
