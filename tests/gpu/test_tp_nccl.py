"""Tensor parallelism on two GPUs over NCCL: the whole CUDA path (FlashInfer, CUDA graphs with
the all-reduce captured, overlap) with TP=2 against TP=1 on the same GPU.

bf16: TP=2 adds its two ranks' partial sums of o_proj / down_proj in another order, which may
flip a near-tie, so tokens are compared up to the first difference, where both runs' logprobs
of the chosen tokens must be within BF16_LOGPROB_GAP; logprobs before it within the same.
Decode runs from CUDA graphs whose capture holds the all-reduce (TP=2's graphs replayed, as
counted on rank 0). Then every rank leaves the group the normal way: NCCL's destroy, which
hung on rank 0 while its own graphs still held the communicator (issue 34); the pytest-level
timeout turns any such hang into a failure. Needs two visible GPUs (nvidia-h200-x2).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from tests.model_fixtures import tp_gpu_model_dir  # noqa: E402,F401  (a fixture)
from tests.tp_harness import assert_left_cleanly, greedy, run_workload  # noqa: E402
from worker.scheduler.config import SchedulerProcessConfig  # noqa: E402
from worker.scheduler.messages import GenerateRequest  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two visible GPUs (nvidia-h200-x2)"),
]
BF16_LOGPROB_GAP = 0.05


@pytest.mark.timeout(270)
def test_tp2_on_nccl_generates_what_tp1_generates(tp_gpu_model_dir: Path) -> None:  # noqa: F811
    gen = torch.Generator().manual_seed(5)
    requests = [
        GenerateRequest(f"g{i}", torch.randint(0, 256, (8 + 13 * i,), generator=gen).tolist(), greedy(24))
        for i in range(12)
    ]

    def config(tp: int) -> SchedulerProcessConfig:
        return SchedulerProcessConfig.from_options(
            str(tp_gpu_model_dir), device="cuda", dtype="bfloat16", tensor_parallel_size=tp
        )

    want = run_workload(config(1), requests)
    got = run_workload(config(2), requests)
    assert_left_cleanly(want)
    assert_left_cleanly(got)  # destroyed on every rank, not aborted, and nothing hung
    assert want.graph_replays > 0 and got.graph_replays > 0, (want.graph_replays, got.graph_replays)
    assert got.finished.keys() == want.finished.keys()
    for uid, expected in want.finished.items():
        a, e = got.finished[uid].choices[0], expected.choices[0]
        assert a.logprobs is not None and e.logprobs is not None
        for token_a, token_e, la, le in zip(a.token_ids, e.token_ids, a.logprobs, e.logprobs, strict=False):
            assert abs(la.logprob - le.logprob) <= BF16_LOGPROB_GAP, (uid, la, le)
            if token_a != token_e:
                break
