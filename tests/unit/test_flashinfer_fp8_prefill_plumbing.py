"""FlashInferBackend's prefill over FP8 pages (worker.attention.flashinfer_fp8_prefill) on CPU,
through the stand-in for flashinfer in tests/fake_flashinfer.py.

NOT a test of FlashInfer's kernels (tests/gpu/test_flashinfer_fp8_prefill.py runs those): the
backend's split (ragged part over the pass's own K/V, prefix part over the FP8 pages, merged by
log-sum-exp; whole rows from the pages for windowed layers) is checked against masked attention
written from each layer's LayerAttention, with the pass's own K/V chosen to differ from what
the pool holds, so every row shows which of the two it read. The fake is first checked against
the same oracle on the paged path, so a wrong fake cannot pass unnoticed.
"""

from __future__ import annotations

import pytest
import torch

from tests.fake_flashinfer import Scenario, install, uninstall
from worker.models.config import LayerAttention

FP8 = torch.float8_e4m3fn
# a windowed, soft-capped group (layers 0, 2), a scaled one, a plain one
MIXED = (
    LayerAttention(sliding_window=5, logit_softcap=2.0),
    LayerAttention(scale=0.3),
    LayerAttention(sliding_window=5, logit_softcap=2.0),
    LayerAttention(),
)
# (cached_len, extend_len) a request; windows reach into the prefixes
SCATTERED = [(13, 7), (0, 9), (6, 1), (22, 3)]  # requests 0, 2, 3 have a prefix: gathered rows
CONSECUTIVE = [(0, 5), (13, 7), (6, 1), (0, 9)]  # requests 1, 2: one slice of rows
FRESH = [(0, 7), (0, 9), (0, 3)]  # no prefix: the ragged part alone


@pytest.fixture
def module(monkeypatch):
    yield install(monkeypatch)
    uninstall()


