"""benchmarks/moe_kernel.py on CPU: the expert shapes it reads from configs/, its FLOP and
byte counts against hand arithmetic, its torch-loop baseline against the oracle every
candidate's error is measured against (worker.kernels.moe.experts_loop), and its table."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

from moe_candidates import ExpertShape, Inputs, Layer, oracle, torch_loop  # noqa: E402
from moe_kernel import expert_shape, print_table  # noqa: E402

from tests.moe_oracle import relative_error  # noqa: E402


def test_expert_shapes_and_counts():
    qwen = expert_shape("qwen3-30b-a3b")
    assert qwen == ExpertShape(num_experts=128, top_k=8, hidden=2048, inter=768)
    assert expert_shape("mixtral-8x7b") == ExpertShape(num_experts=8, top_k=2, hidden=4096, inter=14336)
    # 64 tokens x 8 experts x (2048 x 1536 + 768 x 2048) multiply-adds, 2 FLOPs each
    assert qwen.flops(64) == 2 * 512 * 4_718_592 == 4_831_838_208
    assert qwen.expert_bytes(fp8=False) == 2 * 4_718_592
    assert qwen.expert_bytes(fp8=True) == 4_718_592 + 4 * (1536 + 2048)  # e4m3 + float32 row scales


@pytest.mark.parametrize("fp8", [False, True])
def test_loop_baseline_matches_the_oracle(fp8: bool):
    shape = ExpertShape(num_experts=6, top_k=2, hidden=64, inter=32)
    layer = Layer.random(shape, fp8=fp8, device="cpu")
    inputs = Inputs.random(shape, 9, seed=1, device="cpu")
    assert relative_error(torch_loop(layer, inputs), oracle(layer, inputs)) < 1e-2
    assert inputs.active_experts == len(set(inputs.topk_ids.flatten().tolist()))


def test_table_reports_failures_and_the_loop_ratio(capsys: pytest.CaptureFixture[str]):
    cell = {"model": "m", "dtype": "bf16", "tokens": 64, "active_experts": 8, "mode": "graph", "status": "ok"}
    rows = [
        {**cell, "candidate": "triton", "time_us": 50.0, "tflops": 1.0, "weight_tbps": 2.0, "rel_err": 1e-3},
        {**cell, "candidate": "loop", "mode": "eager", "time_us": 400.0, "tflops": 0.1, "weight_tbps": 0.2,
         "rel_err": 0.0},
        {"candidate": "flashinfer", "status": "no result after 160 s: build or first call not finished"},
    ]  # fmt: skip
    print_table(rows)
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[2].startswith("| m | bf16 | 64 | triton | graph | 50.0 |") and "| 8.0x |" in lines[2]
    assert "| 1.0x |" in lines[3]
    assert "build or first call not finished" in lines[4]


def test_sweep_rows_become_a_tiles_file(tmp_path, monkeypatch: pytest.MonkeyPatch):
    """--write-tiles: each token count's best tiles up to its rows per expert; below the
    smallest count and past the largest, the table in use (here TUNED's); RADIXQ_MOE_TILES then
    picks them."""
    from dataclasses import asdict

    from moe_kernel import write_tiles

    from worker.kernels.moe_tiles import TILES_ENV, TUNED, MoeTiles, moe_tiles

    decode, prefill = MoeTiles(32, 64, 128, 128, 8, 4, 3, swap_ab=True), MoeTiles(64, 64, 128, 128, 8, 4, 4)
    cell = {"model": "qwen3-30b-a3b", "dtype": "fp8", "status": "ok", "candidate": "triton-fast (best tiles)"}
    rows = [{**cell, "tokens": 1024, "best_tiles": asdict(decode)}, {**cell, "tokens": 8192, "best_tiles": asdict(prefill)},
            {**cell, "tokens": 64, "status": "failed: x", "best_tiles": None}]  # fmt: skip
    path = tmp_path / "tiles.json"
    write_tiles(rows, str(path))
    monkeypatch.setenv(TILES_ENV, str(path))
    shape = (128, 2048, 768)
    tuned = TUNED[(*shape, "fp8-fast")]
    assert moe_tiles(*shape, 1024 * 8, "fp8-fast") == decode  # 64 rows per expert
    assert moe_tiles(*shape, 2048 * 8, "fp8-fast") == prefill  # up to 512 rows, the last count measured
    assert tuned[-1][1] != prefill and moe_tiles(*shape, 16384 * 8, "fp8-fast") == tuned[-1][1]  # past it
    assert moe_tiles(*shape, 64 * 8, "fp8-fast") == tuned[0][1]  # 4 rows per expert: below the first
    other = TUNED[(*shape, "fp8-tile")][-1][1]  # another kind: the built-in table still
    assert other != prefill and moe_tiles(*shape, 2048 * 8, "fp8-tile") == other


def test_table_prints_errors_against_float64(capsys: pytest.CaptureFixture[str]):
    row = {"model": "m", "dtype": "fp8", "tokens": 64, "active_experts": 8, "mode": "graph", "status": "ok",
           "candidate": "triton-fast", "time_us": 50.0, "tflops": 1.0, "weight_tbps": 2.0, "rel_err": 3e-2,
           "truth_rms": 0.0457, "truth_max": 0.059, "loop_truth_rms": 0.0456, "loop_truth_max": 0.05}  # fmt: skip
    print_table([row])
    line = capsys.readouterr().out.strip().splitlines()[2]
    assert line.endswith("| 3.0e-02 | 4.57e-02, 5.9e-02 | 4.56e-02, 5.0e-02 |")
