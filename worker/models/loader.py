"""load_model: a model name/path + load format -> an eval-mode CausalLM on a device."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from worker.models import hub
from worker.models.aliases import ALIASES
from worker.models.architectures import check_quantization
from worker.models.config import ModelConfig, config_json_path
from worker.models.decoder import CausalLM
from worker.models.families import model_class
from worker.models.fp8 import fp8_matrices, quantize_model
from worker.models.fp8_checkpoint import (
    Checkpoint,
    fp8_modules,
    per_channel_tensors,
    prepare_fp8,
    quantize_strays,
)
from worker.models.gguf import ensure_converted
from worker.models.names import LOAD_FORMATS
from worker.models.weights import dummy_weights

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedModel:
    """A ready model. ``path`` is the local HF-style directory (config.json, tokenizer files);
    for dummy weights it is the directory holding the config, or the config file itself."""

    model: CausalLM
    config: ModelConfig
    path: str
    name: str


_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def default_dtype(device: torch.device) -> torch.dtype:
    """The model dtype when none is asked for: bfloat16 on CUDA, float32 elsewhere."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """An EngineConfig dtype name ("auto" or one of _DTYPES) as a torch dtype on ``device``."""
    if name == "auto":
        return default_dtype(device)
    if name not in _DTYPES:
        raise ValueError(f"dtype={name!r}: expected one of {['auto', *_DTYPES]}")
    return _DTYPES[name]


def resolve_model_dir(
    model: str, load_format: str = "auto", cache_dir: str | Path | None = None
) -> tuple[Path, str]:
    """(local HF directory, short name) for an alias, GGUF file, HF directory or hub id (cached,
    else downloaded: worker.models.hub).

    GGUF inputs are converted once into the cache. Not valid for load_format="dummy".
    """
    if load_format not in LOAD_FORMATS or load_format == "dummy":
        raise ValueError(f"load_format must be one of {LOAD_FORMATS[:3]} here, got {load_format!r}")
    if model in ALIASES:
        return ensure_converted(ALIASES[model].locate(), name=model, cache_dir=cache_dir), model
    path = Path(model).expanduser()
    if path.is_file() and (path.suffix == ".gguf" or load_format == "gguf"):
        return ensure_converted(path, cache_dir=cache_dir), path.stem.lower()
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        has_safetensors = any(path.glob("*.safetensors"))
        if ggufs and (load_format == "gguf" or not has_safetensors):
            if len(ggufs) > 1:
                raise ValueError(f"{path} holds several GGUF files {[g.name for g in ggufs]}; pass one file")
            return ensure_converted(ggufs[0], cache_dir=cache_dir), ggufs[0].stem.lower()
        if has_safetensors:
            return path, path.name.lower()
        raise FileNotFoundError(f"{path} holds no *.safetensors or *.gguf weights")
    if path.exists():
        raise ValueError(
            f"cannot load {path}: expected a directory, a .gguf file or an alias {sorted(ALIASES)}"
        )
    return _from_hub(model), model.rsplit("/", 1)[-1].lower()


def _from_hub(repo_id: str) -> Path:
    """The hub snapshot of ``repo_id``: cached, else downloaded (worker.models.hub)."""
    try:
        return hub.snapshot(repo_id, log.info)
    except hub.HubUnavailable as exc:
        raise FileNotFoundError(
            f"model {repo_id!r} is not a known alias {sorted(ALIASES)} or a local path: {exc}"
        ) from None


def _safetensors_weights(model_dir: Path):
    from safetensors import safe_open

    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir} holds no *.safetensors files")
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


_COLUMN_PARALLEL = (".q_proj.", ".k_proj.", ".v_proj.", ".gate_proj.", ".up_proj.")
_ROW_PARALLEL = (".o_proj.", ".down_proj.")


def rank_shard(name: str, tensor: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """Rank ``rank``'s part of the canonical tensor ``name`` (worker.models.weights) under
    ``size``-way tensor parallelism: column-parallel projections keep their rows (output
    features), row-parallel ones their columns (input features), experts' projections
    included; everything else (a router too) is replicated.

    NOTE: a row-parallel bias is added once, after the all-reduce sums the ranks' partial
    outputs: rank 0 keeps it and the others hold zeros."""
    if size == 1:
        return tensor
    if any(f in name for f in _COLUMN_PARALLEL):
        return tensor.chunk(size, dim=0)[rank]
    if any(f in name for f in _ROW_PARALLEL):
        if name.endswith("_scale"):  # FP8 per-output-channel scales: every column shares them
            return tensor
        if name.endswith(".bias"):
            return tensor if rank == 0 else torch.zeros_like(tensor)
        return tensor.chunk(size, dim=1)[rank]
    return tensor


def _sharded(
    weights: Iterable[tuple[str, torch.Tensor]], rank: int, size: int
) -> Iterator[tuple[str, torch.Tensor]]:
    for name, tensor in weights:
        yield name, rank_shard(name, tensor, rank, size)


def load_model(
    model: str,
    *,
    load_format: str = "auto",
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
    cache_dir: str | Path | None = None,
    quantization: str = "auto",
    tp_rank: int = 0,
    tp_size: int = 1,
) -> LoadedModel:
    """Load ``model`` (alias, HF dir, GGUF file, hub id; or a config for "dummy").

    dtype None: default_dtype(device); ``cache_dir``: where GGUF conversions are cached;
    ``quantization`` (worker.models.names.QUANTIZATIONS) "fp8": the projections' weights in
    FP8 after loading and sharding (worker.models.fp8); a checkpoint published in FP8
    (worker.models.fp8_checkpoint) loads into FP8 layers for "auto" and "fp8", dequantized
    for "none". ``tp_rank``/``tp_size``: this rank's share of the model (ModelConfig.shard;
    ``config`` of the result is the sharded one).
    """
    device = torch.device(device)
    dtype = dtype or default_dtype(device)
    scheme = None
    if load_format == "dummy":
        model_path, name = config_json_path(model), Path(model).stem.lower()
        config = ModelConfig.from_hf_dir(model_path)
        path = str(Path(model))
    else:
        model_dir, name = resolve_model_dir(model, load_format, cache_dir)
        config = ModelConfig.from_hf_dir(model_dir)
        path = str(model_dir)
        scheme = check_quantization(json.loads(config_json_path(model_dir).read_text()), path)
    full_config, config = config, config.shard(tp_size)
    family = model_class(config.architecture)
    with torch.device("meta"):
        net = family(config, dtype, rope_device=device)
    weights: Iterable[tuple[str, torch.Tensor]]
    if load_format == "dummy":
        net = net.to_empty(device=device)
        with torch.device("meta"):
            whole = family(full_config, dtype, rope_device="meta")
        weights = dummy_weights(whole, dtype, device, seed=0)
    elif scheme is None:
        net = net.to_empty(device=device)
        weights = family.weight_map.canonical(_safetensors_weights(Path(path)), full_config)
    else:  # published in FP8: the FP8 layers made on the meta device, no model-dtype copy
        ckpt = Checkpoint(Path(path))
        if quantization != "none":
            fp8 = fp8_modules(net, family.weight_map, ckpt, scheme, full_config)
            prepare_fp8(net, lambda param: quantization == "fp8" or param in fp8)
        net = net.to_empty(device=device)
        dequantize_to = dtype if quantization == "none" else None
        source = per_channel_tensors(ckpt, scheme, device, dequantize_to=dequantize_to)
        weights = family.weight_map.canonical(source, full_config)
    weights = _sharded(weights, tp_rank, tp_size)
    if scheme is not None:
        weights = quantize_strays(weights, net)
    loaded = net.load_weights(weights)
    missing = net.expected_weight_keys() - loaded
    if missing:
        raise ValueError(
            f"{path}: checkpoint lacks weights for {sorted(missing)[:8]} ({len(missing)} in all)"
        )
    net.eval().requires_grad_(False)
    quantize_model(net, quantization)
    quantized = fp8_matrices(net)
    if quantized and device.type == "cuda":
        torch.cuda.empty_cache()  # NOTE: the replaced bf16 weights' blocks, or the KV pool sized from free memory misses them
    published = f", published {scheme.method} {scheme.weight_scales}" if scheme else ""
    log.info(
        "loaded %s (%s, %s%s%s%s) on %s", name, config.architecture, dtype,
        f", {quantized} projections in FP8" if quantized else "", published,
        f", tensor-parallel rank {tp_rank} of {tp_size}" if tp_size > 1 else "", device,
    )  # fmt: skip
    return LoadedModel(model=net, config=config, path=path, name=name)
