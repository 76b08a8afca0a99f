"""benchmarks/overlap_probe.py on CPU with the torch attention backend (no streams, no graphs):
every variant runs and is timed, and a nano-batch's attention reads its own requests' pages
(dense float32 attention over the same pages is the oracle)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

from attention_backend import dense_error  # noqa: E402
from model_shape import ModelShape  # noqa: E402
from overlap_probe import VARIANTS, half, main, prepare  # noqa: E402

SMOKE = ["--device", "cpu", "--attention", "torch", "--layers", "2", "--batch", "4", "--length", "40",
         "--hidden", "64", "--reps", "2"]  # fmt: skip


def test_every_variant_is_timed_for_each_kv_dtype(capsys) -> None:
    rows = main(SMOKE)
    assert [r["kv"] for r in rows] == ["bf16", "fp8"]
    for r in rows:
        assert all(r[f"{v}_ms"] > 0 for v in VARIANTS)
        assert r["best_possible_ms"] == max(r["attention_ms"], r["gemms_ms"])
    assert "| bf16 |" in capsys.readouterr().out


def test_a_half_attends_over_its_own_pages() -> None:
    shape = ModelShape.from_config(json.loads((REPO / "configs/qwen3-0.6b.json").read_text()))
    shape = replace(shape, hidden=64, intermediate=192)
    args = argparse.Namespace(length=40, kv="bf16", page_size=16, attention="torch", device="cpu", layers=2)
    h = half(args, shape, 3, seed=5)
    prepare(h)
    q = torch.randn(3, shape.heads, shape.head_dim).to(torch.bfloat16)
    out = h.backend.forward(q, 0, h.meta)
    assert dense_error(h.backend, h.layout, q, out, rows=3) < 1e-2
