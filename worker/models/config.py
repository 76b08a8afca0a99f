"""The model shape read from a Hugging Face config.json, frozen once at load time.

``ModelConfig`` holds what the engine, the KV pool and the attention backends read (layers,
heads, per-layer attention) and the options of the shared layers (worker.models.layers,
.moe, .rope); each family (worker.models.families) fills it from the HF config in its
``config_from_hf``, starting from ``base_fields``.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from worker.models.architectures import SUPPORTED_ARCHITECTURES, architecture_of, check_quantization

__all__ = ["SUPPORTED_ARCHITECTURES", "HfSource", "LayerAttention", "ModelConfig", "MoEConfig"]


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


@dataclass(frozen=True)
class MoEConfig:
    """A sparse MLP: each token's hidden state goes to its ``top_k`` of ``num_experts`` gated
    MLPs (router softmax, then top-k), weighted by the router's probabilities, renormalised to
    sum to 1 over the chosen experts when ``renormalize`` (Mixtral always; Qwen3-MoE when
    ``norm_topk_prob``). ``layers``: the layers whose MLP is sparse, the others dense."""

    num_experts: int
    top_k: int
    intermediate_size: int  # per expert; one rank's share under tensor parallelism
    renormalize: bool
    layers: tuple[int, ...]


def _eos_list(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list | tuple) else [int(value)]


@dataclass(frozen=True)
class ModelConfig:
    """Everything the decoder needs. ``architecture`` picks the family; the other fields are
    the shared layers' options.

    ``rope_scaling`` is None for plain RoPE, else the HF scaling dict (``rope_type`` key, e.g.
    "llama3", "linear", "longrope"). ``eos_token_ids`` joins the EOS ids of config.json and
    generation_config.json.
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
    attention_bias: bool  # bias on q, k and v
    eos_token_ids: tuple[int, ...]
    tp_size: int = 1  # tensor-parallel ranks: the head and intermediate counts are one rank's share
    # Per layer, how it attends (sliding window, soft-capping, scale); () means LayerAttention()
    # for every layer.
    layer_attention: tuple[LayerAttention, ...] = ()
    o_proj_bias: bool = False
    hidden_act: str = "silu"  # the gated MLP's activation: "silu" or "gelu_pytorch_tanh" (GeGLU)
    final_logit_softcap: float = 0.0  # > 0: logits become cap * tanh(logits / cap) (Gemma 2)
    # > 0: the rope base of sliding-window layers, unscaled (Gemma 3's rope_local_base_freq)
    sliding_rope_theta: float = 0.0
    rotary_dim: int = 0  # dims of each head that rotate (partial_rotary_factor); 0: head_dim
    moe: MoEConfig | None = None

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
        the MLPs' intermediate sizes (experts' too) divided (hidden size, vocabulary, norms and
        the router stay whole)."""
        if tp_size == 1:
            return self
        assert self.tp_size == 1, "the config is already sharded"
        sizes = {
            "num_q_heads": self.num_q_heads,
            "num_kv_heads": self.num_kv_heads,
            "intermediate_size": self.intermediate_size,
        }
        if self.moe is not None:
            sizes["moe_intermediate_size"] = self.moe.intermediate_size
        for field, value in sizes.items():
            if value % tp_size != 0:
                raise ValueError(
                    f"tensor_parallel_size={tp_size}: the model's {field}={value} is not divisible by it"
                )
        moe = self.moe
        if moe is not None:
            moe = dataclasses.replace(moe, intermediate_size=moe.intermediate_size // tp_size)
        return dataclasses.replace(
            self,
            num_q_heads=self.num_q_heads // tp_size,
            num_kv_heads=self.num_kv_heads // tp_size,
            intermediate_size=self.intermediate_size // tp_size,
            tp_size=tp_size,
            moe=moe,
        )

    @classmethod
    def from_hf_dir(cls, path: str | Path) -> ModelConfig:
        """Read ``path`` (a HF model directory or a config.json file); HF fills in defaults and
        the architecture's family (worker.models.families) reads what it needs."""
        from worker.models.families import model_class

        file = config_json_path(path)
        raw = json.loads(file.read_text())
        arch = architecture_of(raw, str(file))
        check_quantization(raw, str(file))
        return model_class(arch).config_from_hf(HfSource(hf_config(raw), raw, file, arch))


class HfSource(NamedTuple):
    """What a family reads its ModelConfig from: transformers' config object (defaults filled
    in, rope parameters standardised), the raw config.json and its path, the architecture."""

    hf: Any
    raw: dict[str, Any]
    file: Path
    architecture: str


