"""One worker configuration, built once at the edge and frozen.

A worker's settings live in three tables - ``[worker]`` (who it is and where its queue is),
``[queue]`` (how it consumes: worker.queue.config.ConsumerConfig) and ``[engine]``
(the engine's worker.engine.config.EngineConfig and its scheduler's
worker.scheduler.config.SchedulerConfig, one table to the user) - and come from, in rising order of precedence:

    defaults  <  the TOML file (--config)  <  RADIXQ_<KEY> environment variables  <  flags

A CPU worker gets CPU-sized engine limits (``CPU_DEFAULTS``) for the settings nobody gave:
``load_worker_config`` applies them when the device is ``cpu``, and ``for_device`` once an
``auto`` device is resolved to cpu (the worker does that before it starts the engine).

Each setting is declared once, as a field of its table's dataclass (worker.options: type,
default, choices, check, help). Every setting has the environment variable ``RADIXQ_`` + its
key in capitals (a few also answer to another name, declared with the field); this module is
the only place that reads them. ``settings_table()`` renders the table of every setting in
docs/configuration.md, and worker.cli the flags of ``radixq worker``, from the same declarations.
"""

from __future__ import annotations

import dataclasses
import sys
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from wire.keys import DEFAULT_QUEUE, DEFAULT_REDIS_URL, ENV_PREFIX, REDIS_URL_ENVS
from worker.engine.config import EngineConfig
from worker.options import Spec, at_least, check_options, option, spec_of, within
from worker.queue.config import ConsumerConfig, default_worker_name
from worker.scheduler.config import SchedulerConfig, SchedulerProcessConfig


class ConfigError(ValueError):
    """A setting that cannot be used: which one, from where, and why (one line)."""


@dataclass(frozen=True)
class WorkerSection:
    """The ``[worker]`` table."""

    queue: str = option(DEFAULT_QUEUE, "queue to consume", flags=("--queue", "-q"))
    redis_url: str = option(DEFAULT_REDIS_URL, "Redis to use (`rediss://` for TLS)", env=REDIS_URL_ENVS[1:])
    name: str = option("", "consumer name (default: hostname-pid)")
    generator: str = option(
        "engine", "`engine`, or a `module:callable` generator factory", deprecated_env=("RADIXQ_BACKEND",)
    )
    log_level: str = option(
        "INFO", "DEBUG, INFO, WARNING, ERROR (DEBUG also shows model loading's progress bars)"
    )
    served_model_names: str = option(
        "",
        "model names this worker answers to, comma-separated; a job naming another gets a `model_not_served` "
        "error (empty: any name runs on the worker's model)",
        flags=("--served-model-name",),
        repeat=True,
    )
    metrics_port: int = option(
        0,
        "serve Prometheus `/metrics` on this port (0: off)",
        check=within(0, 65535, note="a port, or 0 for none"),
    )
    connect_timeout_s: float = option(
        30.0,
        "at start-up, how long to wait for Redis to answer before exiting with code 2 (before the model "
        "loads; once reached, later outages are waited out)",
        check=at_least(0),
    )

    def __post_init__(self) -> None:
        check_options(self)
        from wire.redis_errors import check_url

        try:
            check_url(self.redis_url)
        except ValueError as exc:
            raise ValueError(f"redis_url={exc}") from None

    @property
    def served_models(self) -> tuple[str, ...]:
        return tuple(name.strip() for name in self.served_model_names.split(",") if name.strip())


# Limits for a CPU worker where file, environment and flags say nothing: it holds two jobs
# per running slot (queue.read_window 0), so a GPU-sized max_running_reqs (256) would
# take a whole queue while sibling workers idle. Measured: benchmarks/cpu_slots.py
# (docs/performance.md, an idle 2-core box): 32 gives 1.7x the output tok/s of 8 (the values of
# configs/smollm2-cpu.toml); its 64 held jobs are also capped by a fair share of the queue.
CPU_DEFAULTS: dict[str, Any] = {"engine.max_running_reqs": 32, "engine.max_prefill_tokens": 2048}