def new_kv(scenario: Scenario, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The pass's K/V 'as computed': what the pool holds at its locations plus a perturbation
    (the pool's copy is rounded to e4m3), so the oracle sees which copy a row read."""
    k, v = scenario.kv.gather(layer, scenario.new_locs())
    gen = torch.Generator().manual_seed(100 + layer)
    return k + 0.5 * torch.randn(k.shape, generator=gen), v + 0.5 * torch.randn(v.shape, generator=gen)


@pytest.mark.parametrize("specs", [SCATTERED, CONSECUTIVE, FRESH], ids=["scattered", "consecutive", "fresh"])
def test_split_prefill_matches_the_oracle(module, specs) -> None:
    scenario = Scenario(specs, MIXED, cache_dtype=FP8)
    # the fake is faithful on the paged path (everything read from the pool)...
    paged = scenario.backend(module, fp8_prefill="paged")
    meta = paged.plan(scenario.layout)
    assert not paged.wants_new_kv(meta)
    for layer in range(len(MIXED)):
        torch.testing.assert_close(paged.forward(scenario.q, layer, meta), scenario.expected(layer))
    # ...and the split path reads the pass's own K/V from new_kv, the prefixes from the pages
    backend = scenario.backend(module)
    meta = backend.plan(scenario.layout)
    assert backend.wants_new_kv(meta)
    for layer in range(len(MIXED)):
        kv = new_kv(scenario, layer)
        want = scenario.expected(layer, kv)
        assert float((want - scenario.expected(layer)).abs().max()) > 0.05  # the case tells them apart
        torch.testing.assert_close(backend.forward(scenario.q, layer, meta, kv), want, msg=f"layer {layer}")
        # strided K/V rows (as v is, read in place from the qkv projection) read the same
        wide = torch.cat([kv[0], kv[1], kv[0]], dim=-1)
        strided = (wide[..., : kv[0].shape[-1]], wide[..., kv[0].shape[-1] : 2 * kv[0].shape[-1]])
        torch.testing.assert_close(backend.forward(scenario.q, layer, meta, strided), want)


def test_plans_per_group_and_part(module) -> None:
    """Ragged plans: causal, one a group with its options, in the group's workspace. Prefix
    plans: over the requests with a prefix only, prefix-only and not causal for split groups,
    whole rows and causal for windowed ones, each in a workspace of its own."""
    scenario = Scenario(SCATTERED, MIXED, cache_dtype=FP8)
    backend = scenario.backend(module)
    fp8 = backend._fp8_prefill
    for _ in range(2):
        meta = backend.plan(scenario.layout)
    assert meta.whole == (True, False, False)  # groups: window+cap, scale 0.3, plain
    with_prefix = [(c, e) for c, e in SCATTERED if c > 0]
    workspaces = set()
    for group, (ragged, prefix) in enumerate(zip(fp8._ragged, fp8._prefix, strict=True)):
        options = backend.groups.options[group]
        plan = ragged.plans[-1]
        assert plan["causal"] and plan["qo_indptr"] == plan["kv_indptr"] == [0, 7, 16, 17, 20]
        assert (plan["window_left"], plan["logits_soft_cap"], plan["sm_scale"]) == (
            options.window_left, options.logits_soft_cap, options.sm_scale,
        )  # fmt: skip
        assert plan["int_workspace"] is backend._int_workspaces[group]
        whole = meta.whole[group]
        plan = prefix.plans[-1]
        assert plan["causal"] == whole and plan["qo_lens"] == [e for _, e in with_prefix]
        assert plan["kv_lens"] == [c + e if whole else c for c, e in with_prefix]
        assert plan["window_left"] == options.window_left
        assert prefix.plans[0]["staging"] is not prefix.plans[1]["staging"]  # alternate pass to pass
        workspaces |= {id(plan["int_workspace"]), id(backend._int_workspaces[group])}
    assert len(workspaces) == 2 * len(fp8._ragged)
    assert meta.rows_gpu.tolist() == [0, 1, 2, 3, 4, 5, 6, 16, 17, 18, 19]


def test_ragged_backend_reaches_the_ragged_part_alone(module) -> None:
    """``ragged_backend="fa3"``: the ragged wrappers are FA3's, the prefix wrappers (FP8 pages)
    keep ``prefill_backend``; without it both take ``prefill_backend``."""
    scenario = Scenario(SCATTERED, MIXED, cache_dtype=FP8)
    fp8 = scenario.backend(module, ragged_backend="fa3")._fp8_prefill
    assert {w.backend for w in fp8._ragged} == {"fa3"} and {w.backend for w in fp8._prefix} == {"fa2"}
    fp8 = scenario.backend(module)._fp8_prefill
    assert {w.backend for w in (*fp8._ragged, *fp8._prefix)} == {"fa2"}
    with pytest.raises(ValueError, match="ragged_backend='fa4': expected one of"):
        scenario.backend(module, ragged_backend="fa4")


def test_a_pass_without_prefixes_plans_no_prefix_part(module) -> None:
    scenario = Scenario(FRESH, MIXED, cache_dtype=FP8)
    backend = scenario.backend(module)
    meta = backend.plan(scenario.layout)
    assert meta.prefix == () and meta.rows is None
    assert all(not wrapper.plans for wrapper in backend._fp8_prefill._prefix)


def test_split_prefill_needs_the_new_kv(module) -> None:
    scenario = Scenario(CONSECUTIVE, MIXED, cache_dtype=FP8)
    backend = scenario.backend(module)
    with pytest.raises(ValueError, match="new_kv"):
        backend.forward(scenario.q, 0, backend.plan(scenario.layout))


def test_decode_and_bf16_pools_keep_their_paths(module) -> None:
    """Decode passes over FP8 pages, and prefill over unquantized pages, want no new K/V."""
    decode = Scenario([(20, 1), (3, 1), (9, 1)], MIXED, cache_dtype=FP8)
    backend = decode.backend(module)
    meta = backend.plan(decode.layout)
    assert not backend.wants_new_kv(meta)
    torch.testing.assert_close(backend.forward(decode.q, 1, meta), decode.expected(1))
    plain = Scenario(SCATTERED, MIXED)
    backend = plain.backend(module)
    assert backend._fp8_prefill is None and not backend.wants_new_kv(backend.plan(plain.layout))
    with pytest.raises(ValueError, match="fp8_prefill"):
        plain.backend(module, fp8_prefill="ragged")
