"""FP8 checkpoints written the way published ones are (import from test modules), from a
transformers model saved with ``save_pretrained``: its projection weights replaced by e4m3
tensors and float32 scales under the published names, ``quantization_config`` added to
config.json. The quantization is the tests' own (torch's e4m3 cast, scale = max|region| / 448),
independent of worker.models.

    compressed-tensors channel   X.weight e4m3, X.weight_scale [out, 1]
    compressed-tensors tensor    X.weight e4m3, X.weight_scale [1], X.input_scale [1] (static)
    fp8 block (Qwen, DeepSeek)   X.weight e4m3, X.weight_scale_inv [ceil(out/bn), ceil(in/bk)]

``write_fp8_checkpoint`` returns the dequantized weights (data * scale, float32) by tensor
name: loaded into transformers' model, they are the oracle's weights.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
# The linear layers an FP8 checkpoint quantizes (llm-compressor's targets ["Linear"] less its
# ignore list): attention and MLP projections, experts (Mixtral's w1/w2/w3 too); not routers.
PROJECTION = re.compile(
    r"\.(q_proj|k_proj|v_proj|o_proj|qkv_proj|gate_proj|up_proj|down_proj|gate_up_proj|w1|w2|w3)\.weight$"
)


def channel_quant(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3, scale [out, 1]): one scale per output row."""
    scale = (w.float().abs().amax(dim=1, keepdim=True) / E4M3_MAX).clamp(min=1e-12)
    return (w.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), scale


def tensor_quant(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3, scale [1]): one scale for the whole matrix."""
    scale = (w.float().abs().amax() / E4M3_MAX).clamp(min=1e-12).reshape(1)
    return (w.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), scale


def block_quant(w: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3, scale [ceil(out/bn), ceil(in/bk)]): one scale per bn x bk block (edge blocks
    partial), as Qwen's and DeepSeek's FP8 checkpoints store them."""
    bn, bk = block
    out, cols = w.shape
    rows_b, cols_b = -(-out // bn), -(-cols // bk)
    scale = torch.empty(rows_b, cols_b)
    data = torch.empty(out, cols, dtype=E4M3)
    for i in range(rows_b):
        for j in range(cols_b):
            tile = w[i * bn : (i + 1) * bn, j * bk : (j + 1) * bk].float()
            s = max(float(tile.abs().max()) / E4M3_MAX, 1e-12)
            scale[i, j] = s
            data[i * bn : (i + 1) * bn, j * bk : (j + 1) * bk] = (
                (tile / s).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
            )
    return data, scale


def block_dequant(data: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    bn, bk = block
    out, cols = data.shape
    spread = scale.repeat_interleave(bn, 0)[:out].repeat_interleave(bk, 1)[:, :cols]
    return data.float() * spread


def compressed_tensors_config(strategy: str, ignore: list[str], static_inputs: bool = False) -> dict:
    """llm-compressor's FP8_DYNAMIC preset (strategy "channel"), or FP8 with per-tensor weight
    and static per-tensor input scales (strategy "tensor", ``static_inputs``)."""
    inputs = (
        {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True, "dynamic": False}
        if static_inputs
        else {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True, "dynamic": True}
    )
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {
                    "num_bits": 8, "type": "float", "strategy": strategy, "symmetric": True,
                    "dynamic": False, "group_size": None, "observer": "minmax",
                },
                "input_activations": inputs,
                "output_activations": None,
            }
        },
        "ignore": ignore,
        "kv_cache_scheme": None,
    }  # fmt: skip


def write_fp8_checkpoint(
    model_dir: Path, kind: str, *, block: tuple[int, int] = (128, 128), keep: str | None = None
) -> dict[str, torch.Tensor]:
    """Rewrite the transformers checkpoint in ``model_dir`` as an FP8 checkpoint: ``kind``
    "channel", "tensor" (compressed-tensors) or "block" (quant_method fp8 with
    weight_block_size ``block``). ``keep``: a regex of projection names left unquantized
    (listed in the config's ignore list). Returns the dequantized projection weights."""
    (file,) = sorted(model_dir.glob("*.safetensors"))
    tensors = load_file(file)
    out: dict[str, torch.Tensor] = {}
    dequantized: dict[str, torch.Tensor] = {}
    ignore = ["lm_head"]
    for name, tensor in tensors.items():
        if not PROJECTION.search(name) or tensor.dim() != 2:
            out[name] = tensor
            continue
        module = name.removesuffix(".weight")
        if keep and re.search(keep, name):
            out[name] = tensor
            ignore.append(module)
            continue
        if kind == "block":
            data, scale = block_quant(tensor, block)
            out[name], out[f"{module}.weight_scale_inv"] = data, scale
            dequantized[name] = block_dequant(data, scale, block)
            continue
        data, scale = channel_quant(tensor) if kind == "channel" else tensor_quant(tensor)
        out[name], out[f"{module}.weight_scale"] = data, scale
        if kind == "tensor":  # a static input scale, as calibrated checkpoints carry one; this
            # one would clip every activation above 0.0448 (radixq does not use it)
            out[f"{module}.input_scale"] = torch.tensor([1e-4])
        dequantized[name] = data.float() * scale
    save_file({k: v.contiguous() for k, v in out.items()}, file, metadata={"format": "pt"})
    config_file = model_dir / "config.json"
    config = json.loads(config_file.read_text())
    if kind == "block":
        quant = {
            "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
            "weight_block_size": list(block), "modules_to_not_convert": ignore,
        }  # fmt: skip
    else:
        quant = compressed_tensors_config(kind, ignore, static_inputs=kind == "tensor")
    config["quantization_config"] = quant
    config_file.write_text(json.dumps(config, indent=2))
    return dequantized
