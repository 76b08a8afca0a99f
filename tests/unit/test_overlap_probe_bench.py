"""benchmarks/overlap_probe.py on CPU with the torch attention backend (no streams, no graphs):
every variant runs and is timed (the bounded GEMM's under triton's interpreter, FP8 weights
through the engine's Fp8Linear), and a nano-batch's attention reads its own requests' pages
(dense float32 attention over the same pages is the oracle)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

from attention_backend import dense_error  # noqa: E402
from model_shape import ModelShape  # noqa: E402
from overlap_probe import VARIANTS, half, main, prepare  # noqa: E402

from tests.triton_interpret import import_interpreted  # noqa: E402

SMOKE = ["--device", "cpu", "--attention", "torch", "--layers", "2", "--batch", "4", "--length", "40",
         "--hidden", "64", "--reps", "2"]  # fmt: skip


def test_every_variant_is_timed_for_each_kv_dtype(capsys) -> None:
    rows = main(SMOKE)
    assert [r["kv"] for r in rows] == ["bf16", "fp8"]
    for r in rows:
        assert all(r[f"{v}_ms"] > 0 for v in VARIANTS)
        assert r["best_possible_ms"] == max(r["attention_ms"], r["gemms_ms"])
        assert r["prio_agree"] == 0.0  # the chain split over two streams' lanes computes the same
    assert "| bf16 |" in capsys.readouterr().out


def test_bounded_variants_and_fp8_weights(monkeypatch, capsys) -> None:
    """overlap@S and gemms@S run through the bounded GEMM (per-thread loads, and TMA as S/tma),
    whose agreement with the cuBLAS path (here the FP8 emulation) is reported beside them."""
    try:
        import_interpreted("worker.kernels.bounded_gemm_triton", "worker.kernels.triton_kernels")
    except ImportError:
        pytest.skip("triton is not installed (the bounded GEMM runs on CUDA only)")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    rows = main([*SMOKE, "--kv", "fp8", "--weights", "fp8", "--gemm-sms", "2"])
    (row,) = rows
    assert row["weights"] == "fp8"
    for bound in ("2", "2/tma"):
        assert row[f"overlap@{bound}_ms"] > 0 and row[f"gemms@{bound}_ms"] > 0
        assert row[f"agree@{bound}"] < 2e-2  # bf16 outputs: a few 1e-3
    out = capsys.readouterr().out
    assert "| fp8 | fp8 | gemms@2 |" in out and "| fp8 | fp8 | gemms@2/tma |" in out


def test_bounded_variants_on_cpu_need_the_interpreter(monkeypatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(SystemExit):
        main([*SMOKE, "--gemm-sms", "2"])


def test_a_half_attends_over_its_own_pages() -> None:
    shape = ModelShape.from_config(json.loads((REPO / "configs/qwen3-0.6b.json").read_text()))
    shape = replace(shape, hidden=64, intermediate=192)
    args = argparse.Namespace(
        length=40, kv="bf16", page_size=16, attention="torch", device="cpu", layers=2, weights="bf16"
    )
    h = half(args, shape, 3, seed=5)
    prepare(h)
    q = torch.randn(3, shape.heads, shape.head_dim).to(torch.bfloat16)
    out = h.backend.forward(q, 0, h.meta)
    assert dense_error(h.backend, h.layout, q, out, rows=3) < 1e-2


def test_budget_stops_the_rounds_after_three_and_keeps_the_rows(tmp_path) -> None:
    """--budget-s 0: three rounds, not --reps; the JSON is written once the row ends."""
    out = tmp_path / "probe.json"
    rows = main(
        ["--device", "cpu", "--attention", "torch", "--layers", "1", "--batch", "4", "--length", "24",
         "--hidden", "32", "--gemm-sms", "", "--kv", "bf16", "--reps", "40", "--budget-s", "0", "--out", str(out)]
    )  # fmt: skip
    assert rows[0]["reps"] == 3
    assert json.loads(out.read_text())[0]["whole_ms"] == rows[0]["whole_ms"]


@pytest.mark.parametrize("option", ["--green-sms", "--split-sms"])
def test_green_contexts_are_refused_off_cuda(option, capsys) -> None:
    """--green-sms and --split-sms hold kernels to SMs of green contexts: CUDA-only variants,
    refused at once with the option named."""
    with pytest.raises(SystemExit):
        main([*SMOKE, "--gemm-sms", "", option, "66"])
    assert "--split-sms need CUDA" in capsys.readouterr().err
