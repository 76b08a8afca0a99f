"""EngineConfig is validated where it is built and frozen afterwards."""

from __future__ import annotations

import dataclasses

import pytest

from worker.engine.config import EngineConfig


def test_bad_values_name_the_field() -> None:
    with pytest.raises(ValueError, match="page_size"):
        EngineConfig(model="m", page_size=0)
    with pytest.raises(ValueError, match="cache"):
        EngineConfig(model="m", cache="lru")
    with pytest.raises(TypeError, match="max_batch"):
        EngineConfig.from_options("m", max_batch=4)


def test_frozen_and_auto_device_resolved() -> None:
    config = EngineConfig(model="m")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.page_size = 4  # type: ignore[misc]
    assert config.resolved().device in ("cpu", "cuda")
    assert EngineConfig(model="m", device="cpu").resolved().device == "cpu"
