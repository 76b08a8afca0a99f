"""Tile configurations of the fused MoE kernels (worker.kernels.fused_moe), per expert shape
and tokens-per-expert bucket.

The bucket is the expected rows per expert, ``T * k / E`` under uniform routing: decode with
few rows per expert is bound by reading the selected experts' weights (small ``block_m``, many
programs in flight), prefill by FLOPs (the largest tiles). The rule below follows the Hopper
tables vLLM ships for its Triton fused MoE (E=128/N=768 and E=8/N=14336 on the H100/H200),
restated by rows per expert; ``TUNED`` holds what the benchmark sweep
(``benchmarks/moe_kernel.py --sweep``) measured best per shape, where it differs.

Tiles are chosen per kind of expert arithmetic (``tile_kind``): ``bf16``, ``fp8`` (fused_moe's
``fp8_sums="exact"``: FP8 tiles of 64 rows or more, wgmma, multiply gate/up in fp16 and hold
those operands twice in shared memory, the e4m3 pipeline stages and one fp16 copy of the
converted tile), ``fp8-tile`` and ``fp8-fast`` (e4m3 operands straight into the tensor cores:
one byte per element in every stage, so twice the bf16 tile's block_k fits).

``RADIXQ_MOE_TILES`` may name a JSON file of measured tables in TUNED's form
(``benchmarks/moe_kernel.py --sweep --write-tiles PATH`` writes one for the GPU it runs on):
its entries take precedence over TUNED's, shape by shape.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import asdict, dataclass, replace

FP8_SUMS = ("exact", "tile", "fast")  # the FP8 gate/up GEMM's arithmetic (worker.kernels.fused_moe)
KINDS = ("bf16", "fp8", "fp8-tile", "fp8-fast")
TILES_ENV = "RADIXQ_MOE_TILES"


def tile_kind(fp8: bool, fp8_sums: str = "exact") -> str:
    """The kind of arithmetic tiles are chosen for (module docstring): bf16 experts, or FP8
    ones with fused_moe's ``fp8_sums``."""
    if not fp8:
        return "bf16"
    return "fp8" if fp8_sums == "exact" else f"fp8-{fp8_sums}"


@dataclass(frozen=True)
class MoeTiles:
    """One launch configuration of the fused MoE kernels.

    ``block_m`` rows per program (also each expert's padding unit); ``gate_up_n`` columns of
    the intermediate per program of the gate/up GEMM, which reads a gate and an up tile of that
    width (its tile is 2 x gate_up_n wide); ``down_n`` hidden columns per program of the down
    GEMM; ``block_k`` the reduction step of both; ``group_m`` row blocks that sweep the columns
    together (L2 reuse of their weight tiles); ``swap_ab`` computes each tile transposed (the
    weights' columns as the tensor core's rows, the block's rows as its columns: wgmma with
    e4m3 operands for blocks of 16-32 rows, which would otherwise take mma.sync in fp16)."""

    block_m: int
    gate_up_n: int
    down_n: int
    block_k: int
    group_m: int = 1
    num_warps: int = 4
    num_stages: int = 3
    swap_ab: bool = False

    def shared_bytes(self, kind: str) -> int:
        """Shared memory of the software pipeline: ``num_stages`` copies of the larger GEMM's
        operand tiles (gate/up reads two weight tiles per step), and for exact FP8 one fp16
        copy of the gate/up tiles it converts (at most; small tiles convert in registers)."""
        per_k = max(self.block_m + 2 * self.gate_up_n, self.block_m + self.down_n)
        if kind == "bf16":
            return self.num_stages * per_k * self.block_k * 2
        stages = self.num_stages * per_k * self.block_k
        return stages + (self.block_m + 2 * self.gate_up_n) * self.block_k * 2 if kind == "fp8" else stages

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
# e4m3 straight into wgmma (fp8-tile, fp8-fast): the bf16 tiles' bytes per stage at twice the
# block_k, one stage fewer at block_m 128 (147 KB)
_FP8_TILE_64 = replace(_TILE_64, block_k=128)
# NOTE: every FP8 kind's down GEMM holds two accumulators (each K tile's e4m3 sum and the float32
# total): at 128 rows x 256 columns they take 255 registers a thread and spill (316-364 B at 8
# warps; `scripts/compile_sm90.py moe-mixtral`, Triton 3.6 for sm_90a), so the FP8 tiles of 128
# rows take 128 down columns (202 registers, no spill); bf16's one accumulator fits 256 (199).
_FP8_TILE_128 = replace(_TILE_128, block_k=128, num_stages=3, down_n=128)
_EXACT_FP8_TILE_128 = replace(_TILE_128, down_n=128)

