"""EngineGenerator: jobs through a real scheduler process over ZMQ, checked against transformers."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.model_fixtures import hf_from_dir, hf_greedy, tiny_hf_model
from tests.waiting import LIVENESS_S, drive_until
from wire.schema import Job, SamplingParams
from worker.frontend.engine_generator import EngineGenerator
from worker.metrics import WorkerMetrics
from worker.scheduler.config import SchedulerProcessConfig


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama saved with weights and no tokenizer."""
    path = tmp_path_factory.mktemp("frontend-llama")
    tiny_hf_model("llama", max_position_embeddings=128).save_pretrained(path)
    return path


def _poll_all(backend, count: int, timeout_s: float = LIVENESS_S) -> dict:
    results: dict = {}
    drive_until(
        lambda: len(results) >= count,
        lambda: results.update({result.id: result for result in backend.poll(0.5)}),
        lambda: f"{count} results (only {sorted(results)})",
        timeout_s=timeout_s,
    )
    return results


def test_jobs_round_trip_and_bad_ones_fail_alone(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import worker.frontend.engine_generator as generator_module

    def build_result(job_id, *args, **kwargs):  # type: ignore[no-untyped-def]
        if job_id == "unbuildable":
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "a detokenizer surprise")
        return real_build_result(job_id, *args, **kwargs)

    real_build_result = generator_module.build_result
    monkeypatch.setattr(generator_module, "build_result", build_result)
    backend = EngineGenerator(
        SchedulerProcessConfig.from_options(str(model_dir), device="cpu", max_running_reqs=4)
    )
    try:
        assert backend.slots == 4  # the consumer's default read window
        assert backend.free_capacity() == 8 * 4
        greedy = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
        backend.submit(Job(id="a", input_ids=[5, 6, 7, 8], sampling=greedy, metadata={"row": 1}))
        backend.submit(Job(id="text", prompt="no tokenizer here", sampling=greedy))
        backend.submit(Job(id="long", input_ids=[3] * 200, sampling=greedy))
        backend.submit(Job(id="b", input_ids=[9, 10], sampling=greedy))
        backend.submit(Job(id="unbuildable", input_ids=[11, 12], sampling=greedy))
        results = _poll_all(backend, 5)
        assert set(results) == {"a", "text", "long", "b", "unbuildable"}
        unbuildable = results["unbuildable"].error
        assert unbuildable is not None and unbuildable.code == "internal"
        assert "could not be built: UnicodeDecodeError" in unbuildable.message
        assert results["a"].choices[0].token_ids == hf_greedy(hf_from_dir(model_dir), [5, 6, 7, 8], 6)
        assert results["b"].choices[0].token_ids == hf_greedy(hf_from_dir(model_dir), [9, 10], 6)
        # the envelope (metadata, worker, timings but the first token) is the consumer's alone
        assert results["a"].metadata == {} and results["a"].worker == ""
        assert results["a"].timings.first_token_at_ms > 0 and results["a"].timings.started_at_ms == 0
        assert results["a"].usage.prompt_tokens == 4 and results["a"].usage.completion_tokens == 6
        assert results["text"].error is not None and results["text"].error.code == "invalid_job"
        assert "no tokenizer" in results["text"].error.message
        assert results["long"].error is not None and results["long"].error.code == "prompt_too_long"
        assert "'long'" in results["long"].error.message
        assert backend.free_capacity() == 8 * 4
        # The engine's load (worker.metrics' gauges): as of its last result, nothing held.
        load = backend.load
        assert load.running_reqs == 0 and 0 <= load.pages_used <= load.num_pages and load.step_s > 0
        metrics = WorkerMetrics("q", backend.model_name)
        metrics.gauges(lambda: 0, backend)
        gauges = {
            s.name: s.value
            for f in text_string_to_metric_families(generate_latest(metrics.registry).decode())
            for s in f.samples
        }
        assert gauges["radixq_kv_pool_pages"] == load.num_pages > 0
        assert gauges["radixq_kv_pages_used"] == load.pages_used
        assert gauges["radixq_step_seconds"] == load.step_s
    finally:
        backend.close()


def test_unknown_engine_option_is_named() -> None:
    with pytest.raises(TypeError, match="pagesize"):
        SchedulerProcessConfig.from_options("x", pagesize=4)
