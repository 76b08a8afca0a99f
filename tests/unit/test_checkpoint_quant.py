"""Which ``quantization_config`` radixq loads (worker.models.checkpoint_quant), torch-free: the
published FP8 schemes are read into their weight-scale layout; every other scheme is refused
by the preflight (before a Redis or an engine starts) in one line naming it and the list."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fp8_checkpoints import compressed_tensors_config
from worker.engine.config import EngineConfig
from worker.models.architectures import check_quantization
from worker.models.checkpoint_quant import SUPPORTED_SCHEMES, Fp8Scheme
from worker.preflight import PreflightError, check_model


def _ct(weights: dict, inputs: dict | None, fmt: str = "float-quantized") -> dict:
    group = {"targets": ["Linear"], "weights": weights, "input_activations": inputs}
    return {"quant_method": "compressed-tensors", "format": fmt, "config_groups": {"group_0": group}}


INT8 = {"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True, "dynamic": False}
INT8_TOKEN = {"num_bits": 8, "type": "int", "strategy": "token", "symmetric": True, "dynamic": True}
INT4 = {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": True}
FP4 = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "symmetric": True}
FP8_BLOCK = {
    "num_bits": 8,
    "type": "float",
    "strategy": "block",
    "block_structure": [128, 128],
    "symmetric": True,
}
FP8_GROUP = {"num_bits": 8, "type": "float", "strategy": "group", "group_size": 128, "dynamic": True}

ACCEPTED = [
    (compressed_tensors_config("channel", ["lm_head"]), Fp8Scheme("compressed-tensors", "channel")),
    (compressed_tensors_config("tensor", [], static_inputs=True), Fp8Scheme("compressed-tensors", "tensor")),
    (_ct(FP8_BLOCK, FP8_GROUP), Fp8Scheme("compressed-tensors", "block", block=(128, 128))),
    (
        {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "weight_block_size": [128, 128],
        },
        Fp8Scheme("fp8", "block", "weight_scale_inv", (128, 128)),
    ),
    ({"quant_method": "fp8", "activation_scheme": "static"}, Fp8Scheme("fp8", "tensor")),
    ({"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0}, Fp8Scheme("fbgemm_fp8", "channel")),
]

REFUSED = [
    ({"quant_method": "gptq", "bits": 4, "group_size": 128}, "quant_method 'gptq'"),
    ({"quant_method": "awq", "bits": 4, "version": "gemm"}, "quant_method 'awq'"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "quant_method 'bitsandbytes'"),
    ({"quant_method": "mxfp4"}, "quant_method 'mxfp4'"),
    ({"quant_method": "fp8", "fmt": "e5m2"}, "fmt 'e5m2'"),
    (_ct(INT8, INT8_TOKEN, "int-quantized"), "compressed-tensors format 'int-quantized'"),
    (_ct(INT8, INT8_TOKEN, "naive-quantized"), "weights int 8-bit channel static"),
    (_ct(INT4, None, "pack-quantized"), "compressed-tensors format 'pack-quantized'"),
    (_ct(FP4, FP4, "nvfp4-pack-quantized"), "format 'nvfp4-pack-quantized'"),
    (_ct(FP4, None), "weights float 4-bit tensor_group static"),
]


@pytest.mark.parametrize(("quant", "want"), ACCEPTED)
def test_published_fp8_schemes_are_read(quant: dict, want: Fp8Scheme) -> None:
    assert check_quantization({"quantization_config": quant}, "config.json") == want


def _model_dir(tmp_path: Path, quant: dict) -> Path:
    (tmp_path / "config.json").write_text(
        json.dumps({"architectures": ["LlamaForCausalLM"], "quantization_config": quant})
    )
    return tmp_path


@pytest.mark.parametrize(("quant", "named"), REFUSED)
def test_other_schemes_are_refused_by_the_preflight_in_one_line(
    quant: dict, named: str, tmp_path: Path
) -> None:
    model = _model_dir(tmp_path, quant)
    with pytest.raises(PreflightError) as err:
        check_model(EngineConfig(model=str(model)))
    line = str(err.value)
    assert "\n" not in line and named in line and "is not supported" in line
    assert all(scheme in line for scheme in SUPPORTED_SCHEMES)


def test_the_text_config_of_image_text_checkpoints_is_read(tmp_path: Path) -> None:
    raw = {"text_config": {"quantization_config": {"quant_method": "awq"}}}
    with pytest.raises(ValueError, match="quant_method 'awq'"):
        check_quantization(raw, "config.json")
