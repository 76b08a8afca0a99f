"""worker.kernels.fused_moe: the Triton kernels, run by triton's CPU interpreter on tiny shapes,
against the expert loop (worker.kernels.moe.experts_loop: bf16, float32 and FP8 experts) under
every tile configuration the rule picks from (the large-token tiles forced on small shapes), the
expert layout the align kernels build against its definition, and the fused router (softmax,
top-k) against tests/unit/test_moe.py's float64 routing."""

from __future__ import annotations

import os

import pytest
import torch

from tests.moe_oracle import relative_error, uniform_routing
from tests.triton_interpret import interpreted_test_module

interpreted_test_module(
    "worker.kernels.moe_triton",
    "worker.kernels.triton_kernels",
    native_tests="tests/gpu/test_fused_moe_gpu.py",
)

from tests.unit.test_moe import oracle_route  # noqa: E402
from worker.kernels.fused_moe import align_entries, fused_moe, fused_route, max_sorted_rows  # noqa: E402
from worker.kernels.moe import experts_loop, route  # noqa: E402
from worker.kernels.moe_tiles import KINDS, TILES_ENV, TUNED, MoeTiles, moe_tiles, rule_tiles, table_to_json  # noqa: E402
from worker.models.fp8 import quantize_channels  # noqa: E402

# Tiny tiles: H=48 and I=40 are not multiples of 32, so the masked K loop and the wrapped last
# column block both run; block_m 16 pads every expert's run.
TILES = MoeTiles(block_m=16, gate_up_n=16, down_n=32, block_k=32)
# every tile the rule can pick: (kind, tiles); the e4m3-wgmma kinds share one list, run as "tile"
RULE_TILES = [(kind, tiles) for kind in ("bf16", "fp8", "fp8-tile") for tiles in rule_tiles(kind)]
# transposed tiles (swap_ab: the weights' columns as the tensor core's rows), as --sweep --swap times them
SWAPPED = (
    MoeTiles(16, 64, 64, 64, 8, 4, 4, swap_ab=True),
    MoeTiles(32, 128, 128, 128, 8, 4, 3, swap_ab=True),
)
RULE_TILES += [(kind, tiles) for kind in ("bf16", "fp8", "fp8-tile", "fp8-fast") for tiles in SWAPPED]
# TUNED's transposed decode tile for Qwen3-30B-A3B, and --sweep --swap --wide's 128-row ones
RULE_TILES += [
    ("fp8-fast", MoeTiles(64, 128, 128, 128, 8, 4, 4, swap_ab=True)),
    ("fp8-fast", MoeTiles(128, 64, 128, 128, 8, 8, 4, swap_ab=True)),
]
SUMS = {"bf16": "exact", "fp8": "exact", "fp8-tile": "tile", "fp8-fast": "fast"}
H200_SHARED_BYTES = 227 * 2**10  # the most shared memory one block may use on sm90


@pytest.fixture(autouse=True)
def interpret():
    os.environ["TRITON_INTERPRET"] = "1"
    yield
    os.environ.pop("TRITON_INTERPRET", None)


def experts(num_experts: int, hidden: int, inter: int, dtype: torch.dtype, seed: int):
    gen = torch.Generator().manual_seed(seed)
    w13 = (torch.randn(num_experts, 2 * inter, hidden, generator=gen) / hidden**0.5).to(dtype)
    w2 = (torch.randn(num_experts, hidden, inter, generator=gen) / inter**0.5).to(dtype)
    return w13, w2, gen


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_tokens", [1, 7])
def test_matches_the_expert_loop(dtype: torch.dtype, num_tokens: int):
    w13, w2, gen = experts(6, 48, 40, dtype, seed=num_tokens)
    x = torch.randn(num_tokens, 48, generator=gen).to(dtype)
    weights, ids = uniform_routing(num_tokens, 6, 2, gen)
    got = fused_moe(x, w13, w2, weights, ids, tiles=TILES)
    want = experts_loop(x, w13, w2, weights, ids)
    assert got.dtype == dtype and got.shape == x.shape
    # NOTE: triton's interpreter rounds float32 to bf16 by truncation (torch: to nearest), and
    # the layer rounds six times: bf16 agrees to a few 1e-2 here, to 1e-2 on the GPU.
    assert relative_error(got, want) < (1e-5 if dtype == torch.float32 else 4e-2)


