"""benchmarks/sampling.py on CPU under triton's interpreter: the fused sampler, its previous
two-pass schedule and the torch path all run on rows that sample and on greedy rows, and the
two kernel schedules draw the tokens the torch sampler draws (the oracle; a draw may differ
only within float rounding of a token boundary, which these few rows do not reach)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.triton_interpret import interpreted_test_module

interpreted_test_module("worker.kernels.sampling_triton", native_tests="benchmarks/sampling.py on the device")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from sampling import main  # noqa: E402


def test_both_schedules_and_the_torch_path_draw_alike(monkeypatch, capsys) -> None:
    from worker.kernels import ops

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with ops.triton_scope(True):
        rows = main(["--device", "cpu", "--shapes", "3x9000", "--reps", "1"])
    assert [(r["dtype"], r["greedy"]) for r in rows] == [
        ("bfloat16", False), ("bfloat16", True), ("float32", False), ("float32", True)
    ]  # fmt: skip
    assert all(r["draws_differ"] == 0 and r["before_differs"] == 0 for r in rows)
    assert all(r["kernel_us"] > 0 and r["before_us"] > 0 and r["torch_us"] > 0 for r in rows)
    assert "| 3 x 9000 | bfloat16 | T 0.6 |" in capsys.readouterr().out


def test_without_the_kernels_it_says_so(monkeypatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(SystemExit):
        main(["--device", "cpu", "--shapes", "2x8", "--reps", "1"])
