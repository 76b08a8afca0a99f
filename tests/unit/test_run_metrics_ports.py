"""`run --workers N --metrics-port BASE`: worker i is started with --metrics-port BASE+i, and
with no --metrics-port no worker serves metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from producer import runner
from producer.runner import RunOptions


def started_commands(monkeypatch: pytest.MonkeyPatch, **options: Any) -> list[list[str]]:
    seen: list[list[str]] = []
    monkeypatch.setattr(runner, "start_child", lambda args, **_: seen.append(args))
    runner._start_workers(RunOptions(Path("in"), Path("out"), ["radixq", "worker"], **options), "redis://x", private=True)
    return seen


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def test_each_worker_gets_its_own_port_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = started_commands(monkeypatch, num_workers=3, metrics_port=9400)
    assert [flag(args, "--metrics-port") for args in asked] == ["9400", "9401", "9402"]
    plain = started_commands(monkeypatch, num_workers=2)
    assert [flag(args, "--metrics-port") for args in plain] == [None, None]


def test_the_environment_port_is_not_passed_on_to_every_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RADIXQ_METRICS_PORT", "9400")
    assert "RADIXQ_METRICS_PORT" not in runner.worker_env("redis://x")