@dataclass(frozen=True)
class WorkerConfig:
    worker: WorkerSection
    queue: ConsumerConfig
    engine: EngineConfig
    scheduler: SchedulerConfig = SchedulerConfig()  # read from the [engine] table too
    given: frozenset[str] = frozenset()  # dotted settings set by the file, environment or flags

    @property
    def process_config(self) -> SchedulerProcessConfig:
        """What the worker's scheduler process runs with."""
        return SchedulerProcessConfig(self.engine, self.scheduler)

    def for_device(self, device: str) -> WorkerConfig:
        """A copy for ``device`` (cpu or cuda): engine.device set, and on cpu the CPU_DEFAULTS
        of every setting that was not given."""
        chosen = {"device": device}
        if device == "cpu":
            chosen |= {d.partition(".")[2]: v for d, v in CPU_DEFAULTS.items() if d not in self.given}
        run = self.process_config.replace(**chosen)
        return dataclasses.replace(self, engine=run.engine, scheduler=run.scheduler)


# Each table and the dataclasses it is read into (a key belongs to the one that declares it).
_TABLES: dict[str, tuple[type, ...]] = {
    "worker": (WorkerSection,),
    "queue": (ConsumerConfig,),
    "engine": (EngineConfig, SchedulerConfig),
}


@dataclass(frozen=True)
class Setting:
    """One setting of a table, as its owner's dataclass field declares it (worker.options)."""

    table: str
    key: str
    default: Any
    type: Any  # the field's annotation, evaluated
    spec: Spec
    owner: type  # the dataclass that declares it

    @property
    def dotted(self) -> str:
        return f"{self.table}.{self.key}"

    @property
    def env(self) -> tuple[str, ...]:
        """The environment variables it is read from, the first found winning."""
        return (f"{ENV_PREFIX}{self.key.upper()}", *self.spec.env, *self.spec.deprecated_env)

    @property
    def flags(self) -> tuple[str, ...]:
        """Its flag declarations on ``radixq worker``."""
        return self.spec.flags or (f"--{self.key.replace('_', '-')}",)

    @property
    def shown_default(self) -> str:
        """Its default as the settings table and ``--help`` show it ("" when there is none)."""
        if self.spec.shown_default is not None:
            return self.spec.shown_default
        if self.default is None:
            return ""
        return str(self.default).lower() if isinstance(self.default, bool) else str(self.default)

    @property
    def flag(self) -> str:
        """The flag an error names: its first declaration (``--trim-jobs`` of ``--trim-jobs/--keep-jobs``)."""
        return self.flags[0].split("/")[0]


def settings() -> list[Setting]:
    """Every setting, table by table, in the order of its dataclass."""
    found = []
    for table, owners in _TABLES.items():
        for cls in owners:
            hints = typing.get_type_hints(cls)
            for f in dataclasses.fields(cls):
                spec = spec_of(f)
                if spec is not None:
                    found.append(Setting(table, f.name, f.default, hints[f.name], spec, cls))
    return found


def deprecation_warnings(environ: Mapping[str, str]) -> list[str]:
    """A line for each older environment variable set in ``environ`` (it still works)."""
    lines = []
    for s in settings():
        for name in s.spec.deprecated_env:
            if environ.get(name, "") != "":
                lines.append(
                    f"warning: {name} is deprecated: use {ENV_PREFIX}{s.key.upper()} ({s.spec.help})"
                )
    return lines


