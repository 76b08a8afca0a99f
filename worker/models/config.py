"""The model shape read from a Hugging Face config.json, frozen once at load time."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
_ARCH_BY_MODEL_TYPE = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def config_json_path(path: str | Path) -> Path:
    """The config.json of ``path``: the file itself, or ``path/config.json`` for a directory."""
    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"no model config.json at {path}")
    return file


@dataclass(frozen=True)
class LayerAttention:
    """How one decoder layer attends; every attention backend honours all three fields.

    ``sliding_window`` > 0: a query sees itself and the ``sliding_window - 1`` tokens before it
    (Hugging Face's ``sliding_window``; FlashInfer's ``window_left`` is ``sliding_window - 1``),
    0: every earlier token. ``logit_softcap`` > 0: each score s becomes
    ``logit_softcap * tanh(s / logit_softcap)`` before the softmax (Gemma 2), 0: none.
    ``scale`` multiplies q.k; 0 means ``head_dim ** -0.5``.
    """

    sliding_window: int = 0
    logit_softcap: float = 0.0
    scale: float = 0.0

    def scale_for(self, head_dim: int) -> float:
        return self.scale or head_dim**-0.5


def _eos_list(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list | tuple) else [int(value)]


@dataclass(frozen=True)
class ModelConfig:
    """Everything the decoder needs; Llama, Qwen2 and Qwen3 differ only in these fields.

    ``rope_scaling`` is None for plain RoPE, else the HF scaling dict (``rope_type`` key, e.g.
    "llama3"). ``eos_token_ids`` joins the EOS ids of config.json and generation_config.json.
    """

    architecture: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    qk_norm: bool
    attention_bias: bool
    eos_token_ids: tuple[int, ...]
    tp_size: int = 1  # tensor-parallel ranks: the head and intermediate counts are one rank's share
    # Per layer, how it attends (sliding window, soft-capping, scale); () means LayerAttention()
    # for every layer.
    layer_attention: tuple[LayerAttention, ...] = ()

    def __post_init__(self) -> None:
        if self.num_q_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"num_q_heads={self.num_q_heads} is not a multiple of num_kv_heads={self.num_kv_heads}"
            )
        if self.layer_attention and len(self.layer_attention) != self.num_layers:
            raise ValueError(
                f"layer_attention has {len(self.layer_attention)} entries for {self.num_layers} layers"
            )

    def attention_of(self, layer_id: int) -> LayerAttention:
        """How layer ``layer_id`` attends."""
        return self.layer_attention[layer_id] if self.layer_attention else LayerAttention()

    def shard(self, tp_size: int) -> ModelConfig:
        """One rank's shape under ``tp_size``-way tensor parallelism: query heads, KV heads and
        the MLP's intermediate size divided (hidden size, vocabulary and norms stay whole)."""
        if tp_size == 1:
            return self
        assert self.tp_size == 1, "the config is already sharded"
        for field in ("num_q_heads", "num_kv_heads", "intermediate_size"):
            value = getattr(self, field)
            if value % tp_size != 0:
                raise ValueError(
                    f"tensor_parallel_size={tp_size}: the model's {field}={value} is not divisible by it"
                )
        return dataclasses.replace(
            self,
            num_q_heads=self.num_q_heads // tp_size,
            num_kv_heads=self.num_kv_heads // tp_size,
            intermediate_size=self.intermediate_size // tp_size,
            tp_size=tp_size,
        )

    @property
    def o_proj_bias(self) -> bool:
        """Llama's attention_bias also covers o_proj; Qwen2's q/k/v bias does not."""
        return self.attention_bias and self.architecture == "LlamaForCausalLM"

    @classmethod
    def from_hf_dir(cls, path: str | Path) -> ModelConfig:
        """Read ``path`` (a HF model directory or a config.json file); HF fills in defaults."""
        from transformers import AutoConfig

        file = config_json_path(path)
        raw = json.loads(file.read_text())
        archs = raw.get("architectures") or [_ARCH_BY_MODEL_TYPE.get(raw.get("model_type", ""), "")]
        arch = archs[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"{file}: architecture {arch!r} is not supported (supported: {SUPPORTED_ARCHITECTURES})"
            )
        model_type = raw.get("model_type") or next(k for k, v in _ARCH_BY_MODEL_TYPE.items() if v == arch)
        fields = {k: v for k, v in raw.items() if k != "model_type"}
        hf = AutoConfig.for_model(model_type, **fields)
        if getattr(hf, "mlp_bias", False):
            raise ValueError(f"{file}: mlp_bias=true is not supported")
        rope = dict(getattr(hf, "rope_parameters", None) or {})
        rope_theta = float(rope.pop("rope_theta", getattr(hf, "rope_theta", 10000.0)))
        rope_scaling = rope if rope.get("rope_type", "default") != "default" else None
        if rope_scaling is None and raw.get("rope_scaling"):
            rope_scaling = dict(raw["rope_scaling"])
        head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
        eos = _eos_list(raw.get("eos_token_id"))
        gen_file = file.parent / "generation_config.json"
        if gen_file.is_file():
            eos += _eos_list(json.loads(gen_file.read_text()).get("eos_token_id"))
        default_bias = arch == "Qwen2ForCausalLM"
        return cls(
            architecture=arch,
            vocab_size=int(hf.vocab_size),
            hidden_size=int(hf.hidden_size),
            num_layers=int(hf.num_hidden_layers),
            num_q_heads=int(hf.num_attention_heads),
            num_kv_heads=int(getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads),
            head_dim=int(head_dim),
            intermediate_size=int(hf.intermediate_size),
            rms_norm_eps=float(hf.rms_norm_eps),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=int(hf.max_position_embeddings),
            tie_word_embeddings=bool(hf.tie_word_embeddings),
            qk_norm=arch == "Qwen3ForCausalLM",
            attention_bias=bool(getattr(hf, "attention_bias", default_bias)) or default_bias,
            eos_token_ids=tuple(dict.fromkeys(eos)),
        )
