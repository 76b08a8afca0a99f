"""A caller that stops stepping the scheduler mid-run (a test that timed out on a loaded
machine) leaves it in a state the next caller can use: the step it had in flight is processed
by the next step, so no page is leaked (issue 21, item 8: five grammar tests then failed with
"private pages: counted 5, running requests hold 0").

The scheduler is slowed (``sleep-per-step``), as on the loaded machine where the first test ran
out of time, and its caller gives up at the moment that leaks: the step in flight holds a
request at its last token, which has already left the running set and frees its pages only
when that step is processed. Oracle: the scheduler's own page count against the pages the
running requests hold, and free + cached + private == the pool (CacheManager.check_integrity).
"""

from __future__ import annotations

import pytest
import torch

from tests.model_fixtures import tiny_hf_model
from wire.schema import SamplingParams
from worker.llm import LLM
from worker.scheduler.messages import GenerateRequest


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> LLM:
    folder = tmp_path_factory.mktemp("tiny")
    tiny_hf_model("llama").save_pretrained(folder)
    return LLM(
        str(folder), device="cpu", attention="torch", page_size=4, num_pages=256, fault="sleep-per-step:20"
    )


def test_a_run_abandoned_with_a_step_in_flight_leaks_no_page(llm: LLM) -> None:
    prompt = torch.randint(1, 250, (9,), generator=torch.Generator().manual_seed(0)).tolist()
    llm.io.put(GenerateRequest("left", prompt, SamplingParams(max_tokens=6, ignore_eos=True)))
    last = llm.scheduler.step(None, block=False)
    while not any(r.remain_len == 0 and not r.finished for r in (last.reqs if last is not None else [])):
        last = llm.scheduler.step(last, block=False)  # NOTE: like the timed-out test's loop
    assert all(r not in llm.scheduler.decode.running for r in last.reqs if r.remain_len == 0)
    del last  # the caller gives up here, its step in flight with it
    results = llm.generate([prompt, prompt[:5]], SamplingParams(max_tokens=4, ignore_eos=True))
    assert [len(r.choices[0].token_ids) for r in results] == [4, 4]
    assert llm.scheduler.idle and llm.scheduler.cache.num_private_pages == 0
    llm.scheduler.check_integrity()
