"""Every reliability scenario by name, with what it does and the sizes the measured table
(docs/reliability.md, benchmarks/reliability.py) uses. Tests call the same scenarios with
smaller sizes, so the table and the suite check the same thing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.chaos import engine_faults, queue_faults, redis_faults, run_faults
from benchmarks.chaos.lab import Lab
from benchmarks.chaos.row import Observed, Row, run_scenario


@dataclass(frozen=True)
class Scenario:
    name: str
    what: str
    run: Callable[..., Observed]
    params: dict[str, Any] = field(default_factory=dict)
    engine: bool = False  # needs the tiny model (a ``model_dir`` argument)

    def __call__(self, lab: Lab, model_dir: Path | None = None, **overrides: Any) -> Row:
        """Run it in ``lab`` with the table's sizes, changed by ``overrides``; its Row."""
        params = {**self.params, **overrides}
        if self.engine:
            assert model_dir is not None, f"{self.name} needs model_dir"
            params["model_dir"] = model_dir
        return run_scenario(self.name, lab, self.run, **params)


SCENARIOS = [
    Scenario(
        "kill9-chaos",
        "3 fake-generator workers (8 jobs at a time, 50 ms each, --min-idle-s 2); every 1-2 s one of "
        "those holding jobs is kill -9'd and a new one started, until `collect` has every result",
        queue_faults.kill9_chaos,
    ),
    Scenario(
        "redis-kill9-aof-always",
        "Redis (AOF, appendfsync always) kill -9'd a quarter of the way through, started again on "
        "its port and folder 1.5 s later; 2 workers and `collect` run through it",
        redis_faults.redis_crash,
        {"fsync": "always"},
    ),
    Scenario(
        "redis-kill9-aof-everysec",
        "the same with appendfsync everysec (may lose the last second of writes: a loss must be "
        "reported, then recovered by enqueueing the file again and collecting into the same output)",
        redis_faults.redis_crash,
        {"fsync": "everysec"},
    ),
    Scenario(
        "redis-restart-without-data",
        "the same with no persistence: Redis comes back empty; the loss must be reported, then "
        "recovered by enqueueing the file again and collecting into the same output",
        redis_faults.redis_crash,
        {"appendonly": False},
    ),
    Scenario(
        "redis-aof-last-second-lost",
        "what a machine crash with appendfsync everysec loses, simulated: a second file of 500 jobs is "
        "enqueued, 1 s later Redis is kill -9'd and started from a copy of its AOF taken just before "
        "that enqueue; recovered by enqueueing both files again and collecting into the same output",
        redis_faults.redis_rolled_back,
    ),
    Scenario(
        "zombie-worker",
        "3 workers (--min-idle-s 2); one holding jobs is SIGSTOPped for 6 s, then SIGCONTed: the others "
        "take its jobs over, it finishes them too when it wakes",
        queue_faults.zombie_worker,
    ),
    Scenario(
        "maxmemory-noeviction",
        "Redis at maxmemory (noeviction, 3 MiB above empty) and 4,000 1-KB jobs: `enqueue` stops with "
        "its summary; run again beside 2 workers it waits while Redis is full; `collect` run again and "
        "again (each trims what it wrote) makes room; the limit never changes",
        redis_faults.maxmemory,
    ),
    Scenario(
        "worker-sigint",
        "real engine (tiny Llama, CPU; 4 jobs at a time, each step 30 ms slower): Ctrl-C (SIGINT to "
        "the worker's process group) mid-run, --drain-timeout-s 20; a second worker then runs the rest",
        engine_faults.worker_signal,
        {"how": "sigint"},
        engine=True,
    ),
    Scenario(
        "worker-sigterm",
        "the same with SIGTERM to the worker, 120-token jobs and --drain-timeout-s 2 (it cannot finish: "
        "it gives its jobs back); a second worker then runs the rest",
        engine_faults.worker_signal,
        {"how": "sigterm", "max_tokens": 120, "drain_timeout_s": 2.0},
        engine=True,
    ),
    Scenario(
        "run-sigint-resume",
        "`radixq run` with the real engine (4 jobs at a time, each step 30 ms slower): Ctrl-C (SIGINT to "
        "its process group) once results are written, then the same command again",
        run_faults.run_signal,
        {"how": "sigint"},
        engine=True,
    ),
    Scenario(
        "run-sigterm-resume",
        "the same with SIGTERM to `radixq run`",
        run_faults.run_signal,
        {"how": "sigterm"},
        engine=True,
    ),
    Scenario(
        "poison-worker",
        "a job that crashes the engine (RADIXQ_FAULT=raise-on-token:77) among 12 others, 2 engine "
        "workers with --max-attempts 2",
        engine_faults.poison_worker,
        engine=True,
    ),
    Scenario(
        "poison-run",
        "the same job among 8 others under `radixq run` (default max attempts 3)",
        run_faults.poison_run,
        engine=True,
    ),
    Scenario(
        "bad-stream-entries",
        "entries XADDed straight to the jobs stream between 8 valid jobs: an id that is not UTF-8, "
        "metadata nested 5,000 deep, top_k 2**63; one engine worker",
        engine_faults.bad_entries,
        engine=True,
    ),
    Scenario(
        "workload-shape-crash",
        "the engine crashes on any step of 4 or more requests (RADIXQ_FAULT=raise-on-batch:4), 12 jobs: "
        "no single job reproduces it",
        engine_faults.workload_shape,
        engine=True,
    ),
]
BY_NAME = {scenario.name: scenario for scenario in SCENARIOS}
