"""The scheduler loop: readiness and shutdown over SchedulerIO, aborts, and page integrity
checked after every single step under chunking, retraction and n > 1 (outputs vs HF)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from tests.model_fixtures import hf_greedy, tiny_hf_model
from wire.schema import SamplingParams
from worker.scheduler import InMemoryIO, build_scheduler, run_scheduler
from worker.scheduler.config import SchedulerProcessConfig
from worker.scheduler.messages import (
    AbortRequest,
    GenerateRequest,
    RequestFinished,
    SchedulerReady,
    ShutdownRequest,
)

_GEN = torch.Generator().manual_seed(11)
PROMPTS = [torch.randint(1, 250, (n,), generator=_GEN).tolist() for n in (6, 21, 13, 33)]


@pytest.fixture(scope="module")
def hf_and_dir(tmp_path_factory):
    model = tiny_hf_model("llama", spread=0.2)
    path = tmp_path_factory.mktemp("loop-llama")
    model.save_pretrained(path)
    return model, path


def _config(path: Path, **options) -> SchedulerProcessConfig:
    return SchedulerProcessConfig.from_options(str(path), device="cpu", attention="torch", **options)


def test_run_scheduler_ready_results_shutdown(hf_and_dir) -> None:
    model, path = hf_and_dir
    io = InMemoryIO()
    thread = threading.Thread(target=run_scheduler, args=(_config(path, page_size=4), io), daemon=True)
    thread.start()
    sampling = SamplingParams(max_tokens=6, temperature=0.0)
    for i, prompt in enumerate(PROMPTS):
        io.put(GenerateRequest(uid=f"job-{i}", input_ids=prompt, sampling=sampling))
    received: list = []
    while sum(isinstance(m, RequestFinished) for m in received) < len(PROMPTS):
        received.append(io.outbound.get(timeout=120))
    io.put(ShutdownRequest())
    thread.join(timeout=60)
    assert not thread.is_alive(), "run_scheduler did not return after ShutdownRequest"
    assert isinstance(received[0], SchedulerReady) and received[0].page_size == 4
    finished = {m.uid: m for m in received if isinstance(m, RequestFinished)}
    for i, prompt in enumerate(PROMPTS):
        assert finished[f"job-{i}"].choices[0].token_ids == hf_greedy(model, prompt, 6)


@pytest.mark.parametrize("overlap", [True, False])
def test_every_step_keeps_pages_consistent(hf_and_dir, overlap: bool) -> None:
    """free + cached + private == total and no page shared, after every step."""
    model, path = hf_and_dir
    io = InMemoryIO()
    options = dict(
        page_size=2, num_pages=40, max_prefill_tokens=10, output_reserve_ratio=0.0, overlap=overlap
    )
    scheduler = build_scheduler(_config(path, **options), io)
    greedy = SamplingParams(max_tokens=16, temperature=0.0)
    jobs = {
        "a": (PROMPTS[0], greedy),
        "b": (PROMPTS[1], SamplingParams(max_tokens=16, temperature=0.0, n=2)),
        "c": (PROMPTS[2], greedy),
        "d": (PROMPTS[0] + PROMPTS[2], greedy),
        "e": (PROMPTS[3], SamplingParams(max_tokens=9, temperature=0.0)),
    }
    for uid, (prompt, sampling) in jobs.items():
        io.put(GenerateRequest(uid=uid, input_ids=prompt, sampling=sampling))
    last = None
    for _ in range(500):
        last = scheduler.step(last, block=False)
        scheduler.check_integrity(last)
        if last is None and scheduler.idle:
            break
    assert scheduler.idle
    assert scheduler.stats.retractions > 0
    assert scheduler.cache.num_private_pages == 0
    finished = {m.uid: m for m in io.take_all()}
    for uid, (prompt, sampling) in jobs.items():
        expected = hf_greedy(model, prompt, sampling.max_tokens)
        assert [c.token_ids for c in finished[uid].choices] == [expected] * sampling.n


def test_abort_frees_everything(hf_and_dir) -> None:
    _, path = hf_and_dir
    io = InMemoryIO()
    scheduler = build_scheduler(_config(path, page_size=4, max_prefill_tokens=8), io)
    long = SamplingParams(max_tokens=100, temperature=0.0, n=2)
    io.put(GenerateRequest(uid="x", input_ids=PROMPTS[3], sampling=long))
    io.put(
        GenerateRequest(uid="y", input_ids=PROMPTS[1], sampling=SamplingParams(max_tokens=3, temperature=0.0))
    )
    last = None
    for _ in range(8):
        last = scheduler.step(last, block=False)
    io.put(AbortRequest(uid="x"))
    io.put(AbortRequest(uid="never-sent"))
    for _ in range(200):
        last = scheduler.step(last, block=False)
        scheduler.check_integrity(last)
        if last is None and scheduler.idle:
            break
    finished = {m.uid: m for m in io.take_all()}
    assert finished["x"].error_code == "aborted" and finished["x"].choices == []
    assert len(finished["y"].choices[0].token_ids) == 3
    assert scheduler.idle and scheduler.cache.num_private_pages == 0


def test_decode_short_of_pages_drops_a_half_prefilled_prompt(hf_and_dir) -> None:
    """When a decoding request cannot get a page, a chunked prompt's pages go first (its
    computed chunks stay cached) instead of crashing; everything still equals HF."""
    model, path = hf_and_dir
    io = InMemoryIO()
    config = _config(path, page_size=1, num_pages=64, max_prefill_tokens=6, output_reserve_ratio=0.0)
    scheduler = build_scheduler(config, io)
    greedy = SamplingParams(max_tokens=12, temperature=0.0)
    io.put(GenerateRequest(uid="a", input_ids=PROMPTS[0], sampling=greedy))
    last = None
    for _ in range(3):  # a is prefilled and decoding
        last = scheduler.step(last, block=False)
    io.put(GenerateRequest(uid="b", input_ids=PROMPTS[3], sampling=greedy))
    last = scheduler.step(last, block=False)  # b's first chunk
    assert scheduler.prefill.chunked is not None
    allocator = scheduler.cache.allocator
    stolen = allocator.allocate(allocator.num_free_pages)  # the pool runs dry
    last = scheduler.step(last, block=False)  # no chunk fits: decode a, which takes b's pages
    assert scheduler.prefill.chunked is None
    allocator.free(stolen)
    for _ in range(200):
        last = scheduler.step(last, block=False)
        scheduler.check_integrity(last)
        if last is None and scheduler.idle:
            break
    finished = {m.uid: m for m in io.take_all()}
    assert finished["a"].choices[0].token_ids == hf_greedy(model, PROMPTS[0], 12)
    assert finished["b"].choices[0].token_ids == hf_greedy(model, PROMPTS[3], 12)
    assert scheduler.idle and scheduler.cache.num_private_pages == 0