def read_toml(path: str | Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {str(path)!r} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid TOML: {exc}") from None


def load_worker_config(
    path: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
) -> WorkerConfig:
    """The worker's configuration from the TOML file at ``path``, the environment and ``flags``
    (dotted keys such as ``"queue.min_idle_s"``; None values mean "not given")."""
    environ = environ if environ is not None else {}
    known = {s.dotted: s for s in settings()}
    values: dict[str, tuple[Any, str]] = {}  # dotted -> (value, where it came from)
    if path is not None:
        for table, body in read_toml(path).items():
            if table not in _TABLES or not isinstance(body, dict):
                raise ConfigError(
                    f"config file {str(path)!r}: unknown table [{table}] (tables: {', '.join(_TABLES)})"
                )
            for key, value in body.items():
                if f"{table}.{key}" not in known:
                    allowed = ", ".join(sorted(s.key for s in known.values() if s.table == table))
                    raise ConfigError(
                        f"config file {str(path)!r}: [{table}] has no setting {key!r} (settings: {allowed})"
                    )
                values[f"{table}.{key}"] = (value, f"[{table}] {key} in {path}")
    for setting in known.values():
        for name in reversed(setting.env):  # the first name wins
            if environ.get(name, "") != "":
                values[setting.dotted] = (environ[name], f"environment variable {name}")
    for dotted, value in (flags or {}).items():
        if value is not None:
            if dotted not in known:
                raise ConfigError(f"unknown setting {dotted!r}")
            values[dotted] = (value, known[dotted].flag)
    owned: dict[type, dict[str, Any]] = {cls: {} for owners in _TABLES.values() for cls in owners}
    for dotted, (value, _) in values.items():
        owned[known[dotted].owner][known[dotted].key] = value
    section = _build(WorkerSection, owned[WorkerSection], "worker", values)
    queue = _build(
        ConsumerConfig,
        {**owned[ConsumerConfig], "queue": section.queue, "name": section.name or default_worker_name()},
        "queue",
        values,
    )
    engine = _build(EngineConfig, owned[EngineConfig], "engine", values)
    scheduler = _build(SchedulerConfig, owned[SchedulerConfig], "engine", values)
    config = WorkerConfig(section, queue, engine, scheduler, frozenset(values))
    return config.for_device("cpu") if engine.device == "cpu" else config


def _build(cls: type, given: dict[str, Any], table: str, values: dict[str, tuple[Any, str]]) -> Any:
    """``cls`` from ``given``; a ConfigError naming the setting, where its value came from, and why."""
    try:
        return msgspec.convert(given, cls, strict=False)
    except msgspec.ValidationError as exc:
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, ValueError):  # a check in __post_init__: "field=value: reason"
            key, why = str(cause).partition("=")[0], str(cause)
        else:  # a type: "Expected `int`, got `str` - at `$.field`"
            reason, _, where = str(exc).rpartition(" - at `$.")
            key = where.rstrip("`").split(".")[0].split("[")[0]
            why = f"{key}={given.get(key)!r}: {reason.lower()}"
        source = values.get(f"{table}.{key}", (None, "its default"))[1]
        raise ConfigError(f"setting [{table}] {key} (from {source}): {why}") from None


def settings_table() -> str:
    """The table of every setting (markdown), as docs/configuration.md holds it."""
    rows = ["| setting | environment | default | meaning |", "| --- | --- | --- | --- |"]
    for s in settings():
        default = s.shown_default
        env = ", ".join(
            f"`{name}`" + (" (deprecated)" if name in s.spec.deprecated_env else "") for name in s.env
        )
        rows.append(f"| `[{s.table}] {s.key}` | {env} | `{default}` | {s.spec.help} |")
    return "\n".join(rows)


SETTINGS_PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def write_settings_table(path: str | Path = SETTINGS_PAGE) -> bool:
    """Replace the table of settings in the page at ``path`` (docs/configuration.md) by
    ``settings_table()``; True when that changed the file."""
    text = Path(path).read_text()
    start = text.index(settings_table().splitlines()[0])
    end = text.find("\n\n", start)
    end = len(text) if end < 0 else end
    new = text[:start] + settings_table() + text[end:]
    Path(path).write_text(new)
    return new != text


# python -m worker.config [docs/configuration.md]: print the table, or rewrite it in that page
if __name__ == "__main__":
    if len(sys.argv) > 1:
        print("updated" if write_settings_table(sys.argv[1]) else "unchanged", sys.argv[1])
    else:
        print(settings_table())
