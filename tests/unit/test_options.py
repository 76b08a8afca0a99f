"""Settings are declared once (worker.options) and everything else is generated from the
declaration: every field of the three tables is a setting or is set from another one, every
setting has a flag on `radixq worker` with its help, and a value reaches the same setting from
a TOML file, from its environment variable and from its flag."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import pytest
import typer

from radixq.cli import build_app
from worker.cli import worker_args, worker_flags
from worker.config import ConfigError, Setting, load_worker_config, settings
from worker.options import spec_of

SET_ELSEWHERE = {"queue.queue", "queue.name"}  # ConsumerConfig's, from [worker] queue and name


def worker_command() -> Any:
    return typer.main.get_command(build_app()).commands["worker"]  # type: ignore[attr-defined]


def test_every_field_of_a_table_is_a_declared_setting() -> None:
    from worker.config import _TABLES

    for table, owners in _TABLES.items():
        for f in (f for cls in owners for f in dataclasses.fields(cls)):
            if f"{table}.{f.name}" not in SET_ELSEWHERE:
                assert spec_of(f) is not None, f"[{table}] {f.name} is not declared with worker.options.option"
                assert spec_of(f).help, f"[{table}] {f.name} has no help"  # type: ignore[union-attr]


def test_no_key_is_declared_by_two_dataclasses_of_one_table() -> None:
    from worker.config import _TABLES

    for table, owners in _TABLES.items():
        names = [f.name for cls in owners for f in dataclasses.fields(cls)]
        assert len(names) == len(set(names)), f"[{table}] declares a key twice: {sorted(names)}"


def test_every_flag_of_the_worker_command_is_a_setting_and_every_setting_a_flag() -> None:
    params = {p.name: p for p in worker_command().params}
    keys = {s.key for s in settings()}
    assert set(params) - keys == {"config", "backend", "gpus"}  # the file, --generator's older name, CUDA_VISIBLE_DEVICES
    assert keys <= set(params)
    for s in settings():
        option = params[s.key]
        assert option.help.startswith(s.spec.help.replace("[", "\\[")), s.dotted
        assert s.flags[0].split("/")[0] in option.opts, (s.dotted, option.opts)


def test_the_help_of_a_setting_with_choices_names_each_choice() -> None:
    for s in settings():
        for choice in s.spec.choices:
            assert f"`{choice}`" in s.spec.help, (s.dotted, choice)


def sample(s: Setting) -> Any:
    """A valid value of ``s`` other than its default."""
    if s.spec.choices:
        return next(c for c in reversed(s.spec.choices) if c != s.default)
    if s.type is bool:
        return not s.default
    if s.key == "redis_url":
        return "redis://example.invalid:6380/1"
    if s.key == "fault":
        return "sleep-per-step:1"
    if s.key == "served_model_names":
        return "a,b"
    if isinstance(s.default, str):
        return "given"
    if isinstance(s.default, float):
        return s.default / 2 or 0.5
    return (s.default or 8) + 1 if s.key != "metrics_port" else 9100


def text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def toml_value(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else text(value)


def flag_args(s: Setting, value: Any) -> list[str]:
    declared = s.flags[0]
    if s.type is bool:
        on, _, off = declared.partition("/")
        return [on if value else (off or f"--no-{on.removeprefix('--')}")]
    if s.spec.repeat:
        return [arg for name in value.split(",") for arg in (declared, name)]
    return [declared, text(value)]


def value_of(config: Any, s: Setting) -> Any:
    (part,) = [p for p in (config.worker, config.queue, config.engine, config.scheduler) if isinstance(p, s.owner)]
    return getattr(part, s.key)


@pytest.mark.parametrize("s", settings(), ids=lambda s: s.dotted)
def test_a_value_reaches_its_setting_from_the_file_the_environment_and_the_flag(
    s: Setting, tmp_path: Path
) -> None:
    value = sample(s)
    path = tmp_path / "w.toml"
    path.write_text(f"[{s.table}]\n{s.key} = {toml_value(value)}\n")
    ctx = worker_command().make_context("worker", flag_args(s, value))
    try:
        from_file = load_worker_config(path, {}, {})
        from_env = load_worker_config(None, {s.env[0]: text(value)}, {})
        from_flag = load_worker_config(None, {}, worker_flags(ctx.params))
    except ConfigError as exc:  # pragma: no cover - a sample the test picked badly
        pytest.fail(f"{s.dotted}={value!r}: {exc}")
    assert value_of(from_file, s) == value_of(from_env, s) == value_of(from_flag, s) == value
    assert s.dotted in from_file.given and s.dotted in from_env.given and s.dotted in from_flag.given


def test_a_value_outside_the_owners_choices_is_refused_naming_them() -> None:
    with pytest.raises(ConfigError, match=r"\[engine\] cache .*must be 'radix' or 'naive'"):
        load_worker_config(None, {"RADIXQ_CACHE": "random"}, {})


def test_the_name_lists_import_no_torch() -> None:
    import subprocess

    code = (
        "import sys, worker.config, worker.attention.names, worker.kvcache.names, worker.models.names, "
        "worker.scheduler.names; assert 'torch' not in sys.modules, 'torch loaded'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])


@pytest.mark.parametrize("s", settings(), ids=lambda s: s.dotted)
def test_the_worker_arguments_run_builds_parse_back_to_the_same_setting(s: Setting) -> None:
    """run forwards its worker flags through worker_args: what a worker parses is what was given."""
    value = sample(s)
    given = {s.key: value.split(",") if s.spec.repeat else value}
    ctx = worker_command().make_context("worker", worker_args(given))
    assert worker_flags(ctx.params)[s.dotted] == value
    assert load_worker_config(None, {}, worker_flags(ctx.params)).given == {s.dotted}
