"""One worker configuration, built once at the edge and frozen.

A worker's settings live in three tables - ``[worker]`` (who it is and where its queue is),
``[queue]`` (how it consumes: worker.queue.config.ConsumerConfig) and ``[engine]``
(worker.engine.config.EngineConfig) - and come from, in rising order of precedence:

    defaults  <  the TOML file (--config)  <  RADIXQ_<KEY> environment variables  <  flags

A CPU worker gets CPU-sized engine limits (``CPU_DEFAULTS``) for the settings nobody gave:
``load_worker_config`` applies them when the device is ``cpu``, and ``for_device`` once an
``auto`` device is resolved to cpu (the worker does that before it starts the engine).

Every setting has the environment variable ``RADIXQ_`` + its key in capitals (a few also
answer to an older name: see ``_ALSO_FROM``); this module is the only place that reads them.
``settings_table()`` renders the README's table of every setting from the same definitions.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from wire.keys import DEFAULT_QUEUE
from worker.engine.config import EngineConfig
from worker.models.registry import DEFAULT_MODEL
from worker.queue.config import ConsumerConfig, default_worker_name

DEFAULT_REDIS_URL = "redis://localhost:6379/0"


class ConfigError(ValueError):
    """A setting that cannot be used: which one, from where, and why (one line)."""


@dataclass(frozen=True)
class WorkerSection:
    """The ``[worker]`` table."""

    queue: str = DEFAULT_QUEUE
    redis_url: str = DEFAULT_REDIS_URL
    name: str = ""  # "": hostname-pid
    generator: str = "engine"
    log_level: str = "INFO"
    served_model_names: str = ""  # comma-separated; "": any model name a job gives is run
    metrics_port: int = 0  # 0: no /metrics
    connect_timeout_s: float = 30.0  # at start-up: how long to wait for Redis to answer

    def __post_init__(self) -> None:
        if not 0 <= self.metrics_port <= 65535:
            raise ValueError(f"metrics_port={self.metrics_port}: must be a port in [1, 65535], or 0 for none")
        if not self.connect_timeout_s >= 0:
            raise ValueError(f"connect_timeout_s={self.connect_timeout_s}: must be >= 0")
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
    given: frozenset[str] = frozenset()  # dotted settings set by the file, environment or flags

    def for_device(self, device: str) -> WorkerConfig:
        """A copy for ``device`` (cpu or cuda): engine.device set, and on cpu the CPU_DEFAULTS
        of every setting that was not given."""
        engine = dataclasses.replace(self.engine, device=device)
        if device == "cpu":
            chosen = {d.partition(".")[2]: v for d, v in CPU_DEFAULTS.items() if d not in self.given}
            engine = dataclasses.replace(engine, **chosen)
        return dataclasses.replace(self, engine=engine)


HELP: dict[str, str] = {
    "worker.queue": "queue to consume",
    "worker.redis_url": "Redis to use (`rediss://` for TLS)",
    "worker.name": "consumer name (default: hostname-pid)",
    "worker.generator": "`engine`, or a `module:callable` generator factory",
    "worker.log_level": "DEBUG, INFO, WARNING, ERROR (DEBUG also shows model loading's progress bars)",
    "worker.served_model_names": "model names this worker answers to, comma-separated; a job naming another gets a `model_not_served` error (empty: any name runs on the worker's model)",
    "worker.metrics_port": "serve Prometheus `/metrics` on this port (0: off)",
    "worker.connect_timeout_s": "at start-up, how long to wait for Redis to answer before exiting with code 2 (before the model loads; once reached, later outages are waited out)",
    "queue.block_s": "longest wait for new entries while nothing is held",
    "queue.poll_s": "longest wait for results while jobs are held",
    "queue.read_batch": "most entries one read returns",
    "queue.read_window": "most jobs held at once (0: two per running slot of the engine; never more than the engine takes, 8 per slot, nor than a fair share of the queue's jobs over the live workers)",
    "queue.steal_after_s": "a partition's backlog must be this old before a worker that ran dry steals from it (its owner first)",
    "queue.survey_s": "how often to read the queue's backlog and live workers (window, partition owners)",
    "queue.min_idle_s": "an entry idle this long belongs to a dead worker and is reclaimed",
    "queue.max_attempts": "deliveries (or crashes of the engine while run alone) before the dead-letter stream",
    "queue.heartbeat_s": "how often the worker writes its heartbeat",
    "queue.drain_timeout_s": "SIGTERM to exit, all of it: finishing, giving back, stopping",
    "queue.max_backoff_s": "longest wait between tries while Redis is unavailable",
    "queue.trim_jobs": "trim acknowledged entries from the jobs stream",
    "queue.housekeeping_s": "how often to trim and to forget dead consumers",
}
_ALSO_FROM = {"worker.redis_url": ("REDIS_URL",), "worker.generator": ("RADIXQ_BACKEND",)}
_TABLES: dict[str, type] = {"worker": WorkerSection, "queue": ConsumerConfig, "engine": EngineConfig}
_SKIPPED = {"queue": {"queue", "name"}}  # set from [worker]


@dataclass(frozen=True)
class Setting:
    table: str
    key: str
    default: Any

    @property
    def dotted(self) -> str:
        return f"{self.table}.{self.key}"

    @property
    def env(self) -> tuple[str, ...]:
        return (f"RADIXQ_{self.key.upper()}", *_ALSO_FROM.get(self.dotted, ()))


def settings() -> list[Setting]:
    """Every setting, table by table, in the order of its dataclass."""
    found = []
    for table, cls in _TABLES.items():
        for f in dataclasses.fields(cls):
            if f.name in _SKIPPED.get(table, ()):
                continue
            default = f.default if f.default is not dataclasses.MISSING else None
            if table == "engine" and f.name == "model":
                default = DEFAULT_MODEL
            found.append(Setting(table, f.name, default))
    return found


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
            values[dotted] = (value, f"--{dotted.partition('.')[2].replace('_', '-')}")
    tables: dict[str, dict[str, Any]] = {table: {} for table in _TABLES}
    for dotted, (value, _) in values.items():
        table, _, key = dotted.partition(".")
        tables[table][key] = value
    section = _build(WorkerSection, tables["worker"], "worker", values)
    queue = _build(
        ConsumerConfig,
        {**tables["queue"], "queue": section.queue, "name": section.name or default_worker_name()},
        "queue",
        values,
    )
    engine = _build(EngineConfig, {"model": DEFAULT_MODEL, **tables["engine"]}, "engine", values)
    config = WorkerConfig(section, queue, engine, frozenset(values))
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
    """The README's table of every setting (markdown)."""
    rows = ["| setting | environment | default | meaning |", "| --- | --- | --- | --- |"]
    for s in settings():
        default = (
            "" if s.default is None else str(s.default).lower() if isinstance(s.default, bool) else s.default
        )
        env = ", ".join(f"`{name}`" for name in s.env)
        help_text = HELP.get(s.dotted) or ENGINE_HELP.get(s.key, "")
        rows.append(f"| `[{s.table}] {s.key}` | {env} | `{default}` | {help_text} |")
    return "\n".join(rows)


