"""Jobs with several prompts (an OpenAI completions ``prompt`` list): one sub-job per prompt on
the wrapped generator, one Result numbered as OpenAI numbers it. The oracle is the fake
generator's deterministic text, recomputed here from each sub-job's id."""

from __future__ import annotations

import json

from openai.types import Completion

from producer.jsonl import parse_line
from producer.output_lines import output_record
from tests.fake_generator import FakeGenerator, fake_text
from tests.unit.queue_worlds import MemoryWorld, config_for, step_until
from tests.waiting import drive_until
from wire.schema import Job, Result, SamplingParams, error_result
from worker.frontend.contract import ENGINE_CRASH
from worker.frontend.prompts import PromptLists, sub_job_id
from worker.queue.consumer import Consumer
from worker.queue.held import envelope


class _Scripted(FakeGenerator):
    """Fails the prompt "bad" with invalid_job, and crashes on "crash" the first time."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity=capacity)
        self.crashed = False

    def complete(self, job: Job) -> Result:
        if job.prompt == "bad":
            return error_result(job.id, "invalid_job", "too long")
        if job.prompt == "crash" and not self.crashed:
            self.crashed = True
            return error_result(job.id, ENGINE_CRASH, "segfault")
        return super().complete(job)


def _poll_until(generator: PromptLists, count: int) -> list[Result]:
    results: list[Result] = []
    drive_until(
        lambda: len(results) >= count, lambda: results.extend(generator.poll(0.01)), f"{count} results"
    )
    return results


def test_choices_are_numbered_prompt_by_prompt_as_openai_does() -> None:
    inner = FakeGenerator(capacity=2)  # fewer slots than prompts: sub-jobs wait for room
    generator = PromptLists(inner)
    job = Job(id="multi", prompts=["a b", "c", "d e f"], sampling=SamplingParams(n=2, max_tokens=3))
    plain = Job(id="plain", prompt="x")
    generator.submit(job)
    assert generator.free_capacity() == 0 and inner.max_held <= 2
    results = {r.id: r for r in _poll_until(generator, 1)}
    generator.submit(plain)
    results |= {r.id: r for r in _poll_until(generator, 1)}
    merged = results["multi"]
    assert merged.ok and [c.index for c in merged.choices] == list(range(6))
    for prompt_index in range(3):
        for c in range(2):
            choice = merged.choices[prompt_index * 2 + c]
            assert choice.text == fake_text(sub_job_id("multi", prompt_index), c)
    assert merged.usage.prompt_tokens == 2 + 1 + 3 and merged.usage.completion_tokens == 3 * 2 * 3
    assert results["plain"].choices[0].text == fake_text("plain", 0)
    assert inner.max_held <= 2


def test_a_failed_prompt_fails_the_job_naming_it() -> None:
    generator = PromptLists(_Scripted(capacity=8))
    generator.submit(Job(id="j", prompts=["ok", "bad"], metadata={"row": 1}))
    (result,) = _poll_until(generator, 1)
    assert result.id == "j" and result.error is not None and result.error.code == "invalid_job"
    assert result.error.message.startswith("prompt 1 of 2:")  # its metadata: the consumer's envelope


def test_a_crash_is_the_jobs_and_a_second_run_completes_it() -> None:
    world = MemoryWorld()
    world.enqueue([Job(id="j", prompts=["ok", "crash"])])
    config = config_for("c1")
    consumer = Consumer(world.store.queue("c1", config.min_idle_s), PromptLists(_Scripted(4)), config)
    step_until([consumer], 1, world)
    (result,) = world.results_by_id()["j"]
    assert result.ok and [c.text for c in result.choices] == [fake_text(sub_job_id("j", i)) for i in range(2)]


def test_openai_completions_prompt_list_is_one_line_with_every_choice() -> None:
    """An OpenAI completions line with several prompts is one job and one response line,
    valid for the openai package's Completion type."""
    body = {"model": "m", "prompt": ["one", "two"], "n": 2, "max_tokens": 2}
    line = json.dumps({"custom_id": "c", "method": "POST", "url": "/v1/completions", "body": body})
    job = parse_line(line, 1)
    assert job.prompts == ["one", "two"]
    generator = PromptLists(FakeGenerator())
    generator.submit(job)
    (result,) = _poll_until(generator, 1)
    out = output_record(envelope(result, job, 0, "w", generator.model_name))  # as the consumer writes it
    parsed = Completion.model_validate(out["response"]["body"], strict=True)
    assert [c.index for c in parsed.choices] == [0, 1, 2, 3]
    assert parsed.choices[2].text == fake_text(sub_job_id("c", 1), 0)
