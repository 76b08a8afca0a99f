"""Mixed steps: a long prompt being chunked neither stalls a decoding request nor holds up a
short job queued behind it; every output still equals HF greedy."""

from __future__ import annotations

import pytest
import torch

from tests.model_fixtures import hf_greedy, tiny_hf_model
from wire.schema import SamplingParams
from worker.scheduler import InMemoryIO, build_scheduler
from worker.scheduler.config import SchedulerProcessConfig
from worker.scheduler.messages import GenerateRequest, RequestFinished

_GEN = torch.Generator().manual_seed(7)
DECODING, LONG, SHORT = (torch.randint(1, 250, (n,), generator=_GEN).tolist() for n in (6, 120, 5))


@pytest.fixture(scope="module")
def hf_and_dir(tmp_path_factory):
    model = tiny_hf_model("llama", spread=0.2)
    path = tmp_path_factory.mktemp("mixed-llama")
    model.save_pretrained(path)
    return model, path


@pytest.mark.parametrize("overlap", [True, False])
def test_long_prompt_stalls_neither_decoding_nor_short_jobs(hf_and_dir, overlap: bool) -> None:
    model, path = hf_and_dir
    config = SchedulerProcessConfig.from_options(
        str(path), device="cpu", attention="torch", page_size=4, max_prefill_tokens=16, overlap=overlap
    )
    io = InMemoryIO()
    scheduler = build_scheduler(config, io)
    greedy = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    io.put(GenerateRequest(uid="decoding", input_ids=DECODING, sampling=greedy))
    last = scheduler.step(scheduler.step(None, block=False), block=False)
    decoding = scheduler.decode.running[0]
    io.put(
        GenerateRequest(uid="long", input_ids=LONG, sampling=SamplingParams(max_tokens=2, temperature=0.0))
    )
    last = scheduler.step(last, block=False)  # the long prompt's first chunk
    assert scheduler.prefill.chunked is not None
    io.put(
        GenerateRequest(uid="short", input_ids=SHORT, sampling=SamplingParams(max_tokens=1, temperature=0.0))
    )
    finished: dict[str, RequestFinished] = {}
    steps_to_short = None
    for step in range(1, 200):
        before = decoding.device_len
        last = scheduler.step(last, block=False)
        scheduler.check_integrity(last)
        if not decoding.finished and decoding.can_decode:
            assert decoding.device_len == before + 1, "the decoding request skipped a step"
        finished.update({m.uid: m for m in io.take_all() if isinstance(m, RequestFinished)})
        if steps_to_short is None and "short" in finished:
            steps_to_short = step
        if last is None and scheduler.idle:
            break
    assert steps_to_short is not None and steps_to_short <= 3  # not after the ~8 chunks of LONG
    assert "long" in finished and finished["short"].choices[0].token_ids == hf_greedy(model, SHORT, 1)
    assert finished["long"].choices[0].token_ids == hf_greedy(model, LONG, 2)
    assert finished["decoding"].choices[0].token_ids == hf_greedy(model, DECODING, 30)
