"""benchmarks/fp8_accumulation.py's model of the FP8 tensor core's accumulator, against hand
arithmetic: 13 bits of mantissa kept (truncated toward zero), promotion to float32 restoring
what the accumulator drops, the exact strategy matching float64, and the power-of-two scale rule
against ceil(log2) and e4m3's grid."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from fp8_accumulation import EXACT, NEVER, e4m3_rows, pow2_scale, tensor_core_gemm, truncate_mantissa  # noqa: E402


def test_the_accumulator_keeps_13_mantissa_bits_toward_zero():
    x = torch.tensor([1 + 2**-13, 1 + 2**-14, -(1 + 2**-14 + 2**-20), 3.0])
    assert truncate_mantissa(x).tolist() == [1 + 2**-13, 1.0, -1.0, 3.0]


def test_promotion_keeps_what_the_accumulator_drops():
    # K = 64: the first instruction's 32 products sum to 1, the second's to 2**-15
    a = torch.zeros(1, 64)
    a[0, 0], a[0, 32] = 1.0, 2**-15
    b = torch.ones(64, 1)
    assert tensor_core_gemm(a, b, NEVER).item() == 1.0  # 1 + 2**-15 truncated to 13 bits
    assert tensor_core_gemm(a, b, 32).item() == 1 + 2**-15
    assert tensor_core_gemm(a, b, EXACT).item() == 1 + 2**-15


def test_exact_strategy_is_the_float64_product():
    gen = torch.Generator().manual_seed(0)
    a, _ = e4m3_rows(torch.randn(8, 256, generator=gen))
    b, _ = e4m3_rows(torch.randn(16, 256, generator=gen))
    want = a.double() @ b.double().t()
    got = tensor_core_gemm(a, b.t(), EXACT)
    assert ((got.double() - want).abs().max() / want.abs().max()).item() < 1e-6
    assert ((tensor_core_gemm(a, b.t(), NEVER).double() - want).abs().max() / want.abs().max()).item() > 1e-5


def test_pow2_scale_is_the_least_power_of_two_at_or_above_max_over_448():
    amax = torch.tensor([448.0, 56.0, 449.0, 0.875, 0.8750001, 1.0, 1.5, 392.0, 393.0, 1e-12])
    want = [2.0 ** math.ceil(math.log2(a / 448)) for a in amax.double().tolist()]
    assert pow2_scale(amax).tolist() == want


def test_a_pow2_scale_leaves_the_e4m3_values_of_a_row_alone_when_the_row_doubles():
    # the row's maximum moves across no power of two other than the doubling: same e4m3 data
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, 512, generator=gen)
    (q, s), (q2, s2) = e4m3_rows(x, "pow2"), e4m3_rows(2 * x, "pow2")
    assert torch.equal(q, q2) and torch.equal(2 * s, s2)
    assert ((q.abs().amax(dim=-1) > 224) & (q.abs().amax(dim=-1) <= 448)).all()
