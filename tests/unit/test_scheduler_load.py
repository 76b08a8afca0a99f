"""The load a scheduler stamps on each RequestFinished (the worker's metrics gauges): requests
held, KV pages in use (private pages of running requests plus the prefix cache's, counted
independently of the allocator), and the step's duration."""

from __future__ import annotations

import time

import torch

from tests.model_fixtures import tiny_hf_model
from wire.schema import SamplingParams
from worker.scheduler import InMemoryIO, build_scheduler
from worker.scheduler.config import SchedulerProcessConfig
from worker.scheduler.messages import GenerateRequest, RequestFinished


def test_finished_messages_carry_the_load_after_their_step(tmp_path) -> None:
    tiny_hf_model("llama").save_pretrained(tmp_path)
    config = SchedulerProcessConfig.from_options(
        str(tmp_path), device="cpu", attention="torch", page_size=2, num_pages=64, overlap=False
    )
    io = InMemoryIO()
    scheduler = build_scheduler(config, io)
    gen = torch.Generator().manual_seed(3)
    for i, (length, max_tokens) in enumerate([(5, 2), (9, 6), (7, 12), (11, 20)]):
        prompt = torch.randint(1, 250, (length,), generator=gen).tolist()
        io.put(GenerateRequest(uid=f"r{i}", input_ids=prompt, sampling=SamplingParams(max_tokens=max_tokens)))
    seen: list[RequestFinished] = []
    for _ in range(200):
        began = time.perf_counter()
        scheduler.step(None, block=False)
        took = time.perf_counter() - began
        sent = [m for m in io.take_all() if isinstance(m, RequestFinished)]
        cached_pages = scheduler.cache.prefix.num_cached_tokens // config.engine.page_size
        for message in sent:
            assert message.running_reqs == len(scheduler.groups)
            assert message.pages_used == scheduler.cache.num_private_pages + cached_pages
            assert 0 < message.step_s <= took
        seen += sent
        if scheduler.idle:
            break
    assert sorted(m.uid for m in seen) == ["r0", "r1", "r2", "r3"]
    assert [m.running_reqs for m in seen] == sorted((m.running_reqs for m in seen), reverse=True)
    assert seen[0].running_reqs > 0 and seen[-1].running_reqs == 0 and seen[-1].pages_used > 0
