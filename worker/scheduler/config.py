"""SchedulerConfig: the options the scheduler reads and the engine does not (admission, the
prefix cache, step budgets, structured output's limits, profiling, injected faults), and
SchedulerProcessConfig: an engine's options with its scheduler's, as one scheduler process is given them.

Both tables of options are read from the ``[engine]`` table of a worker's TOML, the
``RADIXQ_<KEY>`` environment and the ``radixq worker`` flags (worker.config); each field is
declared once, with its help, choices and check (worker.options).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from worker.engine.config import EngineConfig
from worker.engine.faults import Fault
from worker.kvcache.names import PREFIX_CACHES
from worker.options import above, at_least, check_options, option, within
from worker.scheduler.names import SCHEDULE_POLICIES


@dataclass(frozen=True)
class SchedulerConfig:
    """What one scheduler decides with. ``output_reserve_ratio`` is the share of each request's
    remaining output that admission reserves in the KV pool (1.0: never retract; lower admits
    more and retracts when short)."""

    max_prefill_tokens: int = option(
        8192,
        "token budget of one prefill step (longer prompts are chunked)",
        check=at_least(1),
    )
    cache: str = option("radix", "`radix` or `naive` (no sharing)", choices=tuple(PREFIX_CACHES))
    schedule_policy: str = option(
        "lpm",
        "`lpm`: waiting requests whose prefix is cached first, siblings together (age-bounded); "
        "`fcfs`: arrival order",
        choices=SCHEDULE_POLICIES,
    )
    mixed_batches: bool = option(
        True,
        "while a long prompt is chunked, its steps decode the running requests too (false: a prefill step "
        "holds prefills only)",
    )
    output_reserve_ratio: float = option(
        0.5,
        "share of remaining output reserved in the KV pool at admission",
        check=within(0, 1),
    )
    grammar_timeout_s: float = option(
        60.0,
        "seconds a job's grammar may take to compile (in a child process); a longer compile fails that job only",
        check=above(0),
    )
    grammar_memory_mib: int = option(
        2048,
        "MiB one grammar compile may add to the compiler process (its size at rest, about 400 MiB, not "
        "counted); a compile that needs more fails that job only",
        check=at_least(16),
    )
    step_profile: bool = option(False, "record every scheduler step and log a summary at exit (profiling)")
    fault: str = option(
        "",
        "injected failures for the failure tests: `raise-on-token:N`, `exit-on-token:N`, `raise-on-batch:K`, "
        "`sleep-per-step:MS`",
    )

    def __post_init__(self) -> None:
        if self.fault:
            Fault.parse(self.fault)  # raises ValueError naming the rule
        check_options(self)


ENGINE_OPTIONS = frozenset(f.name for f in dataclasses.fields(EngineConfig))
SCHEDULER_OPTIONS = frozenset(f.name for f in dataclasses.fields(SchedulerConfig))


@dataclass(frozen=True)
class SchedulerProcessConfig:
    """An engine's options and its scheduler's: what a scheduler process runs with."""

    engine: EngineConfig
    scheduler: SchedulerConfig = SchedulerConfig()

    @classmethod
    def from_options(cls, model: str, **options: Any) -> SchedulerProcessConfig:
        """Build from keyword options of either table, naming any unknown one."""
        unknown = sorted(set(options) - ENGINE_OPTIONS - SCHEDULER_OPTIONS - {"model"})
        if unknown:
            known = sorted(ENGINE_OPTIONS | SCHEDULER_OPTIONS)
            raise TypeError(f"unknown engine option(s) {unknown}; known: {known}")
        engine = {k: v for k, v in options.items() if k in ENGINE_OPTIONS}
        scheduler = {k: v for k, v in options.items() if k in SCHEDULER_OPTIONS}
        return cls(EngineConfig(model=model, **engine), SchedulerConfig(**scheduler))

    def replace(self, **options: Any) -> SchedulerProcessConfig:
        """A copy with ``options`` (of either table) changed."""
        merged = {**dataclasses.asdict(self.engine), **dataclasses.asdict(self.scheduler), **options}
        return SchedulerProcessConfig.from_options(merged.pop("model"), **merged)

    def resolved(self) -> SchedulerProcessConfig:
        """A copy with the engine's "auto" device resolved (EngineConfig.resolved)."""
        return dataclasses.replace(self, engine=self.engine.resolved())

    @property
    def model(self) -> str:
        return self.engine.model

    def to_json(self) -> str:
        """One argv-safe line a child process rebuilds the config from (``from_json``)."""
        return json.dumps(
            {"engine": dataclasses.asdict(self.engine), "scheduler": dataclasses.asdict(self.scheduler)}
        )

    @classmethod
    def from_json(cls, text: str) -> SchedulerProcessConfig:
        tables = json.loads(text)
        return cls(EngineConfig(**tables["engine"]), SchedulerConfig(**tables["scheduler"]))
