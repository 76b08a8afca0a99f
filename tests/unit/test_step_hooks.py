"""The scheduler's step hooks on a tiny CPU model: which calls, in which order, for which
batches; expected sequences are worked out by hand from the requests' max_tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from wire.schema import SamplingParams
from worker.scheduler import InMemoryIO, build_scheduler
from worker.scheduler.config import SchedulerProcessConfig
from worker.scheduler.hooks import HookGroup, StepHooks
from worker.scheduler.messages import GenerateRequest, RequestFinished
from worker.scheduler.profile import StepProfiler

REPO = Path(__file__).resolve().parents[2]
PROMPTS = [[3, 1, 4, 1, 5], [9, 2, 6], [5, 3, 5, 8, 9, 7, 9]]
MAX_TOKENS = [1, 2, 4]
# One prefill of the three prompts makes each request's first token; request 0 stops there,
# request 1 decodes once more, request 2 three times more.
LAUNCHED = [(True, 3), (False, 2), (False, 1), (False, 1)]  # (is_prefill, batch size) per step


@pytest.fixture(scope="module")
def model_json(tmp_path_factory) -> Path:
    config = json.loads((REPO / "configs" / "qwen3-0.6b.json").read_text())
    config.update(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4)
    config.update(num_key_value_heads=2, head_dim=8, vocab_size=64, max_position_embeddings=64)
    path = tmp_path_factory.mktemp("hooks") / "tiny-qwen3.json"
    path.write_text(json.dumps(config))
    return path


def _scheduler(model_json: Path, overlap: bool):
    config = SchedulerProcessConfig.from_options(
        str(model_json),
        load_format="dummy",
        device="cpu",
        attention="torch",
        page_size=4,
        overlap=overlap,
    )
    io = InMemoryIO()
    for i, (prompt, n) in enumerate(zip(PROMPTS, MAX_TOKENS, strict=True)):
        sampling = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        io.put(GenerateRequest(uid=f"r{i}", input_ids=prompt, sampling=sampling))
    return build_scheduler(config, io), io


class Recorder(StepHooks):
    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.steps: list = []  # each launched Step, in launch order

    def launch_started(self) -> None:
        self.calls.append(("launch_started",))

    def forward_started(self, fi) -> None:
        self.calls.append(("forward_started", fi.batch_size))

    def forward_finished(self, fi, output) -> None:
        self.calls.append(("forward_finished", fi.batch_size, len(output.next_tokens_cpu)))

    def launch_finished(self, step) -> None:
        self.steps.append(step)
        self.calls.append(("launch_finished", step.is_prefill, len(step.reqs)))

    def process_started(self, step) -> None:
        self.calls.append(("process_started", self.steps.index(step)))

    def tokens_arrived(self, step) -> None:
        self.calls.append(("tokens_arrived", self.steps.index(step)))

    def process_finished(self, step) -> None:
        self.calls.append(("process_finished", self.steps.index(step)))


def _launch(is_prefill: bool, batch_size: int) -> list[tuple]:
    return [
        ("launch_started",),
        ("forward_started", batch_size),
        ("forward_finished", batch_size, batch_size),
        ("launch_finished", is_prefill, batch_size),
    ]


def _process(index: int) -> list[tuple]:
    return [("process_started", index), ("tokens_arrived", index), ("process_finished", index)]


@pytest.mark.parametrize("overlap", [False, True])
def test_hooks_see_each_launch_and_process_in_order(model_json: Path, overlap: bool) -> None:
    scheduler, io = _scheduler(model_json, overlap)
    recorder = Recorder()
    scheduler.hooks = recorder
    scheduler.run_until_idle()
    expected: list[tuple] = []
    for index, (is_prefill, batch_size) in enumerate(LAUNCHED):
        expected += _launch(is_prefill, batch_size)
        if not overlap:
            expected += _process(index)
        elif index > 0:
            expected += _process(index - 1)  # step N - 1 is processed while step N runs
    if overlap:
        expected += [("launch_started",)] + _process(len(LAUNCHED) - 1)  # nothing left to launch
    assert recorder.calls == expected
    finished = [m for m in io.take_all() if isinstance(m, RequestFinished)]
    assert sorted(len(m.choices[0].token_ids) for m in finished) == sorted(MAX_TOKENS)


def test_without_hooks_the_scheduler_runs_the_same_steps(model_json: Path) -> None:
    hooked, _ = _scheduler(model_json, overlap=True)
    hooked.hooks = Recorder()
    hooked.run_until_idle()
    plain, _ = _scheduler(model_json, overlap=True)
    assert plain.hooks is None
    plain.run_until_idle()
    assert plain.stats == hooked.stats


def test_step_profiler_records_every_step_through_the_hooks(model_json: Path) -> None:
    scheduler, _ = _scheduler(model_json, overlap=True)
    profiler = StepProfiler.install(scheduler)
    assert scheduler.hooks is profiler
    scheduler.run_until_idle()
    assert [(r.is_prefill, r.batch_size) for r in profiler.records] == LAUNCHED
    assert all(r.launch_s > 0 and r.process_s > 0 and r.wait_s >= 0 for r in profiler.records)
    assert all(r.events is None for r in profiler.records)  # no CUDA events on CPU
    summary = profiler.summary()
    assert summary["steps"] == 4 and summary["prefill"]["steps"] == 1 and summary["decode"]["steps"] == 3
    assert summary["decode"]["launch_ms"]["sum"] > 0 and summary["decode"]["gpu_ms"] == {}
    # the decode steps at the largest batch (2 requests): the first decode step only
    assert (summary["decode_full"]["steps"], summary["decode_full"]["batch_size"]) == (1, 2)


def test_a_hook_group_gives_each_observer_every_call(model_json: Path) -> None:
    """Two recorders in one group see what one recorder alone sees, call for call."""
    alone, _ = _scheduler(model_json, overlap=True)
    alone.hooks = solo = Recorder()
    alone.run_until_idle()
    grouped, _ = _scheduler(model_json, overlap=True)
    first, second = Recorder(), Recorder()
    grouped.hooks = HookGroup(first, second)
    grouped.run_until_idle()
    assert first.calls == second.calls == solo.calls


class _Event:
    """What summary() reads of a CUDA event: milliseconds to another one."""

    def __init__(self, ms: float) -> None:
        self.ms = ms

    def elapsed_time(self, other: _Event) -> float:
        return other.ms - self.ms


def test_step_profiler_counts_prefill_tokens_and_their_gpu_time(model_json: Path) -> None:
    """The prefill step computed the three prompts (15 tokens); with its pass timed (here by
    stand-in events: 30 ms) the summary gives 30 ms over 15 tokens, i.e. 16,384 ms per 8,192."""
    scheduler, _ = _scheduler(model_json, overlap=True)
    profiler = StepProfiler.install(scheduler)
    scheduler.run_until_idle()
    assert [r.num_tokens for r in profiler.records] == [sum(map(len, PROMPTS)), 2, 1, 1]
    start = 0.0
    for record, gpu_ms in zip(profiler.records, [30.0, 4.0, 2.0, 2.0], strict=True):
        record.events = (_Event(start), _Event(start + gpu_ms))
        start += gpu_ms + 1.0  # 1 ms between passes
    summary = profiler.summary()
    assert summary["prefill"]["tokens"] == 15
    assert summary["prefill"]["gpu_ms_per_8192_tokens"] == pytest.approx(30.0 / 15 * 8192)
    assert summary["decode_full"]["gpu_ms"]["p50"] == pytest.approx(4.0)
    assert summary["gpu_busy_share"] == pytest.approx(38.0 / 41.0)


def test_stats_count_the_decode_steps_no_graph_held(model_json: Path) -> None:
    """A CPU engine captures no graphs: each decode step of LAUNCHED ran eagerly, counted by its
    batch size (the benchmarks print these to show batches larger than every graph)."""
    scheduler, _ = _scheduler(model_json, overlap=True)
    assert scheduler.engine.graph_runner is None
    scheduler.run_until_idle()
    assert scheduler.stats.decode_steps == 3
    assert scheduler.stats.eager_decode_batches == {2: 1, 1: 2}
    assert scheduler.stats.eager_summary() == "eager decode steps: 3 of 3 (batch sizes 1-2)"