def test_fp8_experts_match_the_quantized_loop():
    """The FP8 path's layout, scales and GEMMs, given its per-row quantizer.

    NOTE: triton's interpreter converts to e4m3 by its own rounding (not torch's round to
    nearest even); the loop, run while TRITON_INTERPRET is set, quantizes with the same
    interpreted kernels (worker.kernels.ops), and the model dtype is float32 (no bf16
    roundings, which the interpreter truncates); the quantizer itself, and the whole FP8 layer
    in bf16, are checked on the GPU (tests/gpu/test_fused_moe_gpu.py)."""
    w13, w2, gen = experts(5, 64, 48, torch.float32, seed=3)
    (w13_q, w13_scale), (w2_q, w2_scale) = quantize_channels(w13), quantize_channels(w2)
    x = torch.randn(9, 64, generator=gen)
    weights, ids = uniform_routing(9, 5, 3, gen)
    scales = dict(w13_scale=w13_scale, w2_scale=w2_scale)
    got = fused_moe(x, w13_q, w2_q, weights, ids, tiles=TILES, **scales)
    want = experts_loop(x, w13_q, w2_q, weights, ids, **scales)
    assert relative_error(got, want) < 1e-3
    # the same experts without activation quantization are further off: the kernel quantizes
    plain = experts_loop(
        x, w13_q.float() * w13_scale[..., None], w2_q.float() * w2_scale[..., None], weights, ids
    )
    assert relative_error(got, plain) > 10 * relative_error(got, want)
    # the tensor-core accumulation variants compute the same values where sums are exact
    for sums in ("tile", "fast"):
        other = fused_moe(x, w13_q, w2_q, weights, ids, tiles=TILES, fp8_sums=sums, **scales)
        assert relative_error(other, want) < 1e-3, sums
    with pytest.raises(ValueError, match="fp8_sums='fastest'"):
        fused_moe(x, w13_q, w2_q, weights, ids, tiles=TILES, fp8_sums="fastest", **scales)


@pytest.mark.parametrize(
    ("kind", "tiles"), RULE_TILES, ids=[f"{k}-{t.block_m}{'-swap' * t.swap_ab}" for k, t in RULE_TILES]
)
def test_every_rule_tile_matches_the_loop(kind: str, tiles: MoeTiles):
    """The decode and prefill tiles forced on a small layer: H=300 and I=200 make several K
    steps (the last one masked) and column blocks (the last one wrapped) for each. bf16 tiles
    (float32 model dtype, see the FP8 test's NOTE): 520 entries over 4 experts need several
    blocks per expert even at block_m 128, and more row blocks than one GROUP_M sweep (a partial
    last group). FP8 tiles (the same indexing, plus scales and the fp16 conversion): 48 entries,
    since the interpreter runs each quantized row as a program of its own. Transposed tiles
    (swap_ab) run the same sums as [columns, rows] products."""
    fp8 = kind != "bf16"
    tokens = 24 if fp8 else 260
    w13, w2, gen = experts(4, 300, 200, torch.float32, seed=17)
    x = torch.randn(tokens, 300, generator=gen)
    weights, ids = uniform_routing(tokens, 4, 2, gen)
    scales: dict[str, torch.Tensor] = {}
    if fp8:
        (w13, scales["w13_scale"]), (w2, scales["w2_scale"]) = quantize_channels(w13), quantize_channels(w2)
    else:
        assert align_entries(ids, 4, tiles.block_m).num_blocks > tiles.group_m
        assert int(torch.bincount(ids.reshape(-1).long()).max()) > tiles.block_m  # a run of several blocks
    got = fused_moe(x, w13, w2, weights, ids, tiles=tiles, fp8_sums=SUMS[kind], **scales)
    assert relative_error(got, experts_loop(x, w13, w2, weights, ids, **scales)) < (1e-3 if fp8 else 1e-5)


