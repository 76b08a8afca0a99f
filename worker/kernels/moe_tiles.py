"""Tile configurations of the fused MoE kernels (worker.kernels.fused_moe), per expert shape
and tokens-per-expert bucket.

The bucket is the expected rows per expert, ``T * k / E`` under uniform routing: decode with
few rows per expert is bound by reading the selected experts' weights (small ``block_m``, many
programs in flight), prefill by FLOPs (the largest tiles). The rule below follows the Hopper
tables vLLM ships for its Triton fused MoE (E=128/N=768 and E=8/N=14336 on the H100/H200),
restated by rows per expert; ``TUNED`` holds what the benchmark sweep
(``benchmarks/moe_kernel.py --sweep``) measured best per shape, where it differs.

FP8 tiles of 64 rows or more (wgmma) multiply gate/up in fp16 (fused_moe's module docstring)
and hold those operands twice in shared memory: the e4m3 pipeline stages and one fp16 copy of
the converted tile.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class MoeTiles:
    """One launch configuration of the fused MoE kernels.

    ``block_m`` rows per program (also each expert's padding unit); ``gate_up_n`` columns of
    the intermediate per program of the gate/up GEMM, which reads a gate and an up tile of that
    width (its tile is 2 x gate_up_n wide); ``down_n`` hidden columns per program of the down
    GEMM; ``block_k`` the reduction step of both; ``group_m`` row blocks that sweep the columns
    together (L2 reuse of their weight tiles)."""

    block_m: int
    gate_up_n: int
    down_n: int
    block_k: int
    group_m: int = 1
    num_warps: int = 4
    num_stages: int = 3

    def shared_bytes(self, fp8: bool) -> int:
        """Shared memory of the software pipeline: ``num_stages`` copies of the larger GEMM's
        operand tiles (gate/up reads two weight tiles per step), and for FP8 one fp16 copy of
        the gate/up tiles it converts (at most; small tiles convert in registers)."""
        per_k = max(self.block_m + 2 * self.gate_up_n, self.block_m + self.down_n)
        if not fp8:
            return self.num_stages * per_k * self.block_k * 2
        return self.num_stages * per_k * self.block_k + (self.block_m + 2 * self.gate_up_n) * self.block_k * 2

    def __post_init__(self) -> None:
        for name in ("block_m", "gate_up_n", "down_n", "block_k"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"MoeTiles.{name}={value}: must be a power of two >= 16")


# fp8 -> ((rows per expert at most, tiles), ...), ascending. FP8 takes twice the block_k of
# the bf16 tile where block_m < 64 (mma.sync: the same bytes per stage) and the bf16 tiles
# from 64 rows (wgmma multiplies gate/up in fp16 there: the bf16 GEMM with e4m3 loads, whose
# two-byte stages are known to fit; 61 KB at block_m 64, three programs per SM). Its block_m
# 64 bucket reaches 64 rows per expert (bf16: 32): decode at 1,024 x k=8 over 128 experts has
# 64 +- 8 rows per expert, padded to 1.5 blocks of 64 on average instead of one block of 128,
# a quarter less work for the fp16 gate/up GEMM (vLLM's H100 FP8 table for E=128/N=768 also
# picks M=64 at 512 and 1,024 tokens).
_TILE_16 = MoeTiles(16, 64, 128, 128, 1, 4, 3)
_TILE_32 = MoeTiles(32, 64, 128, 128, 8, 4, 3)
_TILE_64 = MoeTiles(64, 64, 128, 64, 8, 4, 3)
_TILE_128 = MoeTiles(128, 128, 256, 64, 8, 8, 4)
_FP8_TILE_16 = replace(_TILE_16, block_k=256)
_FP8_TILE_32 = replace(_TILE_32, block_k=256)

_RULE: dict[bool, tuple[tuple[float, MoeTiles], ...]] = {
    False: ((8, _TILE_16), (16, _TILE_32), (32, _TILE_64), (float("inf"), _TILE_128)),
    True: ((8, _FP8_TILE_16), (16, _FP8_TILE_32), (64, _TILE_64), (float("inf"), _TILE_128)),
}

# (E, hidden, intermediate, fp8) -> ((rows per expert at most, tiles), ...), ascending.
# Measured on one H200 (docs/performance.md, "The exact FP8 MoE kernel on one H200", its
# "Tiles, measured"; 2026-12-04): for FP8
# Qwen3-30B-A3B experts the block_m 32 tile (fp16 products in mma.sync) beats block_m 64 at
# decode's 64 rows per expert (405 vs 501 us at 1,024 tokens), and block_m 64 beats 128 at
# prefill (2,058 vs 2,162 us at 8,192 tokens); for FP8 Mixtral experts block_m 64 beats 128 at
# 256 rows per expert (2,255 vs 2,612 us at 1,024 tokens).
TUNED: dict[tuple[int, int, int, bool], tuple[tuple[float, MoeTiles], ...]] = {
    (128, 2048, 768, True): ((8, _FP8_TILE_16), (64, _FP8_TILE_32), (float("inf"), _TILE_64)),
    (8, 4096, 14336, True): (
        (8, _FP8_TILE_16),
        (16, _FP8_TILE_32),
        (256, _TILE_64),
        (float("inf"), _TILE_128),
    ),
}


def rule_tiles(fp8: bool) -> list[MoeTiles]:
    """Every tile the rule may pick for these experts, smallest bucket first."""
    return [tiles for _, tiles in _RULE[fp8]]


def sweep_tiles(fp8: bool, shared_limit: int = 200 * 2**10) -> list[MoeTiles]:
    """What ``benchmarks/moe_kernel.py --sweep`` times: the rule's tiles, each also with the
    other warp count and with half and twice its column blocks, where they fit in shared memory."""
    found: dict[MoeTiles, None] = {}
    for t in rule_tiles(fp8):
        for variant in (
            t,
            replace(t, num_warps=12 - t.num_warps),
            replace(t, gate_up_n=max(16, t.gate_up_n // 2), down_n=max(16, t.down_n // 2)),
            replace(t, gate_up_n=t.gate_up_n * 2, down_n=t.down_n * 2),
        ):
            if variant.shared_bytes(fp8) <= shared_limit:
                found[variant] = None
    return list(found)


def moe_tiles(num_experts: int, hidden: int, inter: int, num_entries: int, fp8: bool) -> MoeTiles:
    """The tiles for ``num_entries`` (tokens x top-k) routed over ``num_experts`` experts of
    this shape: the tuned entry when there is one, else the rule."""
    rows_per_expert = num_entries / num_experts
    for bound, tiles in TUNED.get((num_experts, hidden, inter, fp8), ()):
        if rows_per_expert <= bound:
            return tiles
    for bound, tiles in _RULE[fp8]:
        if rows_per_expert <= bound:
            return tiles
    raise AssertionError("the rule's last bucket is unbounded")