def hf_config(raw: dict[str, Any]) -> Any:
    """transformers' config object for a parsed config.json."""
    from transformers import AutoConfig

    from worker.models.architectures import MODEL_TYPES

    model_type = raw.get("model_type") or next(
        k for k, v in MODEL_TYPES.items() if v == architecture_of(raw, "config.json")
    )
    fields = {k: v for k, v in raw.items() if k != "model_type"}
    return AutoConfig.for_model(model_type, **fields)


def eos_ids(src: HfSource, *extra: Any) -> tuple[int, ...]:
    """The EOS ids of config.json (and of ``extra`` raw values), then generation_config.json's."""
    eos = _eos_list(src.raw.get("eos_token_id"))
    for value in extra:
        eos += _eos_list(value)
    gen_file = src.file.parent / "generation_config.json"
    if gen_file.is_file():
        eos += _eos_list(json.loads(gen_file.read_text()).get("eos_token_id"))
    return tuple(dict.fromkeys(eos))


def rope_of(params: dict | None, default_theta: float = 10000.0) -> tuple[float, dict | None]:
    """(theta, scaling or None) of one HF ``rope_parameters`` dict."""
    rope = dict(params or {})
    theta = float(rope.pop("rope_theta", default_theta))
    rope.pop("partial_rotary_factor", None)
    kind = rope.get("rope_type", rope.get("type", "default"))
    return theta, (rope if kind != "default" else None)


def sliding_windows(hf: Any) -> list[int]:
    """Each layer's sliding window (0: none), as transformers applies them: the layers that
    ``layer_types`` marks "sliding_attention" when it is set, else every layer when
    ``sliding_window`` is (Mistral, Mixtral, Phi-3, Qwen3-MoE with use_sliding_window)."""
    window = int(getattr(hf, "sliding_window", None) or 0)
    layer_types = getattr(hf, "layer_types", None)
    if layer_types is None:
        return [window] * int(hf.num_hidden_layers)
    return [window if kind == "sliding_attention" else 0 for kind in layer_types]


def base_fields(src: HfSource, hf: Any | None = None, *, biases: bool = True) -> dict[str, Any]:
    """The ModelConfig fields every family reads the same way from ``hf`` (default: src.hf);
    a family overrides what differs (``{**base_fields(src), ...}``). ``biases`` False: the
    family's attention has no bias whatever config.json says (Mistral, Mixtral, Phi-3)."""
    hf = src.hf if hf is None else hf
    if getattr(hf, "mlp_bias", False):
        raise ValueError(f"{src.file}: mlp_bias=true is not supported")
    params = dict(getattr(hf, "rope_parameters", None) or {})  # transformers 5; 4.x: attributes
    params.setdefault("rope_theta", getattr(hf, "rope_theta", 10000.0))
    params.setdefault("partial_rotary_factor", getattr(hf, "partial_rotary_factor", 1.0))
    theta, scaling = rope_of(params)
    if scaling is None and src.raw.get("rope_scaling"):
        scaling = dict(src.raw["rope_scaling"])
    if scaling is not None and scaling.get("rope_type", scaling.get("type")) == "longrope":
        scaling.setdefault("original_max_position_embeddings", hf.original_max_position_embeddings)
    head_dim = int(getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads)
    rotary_dim = int(head_dim * float(params.get("partial_rotary_factor", 1.0)))
    windows = sliding_windows(hf)
    bias = biases and bool(getattr(hf, "attention_bias", False))
    return dict(
        architecture=src.architecture,
        vocab_size=int(hf.vocab_size),
        hidden_size=int(hf.hidden_size),
        num_layers=int(hf.num_hidden_layers),
        num_q_heads=int(hf.num_attention_heads),
        num_kv_heads=int(getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads),
        head_dim=head_dim,
        intermediate_size=int(hf.intermediate_size),
        rms_norm_eps=float(hf.rms_norm_eps),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=int(hf.max_position_embeddings),
        tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
        qk_norm=False,
        attention_bias=bias,
        o_proj_bias=bias,  # Llama, Qwen3, Gemma: attention_bias covers o_proj too
        eos_token_ids=eos_ids(src),
        layer_attention=tuple(LayerAttention(sliding_window=w) for w in windows) if any(windows) else (),
        rotary_dim=rotary_dim if rotary_dim < head_dim else 0,
    )
