"""Running one workload on a tensor-parallel group inside the test process (rank 0 here, the
followers as child processes) or on one engine, for comparing their tokens and logprobs.

Every request is queued before the first step, so rank 0's first receive takes them all and
every TP size schedules the same batches: what differs between the runs is only the order
in which the row-parallel layers' partial sums are added.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

import torch

from wire.schema import SamplingParams
from worker.distributed import LEFT_ALONE, LEFT_DESTROYED
from worker.scheduler.config import SchedulerProcessConfig
from worker.scheduler.io import InMemoryIO
from worker.scheduler.messages import GenerateRequest, RequestFinished, ShutdownRequest
from worker.scheduler.run import _lead_group, build_scheduler, leave_group


@dataclass(frozen=True)
class Outcome:
    finished: dict[str, RequestFinished]
    retractions: int
    cached_tokens: int
    chunked: bool  # some prompt was longer than the prefill budget
    follower_pids: tuple[int, ...]
    follower_exits: tuple[int | None, ...]  # each follower's exit status once the group was left
    left: str  # how rank 0 left the group (worker.distributed.LEFT_*)
    graph_replays: int  # rank 0's decode passes replayed from a CUDA graph


def greedy(max_tokens: int, n: int = 1) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, n=n, logprobs=True, top_logprobs=3)


def run_workload(config: SchedulerProcessConfig, requests: list[GenerateRequest]) -> Outcome:
    """Serve ``requests`` on a group of ``config.engine.tensor_parallel_size`` ranks until all are
    answered, then leave the group as every scheduler process does (worker.scheduler.run
    .leave_group: rank 0 here, the followers after the ShutdownRequest forwarded to them);
    the followers have exited before this returns."""
    io = InMemoryIO()
    leader_io, group = _lead_group(config.resolved(), io, "WARNING")
    scheduler = None
    clean = False
    try:
        scheduler = build_scheduler(config, leader_io, detokenize=lambda ids: "")
        for request in requests:
            io.put(request)
        scheduler.run_until_idle()
        finished = {m.uid: m for m in io.take_all() if isinstance(m, RequestFinished)}
        runner = scheduler.engine.graph_runner
        graph_replays = runner.replays if runner is not None else 0
        if group is not None:
            group.forward([ShutdownRequest()])
        clean = True
    finally:
        left = leave_group(scheduler, group, clean)
    assert scheduler is not None
    outcome = Outcome(
        finished=finished,
        retractions=scheduler.stats.retractions,
        cached_tokens=scheduler.stats.cached_tokens,
        chunked=max(len(r.input_ids) for r in requests) > config.scheduler.max_prefill_tokens,
        follower_pids=tuple(group.pids) if group is not None else (),
        follower_exits=tuple(p.returncode for p in group.followers.values()) if group is not None else (),
        left=left,
        graph_replays=graph_replays,
    )
    # NOTE: the next engine of this process sizes its KV pool from the memory free then
    scheduler = None
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return outcome


def assert_left_cleanly(outcome: Outcome) -> None:
    """Every rank left the group the normal way: rank 0 destroyed it (every rank said it was
    leaving, in time) and every follower exited with 0."""
    want = LEFT_DESTROYED if outcome.follower_pids else LEFT_ALONE
    assert outcome.left == want, f"rank 0 left the group: {outcome.left}"
    assert all(code == 0 for code in outcome.follower_exits), f"follower exits: {outcome.follower_exits}"


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
