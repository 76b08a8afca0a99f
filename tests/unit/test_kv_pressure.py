"""KV safety under pressure: random workloads (shared and unshared prefixes, n > 1, chunked
prefill, staggered arrivals, tiny pools) driven step by step through the scheduler on CPU.

Checked after every step: no exception, every KV page accounted for exactly once (free +
cached + private == total). At the end: every request finished, and its greedy tokens equal
those of the same workload run with an ample pool (no eviction, no retraction, no chunking).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.model_fixtures import tiny_hf_model
from wire.schema import SamplingParams
from worker.scheduler import InMemoryIO, build_scheduler
from worker.scheduler.config import SchedulerProcessConfig
from worker.scheduler.messages import GenerateRequest, RequestFinished

Job = tuple[list[int], int, int, int]  # prompt, n, max_tokens, arrival step


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("kv-pressure-llama")
    tiny_hf_model("llama", spread=0.2).save_pretrained(path)
    return path


def run_workload(path: Path, jobs: list[Job], max_steps: int = 3000, **options) -> dict[str, list[list[int]]]:
    """Drive ``jobs`` through a fresh scheduler, checking page integrity after every step;
    return each job's choices' token ids."""
    config = SchedulerProcessConfig.from_options(str(path), device="cpu", attention="torch", **options)
    io = InMemoryIO()
    scheduler = build_scheduler(config, io)
    last = None
    for step in range(max_steps):
        for i, (prompt, n, max_tokens, arrival) in enumerate(jobs):
            if arrival == step:
                sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, n=n, ignore_eos=True)
                io.put(GenerateRequest(uid=f"job-{i}", input_ids=prompt, sampling=sampling))
        last = scheduler.step(last, block=False)
        scheduler.check_integrity(last)
        if last is None and scheduler.idle and step >= max(j[3] for j in jobs):
            break
    assert scheduler.idle, f"not every request finished within {max_steps} steps"
    assert scheduler.cache.num_private_pages == 0
    finished = {m.uid: m for m in io.take_all() if isinstance(m, RequestFinished)}
    assert len(finished) == len(jobs)
    errors = {uid: m.error_message for uid, m in finished.items() if m.error_code is not None}
    assert not errors, errors
    return {uid: [c.token_ids for c in m.choices] for uid, m in finished.items()}


@st.composite
def workloads(draw) -> tuple[list[Job], dict]:
    page_size = draw(st.sampled_from([1, 2, 4]))
    prefixes = draw(st.lists(st.lists(st.integers(1, 250), min_size=0, max_size=48), min_size=1, max_size=4))
    jobs: list[Job] = []
    for _ in range(draw(st.integers(1, 10))):
        prefix = draw(st.sampled_from(prefixes))
        tail = draw(st.lists(st.integers(1, 250), min_size=1, max_size=16))
        n = draw(st.sampled_from([1, 1, 2, 3]))
        jobs.append((prefix + tail, n, draw(st.integers(1, 12)), draw(st.sampled_from([0, 0, 0, 3, 9]))))
    largest = max(len(p) + m for p, _, m, _ in jobs)
    # the pool holds the largest request (plus a page of slack) and at most a few more
    num_pages = -(-largest // page_size) + 1 + draw(st.integers(0, 12))
    options = dict(
        page_size=page_size,
        num_pages=num_pages,
        max_prefill_tokens=draw(st.integers(4, 64)),
        output_reserve_ratio=draw(st.sampled_from([0.0, 0.5, 1.0])),
        overlap=draw(st.booleans()),
        max_running_reqs=draw(st.sampled_from([2, 4, 16])),
        schedule_policy=draw(st.sampled_from(["lpm", "fcfs"])),
        mixed_batches=draw(st.booleans()),
    )
    return jobs, options


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(workload=workloads())
def test_tight_pool_never_crashes_and_matches_ample_pool(tiny_dir: Path, workload) -> None:
    jobs, options = workload
    tight = run_workload(tiny_dir, jobs, **options)
    ample = run_workload(
        tiny_dir, jobs, page_size=options["page_size"], num_pages=4096, max_prefill_tokens=4096, overlap=False
    )
    assert tight == ample


def test_last_chunk_and_a_new_prompt_in_one_step_fit_the_pool(tiny_dir: Path) -> None:
    """A prompt's last chunk leaves budget for another prompt in the same step; admission
    counts the pages that chunk is about to take (it used to over-commit: MemoryError)."""
    long_prompt, short_prompt = list(range(1, 21)), [7, 8, 9]
    jobs: list[Job] = [(long_prompt, 1, 1, 0), (short_prompt, 1, 1, 0)]
    options = dict(page_size=1, num_pages=22, max_prefill_tokens=12, overlap=False)
    tight = run_workload(tiny_dir, jobs, **options)
    assert tight == run_workload(tiny_dir, jobs, page_size=1, num_pages=256, max_prefill_tokens=256)
