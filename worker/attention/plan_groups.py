"""Layers grouped by the attention options a kernel fixes when it plans a pass (torch-free).

FlashInfer plans a pass for one sliding window, one logit soft-cap and one softmax scale (its
``window_left``, ``logits_soft_cap`` and ``sm_scale``; the first two also choose the compiled
kernel), so a model whose layers attend differently (Gemma 2/3: sliding-window layers between
global ones) needs one plan a pass per distinct set of options. ``group_layers`` gives each layer
its group: groups are numbered in order of their first layer (layer 0 is in group 0), and a model
whose layers all attend alike (Llama, Qwen) gets exactly one group, planned as it always was.

    groups = group_layers(layer_attentions(model_config, num_layers))
    groups.options[g]          # PlanOptions of group g
    groups.group_of_layer[i]   # the group whose plan layer i runs
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from worker.models.config import LayerAttention


@dataclass(frozen=True)
class PlanOptions:
    """One group's plan-time options, as FlashInfer takes them.

    ``window_left``: how many keys before its own a query sees (LayerAttention.sliding_window - 1),
    -1 for all of them. ``logits_soft_cap``: 0.0 for none. ``sm_scale``: None leaves the kernel's
    default, head_dim ** -0.5 (so a default model plans exactly as before).
    """

    window_left: int = -1
    logits_soft_cap: float = 0.0
    sm_scale: float | None = None

    @classmethod
    def of(cls, attention: LayerAttention, sm_scale: float | None = None) -> PlanOptions:
        """The options of a layer that attends as ``attention``; ``sm_scale`` is the scale of
        layers that set none (LayerAttention.scale == 0), None for the kernel's default."""
        if attention.sliding_window < 0 or attention.logit_softcap < 0 or attention.scale < 0:
            raise ValueError(f"{attention}: sliding_window, logit_softcap and scale must be >= 0")
        return cls(
            window_left=attention.sliding_window - 1 if attention.sliding_window > 0 else -1,
            logits_soft_cap=float(attention.logit_softcap),
            sm_scale=float(attention.scale) if attention.scale > 0 else sm_scale,
        )

    @property
    def sliding_window(self) -> int:
        """Keys a query sees, itself included (0: all)."""
        return self.window_left + 1 if self.window_left >= 0 else 0


@dataclass(frozen=True)
class LayerGroups:
    """Distinct PlanOptions and, per layer, the index of its group in ``options``."""

    options: tuple[PlanOptions, ...]
    group_of_layer: tuple[int, ...]

    @property
    def num_groups(self) -> int:
        return len(self.options)

    def layers_of(self, group: int) -> list[int]:
        return [layer for layer, g in enumerate(self.group_of_layer) if g == group]


def group_layers(attentions: Sequence[LayerAttention], sm_scale: float | None = None) -> LayerGroups:
    """Group the layers (``attentions[i]``: how layer i attends) by their PlanOptions; layers
    whose LayerAttention differ but plan alike share a group."""
    if not attentions:
        raise ValueError("a model has at least one layer")
    options: list[PlanOptions] = []
    index: dict[PlanOptions, int] = {}
    group_of_layer = []
    for attention in attentions:
        key = PlanOptions.of(attention, sm_scale)
        if key not in index:
            index[key] = len(options)
            options.append(key)
        group_of_layer.append(index[key])
    return LayerGroups(tuple(options), tuple(group_of_layer))


def layer_attentions(model_config: Any, num_layers: int) -> tuple[LayerAttention, ...]:
    """Each layer's LayerAttention from ``model_config.layer_attention`` (ModelConfig's field;
    empty, or absent from a stand-in config, means every layer attends by default)."""
    given = tuple(getattr(model_config, "layer_attention", ()) or ())
    if given and len(given) != num_layers:
        raise ValueError(f"layer_attention has {len(given)} entries for {num_layers} layers")
    return given or (LayerAttention(),) * num_layers
