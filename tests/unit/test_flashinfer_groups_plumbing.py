"""FlashInferBackend's per-layer-group plans on CPU, through a stand-in for flashinfer.

NOT a test of FlashInfer's kernels (tests/gpu/test_flashinfer_backend.py runs those): a small
fake ``flashinfer`` module attends densely by the documented meaning of its plan arguments
(pages from indptr/indices/last_page_len, the causal diagonal aligned to the end of the KV,
``window_left`` keys before each query, ``logits_soft_cap * tanh(s / logits_soft_cap)``,
``sm_scale`` defaulting to head_dim ** -0.5, k_scale folded into it, v_scale on the output).
The backend's outputs for a model whose layers attend differently are checked against masked
attention written here from each layer's LayerAttention, and its bookkeeping (one plan a group,
separate int workspaces and staging buffers) is read from what the fake recorded.
"""

from __future__ import annotations

import pytest
import torch

from tests.fake_flashinfer import MAX_LEN, Scenario, install, uninstall
from worker.models.config import LayerAttention


@pytest.fixture
def flashinfer_module(monkeypatch):
    yield install(monkeypatch)
    uninstall()


# layers 0 and 2 plan alike: three groups, layer 0's first
MIXED = (
    LayerAttention(sliding_window=5, logit_softcap=2.0),
    LayerAttention(scale=0.3),
    LayerAttention(sliding_window=5, logit_softcap=2.0),
    LayerAttention(),
)
PREFILL = [(13, 7), (0, 9), (6, 1), (22, 3)]  # (cached_len, extend_len): windows reach into prefixes
DECODE = [(20, 1), (3, 1), (9, 1)]


def check_layers(backend, scenario: Scenario, meta) -> None:
    for layer in range(len(scenario.attentions)):
        got = backend.forward(scenario.q, layer, meta)
        torch.testing.assert_close(got, scenario.expected(layer), rtol=1e-5, atol=1e-5, msg=f"layer {layer}")


@pytest.mark.parametrize("specs", [PREFILL, DECODE], ids=["prefill", "decode"])
def test_each_layer_runs_its_groups_plan(flashinfer_module, specs) -> None:
    scenario = Scenario(specs, MIXED)
    backend = scenario.backend(flashinfer_module)
    assert backend.groups.group_of_layer == (0, 1, 0, 2)
    # the fake is faithful on a model that attends by default...
    plain = Scenario(specs, (LayerAttention(),) * 4)
    plain_backend = plain.backend(flashinfer_module)
    check_layers(plain_backend, plain, plain_backend.plan(plain.layout))
    # ...and each layer of the mixed model attends with its own window, cap and scale
    check_layers(backend, scenario, backend.plan(scenario.layout))
    if scenario.layout.is_decode:  # tensor-core decode: the second plan is the backend's fast re-plan
        backend = scenario.backend(flashinfer_module, use_tensor_cores=True)
        for _ in range(2):
            check_layers(backend, scenario, backend.plan(scenario.layout))
        assert all(len(decode[True].plans) == 2 for decode in backend._decodes)


@pytest.mark.parametrize(
    ("attentions", "expected_options"),
    [
        (MIXED, [(4, 2.0, None), (-1, 0.0, 0.3), (-1, 0.0, None)]),
        (MIXED[1:3] * 2, [(-1, 0.0, 0.3), (4, 2.0, None)]),
    ],
    ids=["three-groups", "two-groups"],
)
def test_groups_plan_into_their_own_workspaces(flashinfer_module, attentions, expected_options) -> None:
    """Each pass plans every group once, with its options, into distinct int workspaces and
    staging buffers; each group alternates its two staging buffers from pass to pass."""
    scenario = Scenario(PREFILL, attentions)
    backend = scenario.backend(flashinfer_module)
    for _ in range(3):
        backend.plan(scenario.layout)
    plans = [wrapper.plans for wrapper in backend._prefills]
    assert [len(p) for p in plans] == [3] * len(expected_options)
    for group_plans, (window_left, cap, scale) in zip(plans, expected_options, strict=True):
        assert all(
            (p["window_left"], p["logits_soft_cap"], p["sm_scale"]) == (window_left, cap, scale)
            for p in group_plans
        )
    for n in range(3):
        workspaces = {id(p[n]["int_workspace"]) for p in plans}
        staging = {id(p[n]["staging"]) for p in plans}
        assert len(workspaces) == len(staging) == len(expected_options)
    for group_plans in plans:
        assert group_plans[0]["staging"] is not group_plans[1]["staging"]
        assert group_plans[0]["staging"] is group_plans[2]["staging"]


def test_a_uniform_model_plans_once_with_default_options(flashinfer_module) -> None:
    scenario = Scenario(PREFILL, (LayerAttention(),) * 4)
    backend = scenario.backend(flashinfer_module)
    meta = backend.plan(scenario.layout)
    assert len(backend._prefills) == 1 and len(backend._int_workspaces) == 1 and meta.other_groups == ()
    (plan,) = backend._prefill.plans
    assert (plan["window_left"], plan["logits_soft_cap"], plan["sm_scale"]) == (-1, 0.0, None)


@pytest.mark.parametrize("use_tensor_cores", [False, True])
def test_graph_decode_wrappers_one_a_group(flashinfer_module, use_tensor_cores) -> None:
    """Graph-mode wrappers exist per batch size and group; a re-plan for replay (here run
    eagerly: no graphs on CPU) attends each layer with its group's options, padding included."""
    scenario = Scenario(DECODE, MIXED, seed=3)
    backend = scenario.backend(flashinfer_module, use_tensor_cores=use_tensor_cores)
    backend.init_cuda_graphs([2, 4], max_seq_len=MAX_LEN)
    assert all(len(backend._graph_wrappers[bs]) == 3 for bs in (2, 4))
    backend.capture_meta(4)
    for _ in range(2):
        meta = backend.plan_for_replay(scenario.layout, 4)  # 3 requests padded to 4
        assert meta is backend._graph_metas[4]
        for layer in range(4):
            got = backend.forward(torch.cat([scenario.q, scenario.q[:1]]), layer, meta)[:3]
            torch.testing.assert_close(
                got, scenario.expected(layer), rtol=1e-5, atol=1e-5, msg=f"layer {layer}"
            )


def test_xqa_asked_for_a_soft_capped_model_is_refused(flashinfer_module) -> None:
    scenario = Scenario(DECODE, MIXED)
    with pytest.raises(ValueError, match="decode_kernel='xqa': XQA has no attention-logit soft-cap"):
        scenario.backend(flashinfer_module, decode_kernel="xqa")
