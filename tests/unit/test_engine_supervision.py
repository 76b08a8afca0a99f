"""The engine backend survives its scheduler process: crashes are restarted, the culprit is
found by running suspects alone, and only the culprit is blamed (tokens checked against
transformers). Faults are injected with the engine setting ``fault`` (worker/engine/faults.py)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.model_fixtures import hf_from_dir, hf_greedy, tiny_hf_model
from tests.waiting import LIVENESS_S, drive_until
from wire.schema import Job, Result, SamplingParams
from worker.frontend.contract import ENGINE_CRASH, GeneratorUnavailable
from worker.frontend.engine_generator import EngineGenerator
from worker.frontend.process import EngineStartError
from worker.scheduler.config import SchedulerProcessConfig

POISON = 77  # the token id the injected faults react to
PROMPTS = {"a": [5, 6, 7, 8], "b": [9, 10], "c": [11, 12, 13], "d": [20, 21, 22, 23, 24]}
GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("supervised-llama")
    tiny_hf_model("llama", spread=0.2, max_position_embeddings=128).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def expected(model_dir: Path) -> dict[str, list[int]]:
    model = hf_from_dir(model_dir)
    return {job_id: hf_greedy(model, prompt, 6) for job_id, prompt in PROMPTS.items()}


def backend_with(model_dir: Path, fault: str) -> EngineGenerator:
    config = SchedulerProcessConfig.from_options(
        str(model_dir), device="cpu", max_running_reqs=4, fault=fault
    )
    return EngineGenerator(config, restart_delays_s=(0.0, 0.1, 0.1))


def collect(backend: EngineGenerator, count: int, timeout_s: float = LIVENESS_S) -> dict[str, Result]:
    results: dict[str, Result] = {}

    def take() -> None:
        for result in backend.poll(0.2):
            assert result.id not in results, f"two results for {result.id}"
            results[result.id] = result

    drive_until(
        lambda: len(results) >= count,
        take,
        lambda: f"{count} results (only {sorted(results)})",
        timeout_s=timeout_s,
    )
    return results


def submit_all(backend: EngineGenerator, poison: bool) -> None:
    """The poison (first, so that it runs beside others) and the innocent jobs."""
    if poison:
        backend.submit(Job(id="poison", input_ids=[3, POISON, 4], sampling=GREEDY))
    for job_id, prompt in PROMPTS.items():
        backend.submit(Job(id=job_id, input_ids=prompt, sampling=GREEDY))


def settle(backend: EngineGenerator, timeout_s: float = LIVENESS_S) -> None:
    """Poll until the backend takes jobs again (a restart after the last crash has finished)."""

    def poll_nothing() -> None:
        assert backend.poll(0.1) == []

    drive_until(
        lambda: backend.free_capacity() > 0, poll_nothing, "the generator to come back", timeout_s=timeout_s
    )


def assert_innocents_right(results: dict[str, Result], expected: dict[str, list[int]]) -> None:
    for job_id, tokens in expected.items():
        assert results[job_id].error is None, results[job_id].error
        assert results[job_id].choices[0].token_ids == tokens


@pytest.mark.parametrize("fault", [f"raise-on-token:{POISON}", f"exit-on-token:{POISON}"])
def test_poison_job_is_found_alone_and_only_it_is_blamed(
    model_dir: Path, expected: dict[str, list[int]], fault: str
) -> None:
    backend = backend_with(model_dir, fault)
    try:
        submit_all(backend, poison=True)
        results = collect(backend, len(PROMPTS) + 1)
        assert_innocents_right(results, expected)
        crash = results["poison"].error
        assert crash is not None and crash.code == ENGINE_CRASH
        assert "injected fault" in crash.message or "exited with code 70" in crash.message
        settle(backend)
        # one crash with everything in it, one with the poison alone; no workload-shape event
        assert (backend.restarts, backend.unattributed_crashes) == (2, 0)
        # Sent again (as the consumer does while attempts remain), it runs alone and crashes again.
        backend.submit(Job(id="poison", input_ids=[3, POISON, 4], sampling=GREEDY))
        backend.submit(Job(id="a", input_ids=PROMPTS["a"], sampling=GREEDY))
        again = collect(backend, 2)
        assert again["poison"].error is not None and again["poison"].error.code == ENGINE_CRASH
        assert again["a"].choices[0].token_ids == expected["a"]
        settle(backend)
        assert backend.restarts == 3
    finally:
        backend.close()


def test_crash_no_single_job_reproduces_blames_nobody(
    model_dir: Path, expected: dict[str, list[int]]
) -> None:
    backend = backend_with(model_dir, "raise-on-batch:3")
    try:
        submit_all(backend, poison=False)
        results = collect(backend, len(PROMPTS))
        assert_innocents_right(results, expected)
        assert (backend.restarts, backend.unattributed_crashes) == (1, 1)
        assert backend.free_capacity() == 8 * backend.slots  # out of isolation once the suspects are settled
    finally:
        backend.close()


def test_scheduler_killed_from_outside_is_restarted_and_loses_nothing(
    model_dir: Path, expected: dict[str, list[int]]
) -> None:
    backend = backend_with(model_dir, "")
    try:
        submit_all(backend, poison=False)
        pid = backend._proc.pid  # type: ignore[union-attr]
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        results = collect(backend, len(PROMPTS))
        assert_innocents_right(results, expected)
        assert backend.restarts == 1 and backend.unattributed_crashes == 1
    finally:
        backend.close()


def test_abort_stops_a_running_job_and_one_waiting_in_the_scheduler(
    model_dir: Path, expected: dict[str, list[int]]
) -> None:
    """Two slots: "long" and "b" run, "c" waits; "c" is aborted at once, "long" once "b" is
    done (50 ms a step leaves "long" more than 100 steps to go): both end ``aborted``, "b" is
    untouched, and the engine takes jobs again."""
    config = SchedulerProcessConfig.from_options(
        str(model_dir), device="cpu", max_running_reqs=2, fault="sleep-per-step:50"
    )
    backend = EngineGenerator(config)
    try:
        long = SamplingParams(max_tokens=120, temperature=0, ignore_eos=True)
        backend.submit(Job(id="long", input_ids=PROMPTS["a"], sampling=long))
        backend.submit(Job(id="b", input_ids=PROMPTS["b"], sampling=GREEDY))
        backend.submit(Job(id="c", input_ids=PROMPTS["c"], sampling=GREEDY))
        backend.abort("c")
        results = collect(backend, 2)
        assert set(results) == {"b", "c"} and results["b"].choices[0].token_ids == expected["b"]
        backend.abort("long")
        backend.abort("long")  # twice: still one answer
        results.update(collect(backend, 1))
        for job_id in ("long", "c"):
            error = results[job_id].error
            assert error is not None and error.code == "aborted", results[job_id]
        backend.abort("b")  # answered already: nothing more comes
        backend.submit(Job(id="a", input_ids=PROMPTS["a"], sampling=GREEDY))
        assert collect(backend, 1)["a"].choices[0].token_ids == expected["a"]
    finally:
        backend.close()


def test_a_job_aborted_while_its_scheduler_dies_is_answered_not_run_again(
    model_dir: Path, expected: dict[str, list[int]]
) -> None:
    backend = backend_with(model_dir, "sleep-per-step:200")  # nothing finishes before the kill
    try:
        submit_all(backend, poison=False)
        pid = backend._proc.pid  # type: ignore[union-attr]
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        backend.abort("a")
        results = collect(backend, len(PROMPTS))
        error = results.pop("a").error
        assert error is not None and error.code == "aborted"
        assert_innocents_right(results, {k: v for k, v in expected.items() if k != "a"})
        assert backend.restarts == 1
    finally:
        backend.close()


def test_a_model_that_cannot_load_is_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(EngineStartError) as info:
        EngineGenerator(SchedulerProcessConfig.from_options(str(missing), device="cpu"))
    message = str(info.value)
    assert "\n" not in message and "no-such-model" in message and "could not start" in message


def test_engine_that_cannot_restart_is_given_up(model_dir: Path, tmp_path: Path) -> None:
    moved = tmp_path / "model"
    moved.symlink_to(model_dir)
    backend = EngineGenerator(
        SchedulerProcessConfig.from_options(str(moved), device="cpu"), restart_delays_s=(0.0, 0.1)
    )
    try:
        moved.unlink()  # the next start cannot find the model
        os.kill(backend._proc.pid, signal.SIGKILL)  # type: ignore[union-attr]
        with pytest.raises(GeneratorUnavailable, match="could not start again"):
            drive_until(lambda: False, lambda: backend.poll(0.2), "the failed restart to be reported")
    finally:
        backend.close()