_EXACT_FP8 = ((8, _FP8_TILE_16), (16, _FP8_TILE_32), (64, _TILE_64), (float("inf"), _EXACT_FP8_TILE_128))
_WGMMA_FP8 = ((8, _FP8_TILE_16), (16, _FP8_TILE_32), (64, _FP8_TILE_64), (float("inf"), _FP8_TILE_128))
Table = tuple[tuple[float, MoeTiles], ...]  # (rows per expert at most, tiles), ascending

_RULE: dict[str, Table] = {
    "bf16": ((8, _TILE_16), (16, _TILE_32), (32, _TILE_64), (float("inf"), _TILE_128)),
    "fp8": _EXACT_FP8,
    "fp8-tile": _WGMMA_FP8,
    "fp8-fast": _WGMMA_FP8,
}

# (E, hidden, intermediate, kind) -> ((rows per expert at most, tiles), ...), ascending.
# Measured on one H200 (docs/performance.md, "The exact FP8 MoE kernel on one H200", its
# "Tiles, measured"; 2026-12-04): for exact FP8
# Qwen3-30B-A3B experts the block_m 32 tile (fp16 products in mma.sync) beats block_m 64 at
# decode's 64 rows per expert (405 vs 501 us at 1,024 tokens), and block_m 64 beats 128 at
# prefill (2,058 vs 2,162 us at 8,192 tokens); for FP8 Mixtral experts block_m 64 beats 128 at
# 256 rows per expert (2,255 vs 2,612 us at 1,024 tokens). For Qwen3-30B-A3B's e4m3-wgmma kinds
# (docs/performance.md, "FP8 MoE sums in the tensor cores"; `moe_kernel.py --sweep --wide`, 26
# tiles a cell): decode keeps the block_m 32 tile at block_k 128 (376.7 us fast, 382.3 tile at
# 1,024 tokens; block_m 64: 379-395), prefill takes block_m 64 at block_k 128 with 4 warps
# (1,262 / 1,256 us at 8,192 tokens; the rule's block_m 128: 1,414 / 1,496).
_QWEN3_WGMMA = (
    (8, _FP8_TILE_16),
    (16, _FP8_TILE_32),
    (64, replace(_TILE_32, block_k=128)),
    (float("inf"), _FP8_TILE_64),
)
# For fp8-fast, decode's bucket takes a transposed tile (docs/performance.md, "Transposed MoE
# tiles on one H200"; 2026-12-05, `moe_kernel.py --sweep --swap`, 20 tiles): block_m 64 rows
# as wgmma's N side, 128 weight columns, four stages, 341.3 us at 1,024 tokens against the
# block_m 32 tile's 375.4 in the same call (Qwen3-30B-A3B at scale with it: 18,996 tok/s).
_QWEN3_FAST = (
    *_QWEN3_WGMMA[:2],
    (64, MoeTiles(64, 128, 128, 128, 8, 4, 4, swap_ab=True)),
    _QWEN3_WGMMA[3],
)
TUNED: dict[tuple[int, int, int, str], Table] = {
    (128, 2048, 768, "fp8"): ((8, _FP8_TILE_16), (64, _FP8_TILE_32), (float("inf"), _TILE_64)),
    (128, 2048, 768, "fp8-tile"): _QWEN3_WGMMA,
    (128, 2048, 768, "fp8-fast"): _QWEN3_FAST,
    (8, 4096, 14336, "fp8"): (
        (8, _FP8_TILE_16),
        (16, _FP8_TILE_32),
        (256, _TILE_64),
        (float("inf"), _EXACT_FP8_TILE_128),
    ),
}


def rule_buckets(kind: str) -> Table:
    """The rule's (rows per expert at most, tiles) for this kind of experts, ascending."""
    return _RULE[kind]


def rule_tiles(kind: str) -> list[MoeTiles]:
    """Every tile the rule may pick for this kind of experts, smallest bucket first."""
    return [tiles for _, tiles in rule_buckets(kind)]


