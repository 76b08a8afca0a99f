"""Which layers share a FlashInfer plan (worker.attention.plan_groups), and what XQA refuses.

Torch-free grouping; no flashinfer import. The expected options are written from the meaning of
LayerAttention (Hugging Face's ``sliding_window``: a query sees itself and ``sliding_window - 1``
keys before it) and FlashInfer's ``window_left`` (keys before the query it sees, -1 for all).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from worker.attention.plan_groups import LayerGroups, PlanOptions, group_layers, layer_attentions
from worker.models.config import LayerAttention

GLOBAL = LayerAttention()


def test_a_uniform_model_is_one_group_planned_as_before() -> None:
    """Llama-like (no layer_attention): one group whose options are FlashInfer's defaults, so
    the backend's plan() arguments are what they were before groups existed."""
    config = SimpleNamespace(num_q_heads=32)  # a stand-in without the field, as the GPU tests use
    groups = group_layers(layer_attentions(config, 32))
    assert groups == LayerGroups(options=(PlanOptions(),), group_of_layer=(0,) * 32)
    assert PlanOptions() == PlanOptions(window_left=-1, logits_soft_cap=0.0, sm_scale=None)
    assert group_layers([GLOBAL] * 4, sm_scale=0.1).options == (PlanOptions(sm_scale=0.1),)


def test_uniform_sliding_window_is_one_group() -> None:
    """Mistral with sliding_window 4096 on every layer: one group, window_left 4095."""
    groups = group_layers([LayerAttention(sliding_window=4096)] * 32)
    assert groups.num_groups == 1
    assert groups.options[0].window_left == 4095 and groups.options[0].sliding_window == 4096


def test_gemma3_pattern_is_two_groups() -> None:
    """Five sliding layers then a global one, repeated: layer 0's kind is group 0."""
    local = LayerAttention(sliding_window=1024)
    attentions = ([local] * 5 + [GLOBAL]) * 8
    groups = group_layers(attentions)
    assert groups.options == (PlanOptions(window_left=1023), PlanOptions())
    assert groups.layers_of(1) == [5, 11, 17, 23, 29, 35, 41, 47]
    assert groups.layers_of(0) == [i for i in range(48) if i % 6 != 5]


def test_gemma2_pattern_soft_cap_and_scale() -> None:
    """Alternating sliding / global layers, all soft-capped at 50 with query_pre_attn_scalar 144."""
    scale = 144**-0.5
    local = LayerAttention(sliding_window=4096, logit_softcap=50.0, scale=scale)
    full = LayerAttention(logit_softcap=50.0, scale=scale)
    groups = group_layers([local, full] * 3)
    assert groups.options == (
        PlanOptions(window_left=4095, logits_soft_cap=50.0, sm_scale=scale),
        PlanOptions(window_left=-1, logits_soft_cap=50.0, sm_scale=scale),
    )
    assert groups.group_of_layer == (0, 1, 0, 1, 0, 1)


def test_layers_that_differ_but_plan_alike_share_a_group() -> None:
    """A layer that names the backend's own scale plans like one that names none."""
    groups = group_layers([GLOBAL, LayerAttention(scale=0.25)], sm_scale=0.25)
    assert groups.num_groups == 1 and groups.options[0].sm_scale == 0.25


def test_a_window_of_one_sees_only_itself() -> None:
    assert PlanOptions.of(LayerAttention(sliding_window=1)).window_left == 0


@pytest.mark.parametrize(
    "bad",
    [LayerAttention(sliding_window=-2), LayerAttention(logit_softcap=-1.0), LayerAttention(scale=-0.5)],
)
def test_negative_options_are_refused(bad: LayerAttention) -> None:
    with pytest.raises(ValueError, match="must be >= 0"):
        group_layers([bad])


def test_layer_attention_of_the_wrong_length_is_refused() -> None:
    config = SimpleNamespace(layer_attention=(GLOBAL,) * 3)
    with pytest.raises(ValueError, match="3 entries for 4 layers"):
        layer_attentions(config, 4)


def test_xqa_refuses_soft_cap_only() -> None:
    """XQA takes windows and scales at run time; it has no logit soft-cap."""
    from worker.attention.xqa import xqa_refusal

    assert xqa_refusal(group_layers([LayerAttention(sliding_window=8, scale=0.3), GLOBAL])) is None
    refusal = xqa_refusal(group_layers([LayerAttention(sliding_window=8, logit_softcap=50.0), GLOBAL]))
    assert refusal is not None and "soft-cap" in refusal and "1 of 2 layers" in refusal
