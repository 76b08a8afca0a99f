"""Running one workload on a tensor-parallel group inside the test process (rank 0 here, the
followers as child processes) or on one engine, for comparing their tokens and logprobs.

Every request is queued before the first step, so rank 0's first receive takes them all and
every TP size schedules the same batches: what differs between the runs is only the order
in which the row-parallel layers' partial sums are added.
"""

from __future__ import annotations

from dataclasses import dataclass

from wire.schema import SamplingParams
from worker.distributed import close_tp
from worker.scheduler.config import RunConfig
from worker.scheduler.io import InMemoryIO
from worker.scheduler.messages import GenerateRequest, RequestFinished, ShutdownRequest
from worker.scheduler.run import _lead_group, build_scheduler


@dataclass(frozen=True)
class Outcome:
    finished: dict[str, RequestFinished]
    retractions: int
    cached_tokens: int
    chunked: bool  # some prompt was longer than the prefill budget
    follower_pids: tuple[int, ...]


def greedy(max_tokens: int, n: int = 1) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, n=n, logprobs=True, top_logprobs=3)


def run_workload(config: RunConfig, requests: list[GenerateRequest]) -> Outcome:
    """Serve ``requests`` on a group of ``config.engine.tensor_parallel_size`` ranks until all are
    answered; the group is stopped (followers waited for) before this returns."""
    io = InMemoryIO()
    leader_io, group = _lead_group(config.resolved(), io, "WARNING")
    try:
        scheduler = build_scheduler(config, leader_io, detokenize=lambda ids: "")
        for request in requests:
            io.put(request)
        scheduler.run_until_idle()
        finished = {m.uid: m for m in io.take_all() if isinstance(m, RequestFinished)}
        scheduler.close()
        if group is not None:
            group.forward([ShutdownRequest()])
            group.stop(timeout_s=120)
            assert all(p.returncode == 0 for p in group.followers.values()), "a follower did not exit cleanly"
    finally:
        if group is not None:
            group.kill()
        close_tp()
    return Outcome(
        finished=finished,
        retractions=scheduler.stats.retractions,
        cached_tokens=scheduler.stats.cached_tokens,
        chunked=max(len(r.input_ids) for r in requests) > config.scheduler.max_prefill_tokens,
        follower_pids=tuple(group.pids) if group is not None else (),
    )


def assert_same_generation(got: Outcome, want: Outcome, logprob_atol: float) -> None:
    """Same requests, same tokens exactly, logprobs (sampled and top) within ``logprob_atol``."""
    assert got.finished.keys() == want.finished.keys()
    for uid, expected in want.finished.items():
        actual = got.finished[uid]
        assert actual.error_code is None and expected.error_code is None, (actual, expected)
        assert len(actual.choices) == len(expected.choices)
        for a, e in zip(actual.choices, expected.choices, strict=True):
            assert a.token_ids == e.token_ids, f"{uid} choice {e.index}"
            assert a.logprobs is not None and e.logprobs is not None
            for la, le in zip(a.logprobs, e.logprobs, strict=True):
                assert abs(la.logprob - le.logprob) <= logprob_atol, (uid, la, le)
                assert la.top_ids == le.top_ids
                assert (
                    max(abs(x - y) for x, y in zip(la.top_logprobs, le.top_logprobs, strict=True))
                    <= logprob_atol
                )
