"""A model's matmul shape for the floor (benchmarks/floor.py), read from config.json alone.

Dense layers, and Mixture-of-Experts layers (Qwen3-MoE, Mixtral): a MoE layer has
``num_experts`` gated MLPs of ``expert_intermediate`` and a router (hidden x E); each token
runs ``top_k`` of them. Read per decode step of ``B`` running requests: every attention and
dense weight, the routers, the LM head, and the experts at least one of the B tokens selects.
Under uniform routing (each token's k experts a uniform k-subset, as dummy weights give)
expert e is missed by one token with probability 1 - k/E, so the expected number read is

    active_experts(B) = E * (1 - (1 - k / E) ** B)      (B = 1: exactly k; B = 1,024: ~E)

Sliding-window layers (Gemma 2/3's local layers, Mistral's or Phi-3's when the config sets a
window) read at most ``window`` context tokens of KV per query. Multimodal checkpoints
(Gemma3ForConditionalGeneration) are read through their ``text_config``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int  # the dense MLP's (layers that are not MoE)
    vocab: int
    num_experts: int = 0  # routed experts per MoE layer; 0: a dense model
    top_k: int = 0
    expert_intermediate: int = 0
    moe_layers: int = 0  # layers whose MLP is the routed experts
    window: int = 0  # sliding window of the windowed layers (tokens); 0: none
    window_layers: int = 0  # layers that attend within the window

    @classmethod
    def from_config(cls, config: dict) -> ModelShape:
        text = config.get("text_config") or config
        heads, layers = text["num_attention_heads"], text["num_hidden_layers"]
        num_experts = text.get("num_experts") or text.get("num_local_experts") or 0
        moe: dict[str, int] = {}
        if num_experts:
            step = text.get("decoder_sparse_step") or 1  # Qwen MoE: every step-th layer
            dense_only = set(text.get("mlp_only_layers") or [])
            moe = dict(
                num_experts=num_experts,
                top_k=text["num_experts_per_tok"],
                # Qwen3-MoE: moe_intermediate_size; Mixtral: intermediate_size is the expert's
                expert_intermediate=text.get("moe_intermediate_size") or text["intermediate_size"],
                moe_layers=sum(1 for i in range(layers) if i not in dense_only and (i + 1) % step == 0),
            )
        return cls(
            **window_layers(text, layers),
            layers=layers,
            hidden=text["hidden_size"],
            heads=heads,
            kv_heads=text["num_key_value_heads"],
            head_dim=text.get("head_dim") or text["hidden_size"] // heads,
            intermediate=text["intermediate_size"],
            vocab=text["vocab_size"],
            **moe,
        )

    @property
    def attention_params(self) -> int:
        """q/k/v and o of every layer."""
        qkv = self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim
        return self.layers * (qkv + self.heads * self.head_dim * self.hidden)

    @property
    def dense_mlp_params(self) -> int:
        return (self.layers - self.moe_layers) * 3 * self.hidden * self.intermediate

    @property
    def expert_params(self) -> int:
        """One expert of one layer: gate, up and down."""
        return 3 * self.hidden * self.expert_intermediate

    @property
    def router_params(self) -> int:
        return self.moe_layers * self.hidden * self.num_experts

    @property
    def body_params(self) -> int:
        """Matmul weights of the decoder layers (every expert), routers aside."""
        experts = self.moe_layers * self.num_experts * self.expert_params
        return self.attention_params + self.dense_mlp_params + experts

    @property
    def active_body_params(self) -> int:
        """The layer weights one token multiplies with (its top_k experts): FLOPs / 2 per token."""
        experts = self.moe_layers * self.top_k * self.expert_params
        return self.attention_params + self.dense_mlp_params + experts

    @property
    def head_params(self) -> int:
        """Weights kept in the model dtype under FP8: the LM head (tied or not) and the routers."""
        return self.vocab * self.hidden + self.router_params

    @property
    def matmul_params(self) -> int:
        """What a decode step reads at most: the layers (every expert), routers and LM head."""
        return self.body_params + self.head_params

    def active_experts(self, batch: int) -> float:
        """Expected experts per MoE layer selected by at least one of ``batch`` tokens."""
        if not self.num_experts:
            return 0.0
        return self.num_experts * (1 - (1 - self.top_k / self.num_experts) ** batch)

    def step_body_params(self, batch: int) -> float:
        """The layer weights a decode step of ``batch`` tokens reads (expected, uniform routing)."""
        experts = self.moe_layers * self.active_experts(batch) * self.expert_params
        return self.attention_params + self.dense_mlp_params + experts

    @property
    def kv_elements_per_token(self) -> int:
        return self.layers * 2 * self.kv_heads * self.head_dim

    @property
    def attn_flops_per_context_token(self) -> int:
        """q.k and p.v FLOPs of one query token against one context token, all layers."""
        return self.layers * 4 * self.heads * self.head_dim


def window_layers(text: dict, layers: int) -> dict[str, int]:
    """{window, window_layers} of a text config: its ``layer_types`` when listed; Gemma 3's
    every layer but each ``sliding_window_pattern``-th; Gemma 2's even layers; else every layer
    when ``sliding_window`` is set and not switched off (``use_sliding_window``, Qwen)."""
    window = text.get("sliding_window") or 0
    if not window or text.get("use_sliding_window") is False:
        return {}
    if text.get("layer_types"):
        count = sum(kind == "sliding_attention" for kind in text["layer_types"])
    elif text.get("model_type", "").startswith("gemma3"):
        pattern = text.get("sliding_window_pattern") or text.get("_sliding_window_pattern") or 6
        count = sum(1 for i in range(layers) if (i + 1) % pattern)
    elif text.get("model_type") == "gemma2":
        count = (layers + 1) // 2
    else:
        count = layers
    return {"window": window, "window_layers": count}
