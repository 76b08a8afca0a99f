"""benchmarks/fp8_rows.py on CPU under triton's interpreter: both schedules of the row quantizer
run at widths that take the one-pass tiles (several rows a program, the last program part
empty) and the two-pass loop, and write the same bytes; what they write is checked against
quantize_fp8_rows_ref in tests/unit/test_kernels_interpret.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.triton_interpret import interpreted_test_module

interpreted_test_module("worker.kernels.triton_kernels", native_tests="benchmarks/fp8_rows.py on the device")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from fp8_rows import main  # noqa: E402


def test_both_schedules_write_the_same_bytes(monkeypatch, capsys) -> None:
    from worker.kernels import ops

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with ops.triton_scope(True):
        rows = main(["--device", "cpu", "--shapes", "7x96,5x700,2x4100", "--reps", "1"])
    assert [(r["rows"], r["width"]) for r in rows] == [(7, 96), (5, 700), (2, 4100)]
    assert all(r["same_bytes"] for r in rows)
    assert all(r["now_us"] > 0 and r["before_us"] > 0 for r in rows)
    assert "| 5x700 |" in capsys.readouterr().out


def test_without_the_kernels_it_says_so(monkeypatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(SystemExit):
        main(["--device", "cpu", "--shapes", "2x8", "--reps", "1"])
