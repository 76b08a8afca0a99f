"""EngineConfig and SchedulerConfig are validated where they are built and frozen afterwards;
SchedulerProcessConfig carries both across a process boundary unchanged."""

from __future__ import annotations

import dataclasses

import pytest

from worker.engine.config import EngineConfig
from worker.scheduler.config import SchedulerConfig, SchedulerProcessConfig


def test_bad_values_name_the_field() -> None:
    with pytest.raises(ValueError, match="page_size"):
        EngineConfig(model="m", page_size=0)
    with pytest.raises(ValueError, match="cache='lru'"):
        SchedulerConfig(cache="lru")
    with pytest.raises(ValueError, match="schedule_policy='sjf': must be 'lpm' or 'fcfs'"):
        SchedulerConfig(schedule_policy="sjf")
    with pytest.raises(ValueError, match="raise-on-token"):
        SchedulerConfig(fault="raise-on-token:x")
    with pytest.raises(TypeError, match="max_batch"):
        SchedulerProcessConfig.from_options("m", max_batch=4)


def test_frozen_and_auto_device_resolved() -> None:
    config = EngineConfig(model="m")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.page_size = 4  # type: ignore[misc]
    assert config.resolved().device in ("cpu", "cuda")
    assert EngineConfig(model="m", device="cpu").resolved().device == "cpu"


def test_options_go_to_the_table_that_declares_them() -> None:
    run = SchedulerProcessConfig.from_options(
        "m", page_size=4, max_prefill_tokens=64, cache="naive", overlap=False
    )
    assert (run.engine.page_size, run.engine.overlap) == (4, False)
    assert (run.scheduler.max_prefill_tokens, run.scheduler.cache) == (64, "naive")
    assert not {f.name for f in dataclasses.fields(EngineConfig)} & {
        f.name for f in dataclasses.fields(SchedulerConfig)
    }
    changed = run.replace(model="other", max_prefill_tokens=8, device="cpu")
    assert (changed.model, changed.scheduler.max_prefill_tokens, changed.engine.device) == ("other", 8, "cpu")
    assert (changed.engine.page_size, changed.scheduler.cache) == (4, "naive")
    assert SchedulerProcessConfig.from_json(run.to_json()) == run


def test_graphs_reach_max_running_reqs_unless_capped() -> None:
    """An engine raised to 1,024 running requests captures decode graphs up to 1,024 (a larger
    batch than any graph decodes eagerly, host-bound); a set cuda_graph_max_bs caps them, and
    no graph is larger than the largest decode batch."""
    assert EngineConfig(model="m").graph_max_bs == 256
    assert EngineConfig(model="m", max_running_reqs=1024).graph_max_bs == 1024
    assert EngineConfig(model="m", max_running_reqs=1024, cuda_graph_max_bs=512).graph_max_bs == 512
    assert EngineConfig(model="m", max_running_reqs=64, cuda_graph_max_bs=512).graph_max_bs == 64
    with pytest.raises(ValueError, match="cuda_graph_max_bs=0"):
        EngineConfig(model="m", cuda_graph_max_bs=0)