def sweep_tiles(
    kind: str, shared_limit: int = 200 * 2**10, wide: bool = False, swap: bool = False
) -> list[MoeTiles]:
    """What ``benchmarks/moe_kernel.py --sweep`` times: the rule's tiles, each also with the
    other warp count and with half and twice its column blocks, where they fit in shared
    memory; ``wide`` adds half and twice the block_k and one pipeline stage more or fewer;
    ``swap`` times the rule's tiles and transposed ones (``swap_ab``) of 16-64 rows instead, with
    ``wide`` each transposed one also at 8 warps, one stage more and with group_m 1, and blocks
    of 128 rows at 8 warps (one block for every expert's 64 +- 8 rows at decode's 1,024 x top-8
    over 128 experts: each expert's weights read once)."""
    if swap:
        swapped = _swapped(kind)
        if wide:
            swapped += [replace(t, num_warps=8) for t in _swapped(kind, rows=(128,))]
            swapped += [
                variant
                for t in swapped
                for variant in (
                    replace(t, num_warps=8),
                    replace(t, num_stages=t.num_stages + 1),
                    replace(t, group_m=1),
                )
            ]
        unique = dict.fromkeys((*rule_tiles(kind), *swapped))
        return [t for t in unique if t.shared_bytes(kind) <= shared_limit]
    found: dict[MoeTiles, None] = {}
    for t in rule_tiles(kind):
        variants = [
            t,
            replace(t, num_warps=12 - t.num_warps),
            replace(t, gate_up_n=max(16, t.gate_up_n // 2), down_n=max(16, t.down_n // 2)),
            replace(t, gate_up_n=t.gate_up_n * 2, down_n=t.down_n * 2),
        ]
        if wide:
            variants += [
                replace(t, block_k=max(16, t.block_k // 2)),
                replace(t, block_k=t.block_k * 2),
                replace(t, num_stages=t.num_stages + 1),
                replace(t, num_stages=max(2, t.num_stages - 1)),
            ]
        for variant in variants:
            if variant.shared_bytes(kind) <= shared_limit:
                found[variant] = None
    return list(found)


def _swapped(kind: str, rows: tuple[int, ...] = (16, 32, 64)) -> list[MoeTiles]:
    """Transposed tiles for few rows per expert: 16, 32 or 64 rows (the tensor core's columns)
    by 64 or 128 weight columns (its rows), 128 bytes of K in four stages or 256 in three."""
    block_k = 64 if kind == "bf16" else 128
    return [
        MoeTiles(block_m, up_n, down_n, k, 8, 4, 4 if k == block_k else 3, swap_ab=True)
        for block_m in rows
        for up_n, down_n in ((64, 64), (64, 128), (128, 128))
        for k in (block_k, 2 * block_k)
    ]


def table_to_json(tables: dict[tuple[int, int, int, str], Table]) -> str:
    """TUNED's form as JSON (``RADIXQ_MOE_TILES``): "E,H,I,kind" -> [[max rows per expert or
    null for the last bucket, {tile fields}], ...]."""
    out = {
        ",".join(map(str, key)): [
            [None if bound == float("inf") else bound, asdict(t)] for bound, t in buckets
        ]
        for key, buckets in tables.items()
    }
    return json.dumps(out, indent=1)


@functools.cache
def _file_tables(path: str) -> dict[tuple[int, int, int, str], Table]:
    try:
        raw = json.loads(open(path).read())
        tables = {}
        for key, buckets in raw.items():
            e, h, i, kind = key.split(",")
            if kind not in KINDS:
                raise ValueError(f"kind {kind!r} not in {list(KINDS)}")
            table = tuple(
                (float("inf") if b is None else float(b), MoeTiles(**fields)) for b, fields in buckets
            )
            if not table or table[-1][0] != float("inf"):
                raise ValueError(f"{key}: the last bucket's bound must be null (unbounded)")
            tables[(int(e), int(h), int(i), kind)] = table
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        raise ValueError(f"{TILES_ENV}={path}: not a table of MoE tiles ({exc})") from exc
    return tables


def check_tiles_file() -> None:
    """Read ``RADIXQ_MOE_TILES`` now, when set: a ValueError naming it and the file if it is not
    a table of tiles, so a bad file stops an engine with MoE layers at start-up rather than at
    its first MoE step."""
    path = os.environ.get(TILES_ENV)
    if path:
        _file_tables(path)


def tile_table(key: tuple[int, int, int, str]) -> Table:
    """The buckets for (E, H, I, kind): ``RADIXQ_MOE_TILES``'s, else TUNED's, else the rule's
    (each ends unbounded)."""
    path = os.environ.get(TILES_ENV)
    found = _file_tables(path).get(key) if path else None
    return found or TUNED.get(key) or _RULE[key[3]]


def moe_tiles(num_experts: int, hidden: int, inter: int, num_entries: int, kind: str) -> MoeTiles:
    """The tiles for ``num_entries`` (tokens x top-k) routed over ``num_experts`` experts of
    this shape and ``kind`` (tile_kind): a measured entry when there is one
    (``RADIXQ_MOE_TILES``, then TUNED), else the rule."""
    rows_per_expert = num_entries / num_experts
    for bound, tiles in tile_table((num_experts, hidden, inter, kind)):
        if rows_per_expert <= bound:
            return tiles
    raise AssertionError("every table's last bucket is unbounded")
