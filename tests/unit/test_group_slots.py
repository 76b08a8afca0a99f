"""An n > 1 job does not take every running slot while other jobs wait (issue 21: one n=64
job took all 32 slots of a CPU worker, and short jobs waited minutes behind it). Tiny random
Llama on CPU, the real scheduler; the oracle is the scheduler's slot table, read each step."""

from __future__ import annotations

import torch

from tests.model_fixtures import tiny_hf_model
from wire.schema import SamplingParams
from worker.scheduler import InMemoryIO, build_scheduler
from worker.scheduler.config import SchedulerProcessConfig
from worker.scheduler.messages import GenerateRequest, RequestFinished


def test_an_n_job_leaves_half_the_slots_to_jobs_that_wait(tmp_path) -> None:  # type: ignore[no-untyped-def]
    tiny_hf_model("llama").save_pretrained(tmp_path)
    config = SchedulerProcessConfig.from_options(
        str(tmp_path), device="cpu", attention="torch", page_size=4, num_pages=512, max_running_reqs=8
    )
    io = InMemoryIO()
    scheduler = build_scheduler(config, io)
    prompt = torch.randint(1, 250, (9,), generator=torch.Generator().manual_seed(1)).tolist()
    wide = SamplingParams(n=8, max_tokens=60, ignore_eos=True, temperature=1.0, seed=2)
    io.put(GenerateRequest(uid="wide", input_ids=prompt, sampling=wide))
    last = scheduler.step(None, block=False)  # its first choice's prefill: its siblings are due next
    short = SamplingParams(max_tokens=3, ignore_eos=True, temperature=0.0)
    for i in range(6):
        io.put(GenerateRequest(uid=f"short{i}", input_ids=prompt[: 5 + i], sampling=short))
    finished: list[str] = []
    while_waiting: list[int] = []  # the wide job's slots while a short job had none
    afterwards: list[int] = []
    for _ in range(2000):
        last = scheduler.step(last, block=False)
        scheduler.check_integrity(last)
        groups = scheduler.groups
        if "wide" in groups:
            waiting = [uid for uid in groups if uid != "wide" and groups[uid].slots == 0]
            (while_waiting if waiting else afterwards).append(groups["wide"].slots)
        finished += [m.uid for m in io.take_all() if isinstance(m, RequestFinished)]
        if last is None and scheduler.idle:
            break
    assert sorted(finished) == sorted(["wide", *[f"short{i}" for i in range(6)]])
    assert finished[-1] == "wide"  # every short job went through beside it, none waited for its end
    assert max(while_waiting) == 4  # half of the 8 slots while others waited for one...
    assert max(afterwards) == 8  # ...and all of them once nobody did
    assert scheduler.groups == {} and scheduler.tables.num_free_slots == 8
