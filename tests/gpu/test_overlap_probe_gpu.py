"""benchmarks/overlap_probe.py's split variants on the GPU: the device is cut into two disjoint
green contexts (the driver's SM counts, oracle: the device's own SM count), and a nano-batch's
chain with its attention on one part and its GEMMs on the other computes what one stream does
(the same kernels, or at most bf16 rounding apart)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

from overlap_probe import main  # noqa: E402

from worker.engine.split import green_streams  # noqa: E402


def test_the_two_parts_are_disjoint_and_cover_at_most_the_device() -> None:
    attention, gemms, attention_sms, gemm_sms = green_streams(48)
    total = torch.cuda.get_device_properties(0).multi_processor_count
    assert len(attention) == len(gemms) == 2
    assert attention_sms >= 48 and gemm_sms > 0
    assert attention_sms + gemm_sms <= total
    x = torch.ones(1024, device="cuda")
    with torch.cuda.stream(gemms[0]):  # a kernel on a green context's stream runs and completes
        y = x * 2
    gemms[0].synchronize()
    assert float(y.sum()) == 2048.0


def test_split_variants_run_and_agree_with_one_stream() -> None:
    rows = main(["--model", str(REPO / "configs/qwen3-0.6b.json"), "--batch", "64", "--length", "100",
                 "--layers", "2", "--reps", "3", "--kv", "bf16", "--gemm-sms", "", "--carveout", "",
                 "--split-sms", "48", "--split-graph"])  # fmt: skip
    row = rows[0]
    assert not [k for k in row if k.startswith("split_error")], row
    # the same kernels on the same inputs give 0; cuBLAS may pick another kernel for a part's fewer
    # SMs (bf16 rounding, ~1e-3), while a race (a kernel reading before its producer ends) is O(1)
    (agree,) = [v for k, v in row.items() if k.startswith("split_agree@")]
    assert agree <= 0.05
    timed = [k for k in row if "split" in k and k.endswith("_ms")]
    assert len(timed) >= 3 and all(row[k] > 0 for k in timed), row