def test_skewed_routing_and_dropped_slots():
    """Every token on the same two experts (one run spans several blocks), and slots with ids
    outside [0, E) (-1, E) add nothing."""
    w13, w2, gen = experts(4, 32, 32, torch.float32, seed=5)
    x = torch.randn(37, 32, generator=gen)
    ids = torch.tensor([[2, 0]] * 37, dtype=torch.int32)
    ids[3, 1] = -1
    ids[10, 0] = 4
    weights = torch.rand(37, 2, generator=gen)
    got = fused_moe(x, w13, w2, weights, ids, tiles=TILES)
    dropped = (ids < 0) | (ids >= 4)  # the loop's routing: weight 0 on some valid expert instead
    want = experts_loop(x, w13, w2, weights.masked_fill(dropped, 0.0), ids.clamp(0, 3))
    assert relative_error(got, want) < 1e-5
    only_first = fused_moe(x[3:4], w13, w2, weights[3:4, :1], ids[3:4, :1], tiles=TILES)
    torch.testing.assert_close(got[3], only_first[0], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize(
    ("num_tokens", "top_k", "num_experts", "block_m"), [(1, 1, 3, 16), (13, 3, 8, 16), (40, 2, 4, 32)]
)
def test_layout_sorts_every_entry_once_into_its_experts_blocks(num_tokens, top_k, num_experts, block_m):
    gen = torch.Generator().manual_seed(num_tokens)
    _, ids = uniform_routing(num_tokens, num_experts, top_k, gen)
    if num_tokens == 40:
        ids[:, 0] = 1  # one expert takes at least one entry per token: a run of several blocks
    layout = align_entries(ids, num_experts, block_m)
    entries = num_tokens * top_k
    assert layout.sorted_rows.numel() == max_sorted_rows(entries, num_experts, block_m)
    rows = layout.sorted_rows.view(-1, block_m)
    flat = ids.reshape(-1).long()
    seen: list[int] = []
    for block, expert in enumerate(layout.block_expert.tolist()):
        block_rows = [r for r in rows[block].tolist() if r != entries]
        if expert < 0:
            continue
        assert block_rows, f"block {block} of expert {expert} holds only padding"
        assert all(flat[r] == expert for r in block_rows)
        assert block_rows == sorted(block_rows)  # an expert's entries keep their order
        seen += block_rows
    assert sorted(seen) == list(range(entries))
    used = layout.block_expert[layout.block_expert >= 0]
    assert torch.equal(used, used.sort().values)  # runs follow expert order
    per_expert = torch.bincount(flat, minlength=num_experts)
    want_blocks = (-(-per_expert // block_m)).tolist()
    assert [int((used == e).sum()) for e in range(num_experts)] == want_blocks
    assert (layout.block_expert[used.numel() :] == -1).all()


def test_tiles_follow_rows_per_expert():
    # the rule, on a shape without measured tiles: decode of a 128-expert top-8 model (64 tokens:
    # 4 rows per expert) vs its prefill (8,192 tokens)
    assert not any((128, 1024, 512, kind) in TUNED for kind in KINDS)
    assert moe_tiles(128, 1024, 512, 64 * 8, "bf16").block_m == 16
    assert moe_tiles(128, 1024, 512, 8192 * 8, "bf16").block_m == 128
    assert moe_tiles(8, 1024, 512, 64 * 2, "fp8").block_m == 32  # 16 rows per expert
    # FP8 decode at 1,024 x 8 over 128 experts (64 rows each): block_m 64 (moe_tiles' rule)
    assert moe_tiles(128, 1024, 512, 1024 * 8, "fp8").block_m == 64
    assert moe_tiles(128, 1024, 512, 1024 * 8, "bf16").block_m == 128
    assert moe_tiles(128, 1024, 512, 4096 * 8, "fp8").block_m == 128
    # e4m3 straight into wgmma: twice the exact FP8 tile's block_k from 64 rows
    assert (
        moe_tiles(128, 1024, 512, 1024 * 8, "fp8-fast").block_k
        == 2 * moe_tiles(128, 1024, 512, 1024 * 8, "fp8").block_k
    )
    # measured tiles win where a shape has them (Qwen3-30B-A3B's FP8 experts at decode's 64 rows)
    assert moe_tiles(128, 2048, 768, 1024 * 8, "fp8") == TUNED[(128, 2048, 768, "fp8")][1][1]
    for kind in KINDS:
        for tiles in rule_tiles(kind):
            assert tiles.shared_bytes(kind) <= H200_SHARED_BYTES, (kind, tiles)
    for (_, _, _, kind), buckets in TUNED.items():
        assert [bound for bound, _ in buckets] == sorted(bound for bound, _ in buckets)
        assert buckets[-1][0] == float("inf")  # moe_tiles reads no other table after it
        assert all(tiles.shared_bytes(kind) <= H200_SHARED_BYTES for _, tiles in buckets)
    with pytest.raises(ValueError, match="power of two"):
        MoeTiles(block_m=24, gate_up_n=16, down_n=16, block_k=16)


def test_a_tiles_file_overrides_the_table(tmp_path, monkeypatch):
    """RADIXQ_MOE_TILES: a measured table (as benchmarks/moe_kernel.py --write-tiles writes it)
    wins over TUNED and the rule for its shape and kind alone; a broken file is refused."""
    mine = MoeTiles(64, 128, 128, 128, 4, 8, 4)
    path = tmp_path / "tiles.json"
    path.write_text(table_to_json({(128, 2048, 768, "fp8-fast"): ((64, mine), (float("inf"), mine))}))
    monkeypatch.setenv(TILES_ENV, str(path))
    assert moe_tiles(128, 2048, 768, 1024 * 8, "fp8-fast") == mine
    assert moe_tiles(128, 2048, 768, 1024 * 8, "fp8") == TUNED[(128, 2048, 768, "fp8")][1][1]
    bad = tmp_path / "bad.json"
    bad.write_text('{"128,2048,768,fp8": [[64, {"block_m": 64}]]}')
    monkeypatch.setenv(TILES_ENV, str(bad))
    with pytest.raises(ValueError, match="not a table of MoE tiles"):
        moe_tiles(128, 2048, 768, 1024 * 8, "fp8")


@pytest.mark.parametrize(("num_experts", "top_k"), [(8, 2), (6, 3), (128, 8)])
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_route_is_softmax_then_top_k(
    num_experts: int, top_k: int, renormalize: bool, dtype: torch.dtype
):
    gen = torch.Generator().manual_seed(num_experts)
    logits = (torch.randn(37, num_experts, generator=gen) * 2).to(dtype)
    weights, ids = fused_route(logits, top_k, renormalize)
    want_weights, want_ids = oracle_route(logits.float(), top_k, renormalize)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int32 and ids.shape == (37, top_k)
    assert torch.equal(ids.long(), want_ids)
    torch.testing.assert_close(weights.double(), want_weights, atol=1e-6, rtol=1e-6)
    dispatched = route(logits, top_k, renormalize)  # route takes the kernel where Triton runs
    assert torch.equal(dispatched[0], weights) and torch.equal(dispatched[1], ids)


def test_fused_route_breaks_ties_toward_the_lowest_expert():
    logits = torch.zeros(3, 8)
    logits[1, 5] = logits[1, 6] = 1.0  # two equal leaders, then six equal ones
    weights, ids = fused_route(logits, 3, renormalize=False)
    assert ids.tolist() == [[0, 1, 2], [5, 6, 0], [0, 1, 2]]
    torch.testing.assert_close(weights[0], torch.full((3,), 1 / 8))
    assert fused_route(logits[:0], 3, renormalize=True)[1].shape == (0, 3)


def test_bad_arguments_name_what_is_wrong():
    w13, w2, gen = experts(4, 32, 16, torch.float32, seed=0)
    x = torch.randn(3, 32)
    weights, ids = uniform_routing(3, 4, 2, gen)
    with pytest.raises(ValueError, match=r"w2 must be \[E=4, H=32, I=16\]"):
        fused_moe(x, w13, w2.transpose(1, 2).contiguous(), weights, ids)
    with pytest.raises(ValueError, match="topk_weights must be float32"):
        fused_moe(x, w13, w2, weights.double(), ids)
    w13_q, _ = quantize_channels(w13)
    w2_q, _ = quantize_channels(w2)
    with pytest.raises(ValueError, match="FP8 experts need w13_scale"):
        fused_moe(x, w13_q, w2_q, weights, ids)
    assert fused_moe(x[:0], w13, w2, weights[:0], ids[:0]).shape == (0, 32)
    os.environ.pop("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="runs on CUDA tensors"):
        fused_moe(x, w13, w2, weights, ids)