ENGINE_HELP: dict[str, str] = {
    "model": "alias, HF directory, `.gguf` file, cached hub id, or config.json for dummy weights",
    "load_format": "`auto`, `safetensors`, `gguf`, `dummy`",
    "device": "`auto` (cuda when a GPU is there), `cpu`, `cuda`",
    "dtype": "`auto` (bfloat16 on CUDA, float32 on CPU), `float32`, `float16`, `bfloat16`",
    "page_size": "tokens per KV page (prefix sharing is by whole pages)",
    "num_pages": "KV pool size; empty: from `mem_fraction` of free GPU memory, or `cpu_kv_gib` on CPU",
    "mem_fraction": "share of free GPU memory for the KV pool",
    "cpu_kv_gib": "KV pool size on CPU (resident only as its pages are first written)",
    "cpu_threads": "torch threads of a CPU engine (0: every core the process may use, within a container's CPU quota); `radixq run --workers N` gives each worker cores / N unless this is a count",
    "max_running_reqs": "requests decoding at once",
    "max_prefill_tokens": "token budget of one prefill step (longer prompts are chunked)",
    "max_seq_len": "context length; empty: the model's",
    "cache": "`radix` or `naive` (no sharing)",
    "kv_cache_dtype": "`auto` (the model's dtype) or `fp8_e4m3`: half the KV bytes, twice the tokens in memory",
    "quantization": "`none`, or `fp8`: projection weights in e4m3 with per-channel scales, activations quantized per token, FP8 GEMMs (emulated in float32 on CPU); embeddings and LM head stay in the model dtype",
    "kv_scales": "FP8 KV scales: `calibrated` per layer at load, or `unit` (1.0)",
    "schedule_policy": "`lpm`: waiting requests whose prefix is cached first, siblings together (age-bounded); `fcfs`: arrival order",
    "overlap": "overlap scheduling (false: plain loop, for debugging)",
    "mixed_batches": "while a long prompt is chunked, its steps decode the running requests too (false: a prefill step holds prefills only)",
    "attention": "`auto` (`flashinfer` on CUDA, else `sdpa`), `flashinfer`, `sdpa` (torch SDPA, decode rows batched), `torch` (the per-request reference)",
    "decode_kernel": "FlashInfer decode kernel: `auto` (XQA over FP8 KV pages on Hopper, FA2 otherwise), `fa2`, `xqa`",
    "cuda_graph": "CUDA graphs for decode batches up to `cuda_graph_max_bs`",
    "cuda_graph_max_bs": "largest decode batch captured as a CUDA graph",
    "cascade_attention": "shared-prefix (cascade) attention: requests sharing cached prefix pages read them once per group (decode steps with groups run without CUDA graphs)",
    "cascade_min_saved_mib": "cascade runs in a step only when it saves at least this many MiB of KV reads per layer (0: whenever a group exists)",
    "output_reserve_ratio": "share of remaining output reserved in the KV pool at admission",
    "triton": "fused Triton kernels on CUDA (false: the torch paths, for ablation)",
    "onednn": "float32 linear layers on CPU through oneDNN, about twice MKL's speed here (false: torch's default, MKL, for ablation)",
    "cache_dir": "where converted models are cached (empty: `~/.cache/radixq/models`)",
    "grammar_timeout_s": "seconds a job's grammar may take to compile (in a child process); a longer compile fails that job only",
    "grammar_memory_mib": "MiB one grammar compile may add to the compiler process (its size at rest, about 400 MiB, not counted); a compile that needs more fails that job only",
    "tensor_parallel_size": "processes (GPUs) one model is split over, one per rank on `cuda:0..N-1` of the worker's `CUDA_VISIBLE_DEVICES` (`--gpus`); rank 0 schedules, the others follow its batches; structured output is refused with N > 1. A pool of TP=1 workers gives more throughput when the model fits one GPU",
    "step_profile": "record every scheduler step and log a summary at exit (profiling)",
    "fault": "injected failures for the failure tests: `raise-on-token:N`, `exit-on-token:N`, `raise-on-batch:K`, `sleep-per-step:MS`",
}
