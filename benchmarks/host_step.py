"""Host time of the scheduler's decode step at 1,024 running requests, with no model math (CPU).

The real Scheduler (admission, radix cache, batch preparation, allocation, stop checks, result
processing, insert on finish, eviction and retraction when the pool runs short) drives a stub
engine whose forward pass returns sampled-looking token ids at once and whose graph sizes are
the device's (graphs to ``--requests``, so decode batches are padded as there). The workload is
the standard benchmark's distribution (benchmarks/offline.py) with ``--requests`` requests, all
running at once (``max_running_reqs`` = ``--requests``), temperature 0.6, EOS ignored; lengths
may be scaled down with ``--length-scale``. The KV pool holds ``--pool-share`` of the workload's
tokens (default 0.8: finished requests' pages fill the prefix cache and are evicted for the
running ones' growth, as on a full device).

Per decode step the StepProfiler's launch + process seconds (worker.scheduler.profile) are the
host time; reported as p50/p90 over the steps that decode at least ``--full-share`` of the
requests ("full") and over every decode step. Beside them, the scheduler thread's CPU time in
the same phases ("cpu"), which a machine loaded by other processes inflates less. ``--compare TREE`` runs the same script against
another checkout (e.g. ``git worktree add /tmp/hp-base d566dc8``), one process per run,
alternating trees, ``--runs`` times each (with ``GOMP_SPINCOUNT=10000``, as a worker's
scheduler process); the median of the runs' p50/p90 is reported.

    python benchmarks/host_step.py                              # this tree, one run
    python benchmarks/host_step.py --compare /tmp/hp-base --runs 5
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

HERE = Path(__file__).resolve()
REPO = HERE.parents[1]
VOCAB_SIZE = 128_256  # Llama-3.1-8B's
PAGE_SIZE = 16


def workload(num_requests: int, length_scale: float, seed: int = 0) -> tuple[list[list[int]], list[int]]:
    """The standard benchmark's prompts and max_tokens (offline.standard_workload), scaled."""
    rng = random.Random(seed)
    prompts = [[rng.randint(0, 10000) for _ in range(rng.randint(100, 1024))] for _ in range(num_requests)]
    max_tokens = [rng.randint(100, 1024) for _ in range(num_requests)]
    if length_scale != 1.0:
        prompts = [p[: max(1, int(len(p) * length_scale))] for p in prompts]
        max_tokens = [max(1, int(n * length_scale)) for n in max_tokens]
    return prompts, max_tokens


class StubEngine:
    """What the scheduler reads of an Engine, with a forward pass that does no math."""

    def __init__(self, max_running_reqs: int, num_pages: int, max_seq_len: int) -> None:
        import torch

        from worker.engine.config import EngineConfig
        from worker.engine.graph import fitting_batch_size, graph_batch_sizes

        self.config = EngineConfig(device="cpu", max_running_reqs=max_running_reqs, overlap=True)
        self.device = torch.device("cpu")
        self.stream = self.scheduler_stream = None
        self.page_size = PAGE_SIZE
        self.num_pages = num_pages
        self.max_seq_len = max_seq_len
        self.vocab_size = VOCAB_SIZE
        self.eos_token_ids = frozenset({128_001, 128_009})
        self.backend = SimpleNamespace(supports_cascade=False)  # NOTE: d566dc8's scheduler reads it
        table_shape = (max_running_reqs + 1, -(-max_seq_len // PAGE_SIZE) * PAGE_SIZE)
        self.page_table = torch.zeros(table_shape, dtype=torch.int32)
        self.token_pool = torch.zeros(table_shape, dtype=torch.int32)
        self.dummy_loc = num_pages * PAGE_SIZE
        self._sizes = graph_batch_sizes(max_running_reqs)
        self._fitting = fitting_batch_size
        # NOTE: token ids drawn once; each pass takes the next window (a stand-in for sampling)
        self._tokens = torch.randint(0, 128_000, (1 << 16,), dtype=torch.int32)
        self._at = 0

    def graph_batch_size(self, batch_size: int) -> int | None:
        return self._fitting(self._sizes, batch_size)

    def forward(self, fi: Any) -> Any:
        from worker.forward import ForwardOutput

        n = fi.batch_size
        if self._at + n > self._tokens.numel():
            self._at = 0
        tokens = self._tokens[self._at : self._at + n]
        self._at += n
        return ForwardOutput(tokens, None)


def cpu_profiler(scheduler: Any) -> Any:
    """The scheduler's StepProfiler (of the tree under test), also counting this thread's CPU
    seconds of each step's launch and process phases (``cpu_s[id(record)]``)."""
    from worker.scheduler.profile import StepProfiler

    class CpuStepProfiler(StepProfiler):
        def __init__(self, engine: Any) -> None:
            super().__init__(engine)
            self.cpu_s: dict[int, list[float]] = {}
            self._cpu_start = 0.0

        def launch_started(self) -> None:
            super().launch_started()
            self._cpu_start = time.thread_time()

        def launch_finished(self, step: Any) -> None:
            super().launch_finished(step)
            self.cpu_s[id(self._by_output[id(step.output)])] = [time.thread_time() - self._cpu_start, 0.0]

        def process_started(self, step: Any) -> None:
            super().process_started(step)
            self._cpu_start = time.thread_time()

        def process_finished(self, step: Any) -> None:
            record = self._by_output[id(step.output)]
            super().process_finished(step)
            self.cpu_s[id(record)][1] = time.thread_time() - self._cpu_start

    profiler = CpuStepProfiler(scheduler.engine)
    scheduler.hooks = profiler
    return profiler


def run_once(args: argparse.Namespace) -> dict[str, Any]:
    """One scheduler run of the whole workload in this process; per-step host times."""
    import gc

    from wire.schema import SamplingParams
    from worker.scheduler.config import SchedulerConfig
    from worker.scheduler.io import InMemoryIO
    from worker.scheduler.messages import GenerateRequest
    from worker.scheduler.scheduler import Scheduler

    prompts, max_tokens = workload(args.requests, args.length_scale)
    total_tokens = sum(len(p) + n for p, n in zip(prompts, max_tokens, strict=True))
    num_pages = int(args.pool_share * total_tokens) // PAGE_SIZE + args.requests
    max_seq_len = max(len(p) + n for p, n in zip(prompts, max_tokens, strict=True)) + PAGE_SIZE
    engine = StubEngine(args.requests, num_pages, max_seq_len)
    io = InMemoryIO()
    scheduler = Scheduler(engine, SchedulerConfig(), io)  # type: ignore[arg-type]
    for i, (prompt, n) in enumerate(zip(prompts, max_tokens, strict=True)):
        sampling = SamplingParams(max_tokens=n, temperature=0.6, ignore_eos=True)
        io.put(GenerateRequest(uid=f"r{i}", input_ids=prompt, sampling=sampling))
    profiler = cpu_profiler(scheduler)
    gc.collect()
    start = time.perf_counter()
    scheduler.run_until_idle()
    wall_s = time.perf_counter() - start
    finished = [m for m in io.take_all() if type(m).__name__ == "RequestFinished"]
    generated = sum(len(c.token_ids) for m in finished for c in m.choices)
    if len(finished) != args.requests or generated != sum(max_tokens):
        raise RuntimeError(f"{len(finished)} requests answered, {generated} tokens of {sum(max_tokens)}")
    scheduler.check_integrity()
    full_batch = args.full_share * args.requests
    steps = [r for r in profiler.records if not r.is_prefill]
    full = [r for r in steps if r.batch_size >= full_batch]
    return {
        "wall_s": wall_s,
        "decode_steps": len(steps),
        "prefill_steps": len(profiler.records) - len(steps),
        "retractions": scheduler.stats.retractions,
        "full_ms": [1e3 * (r.launch_s + r.process_s) for r in full],
        "full_launch_ms": [1e3 * r.launch_s for r in full],
        "full_process_ms": [1e3 * r.process_s for r in full],
        "full_cpu_ms": [1e3 * sum(profiler.cpu_s[id(r)]) for r in full],
        "all_ms": [1e3 * (r.launch_s + r.process_s) for r in steps],
        "prefill_ms": [1e3 * (r.launch_s + r.process_s) for r in profiler.records if r.is_prefill],
    }


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def summary(run: dict[str, Any]) -> dict[str, float]:
    out = {"wall_s": run["wall_s"], "decode_steps": run["decode_steps"], "retractions": run["retractions"]}
    for name in ("full", "full_launch", "full_process", "full_cpu", "all", "prefill"):
        out[f"{name}_p50"] = quantile(run[f"{name}_ms"], 0.5)
        out[f"{name}_p90"] = quantile(run[f"{name}_ms"], 0.9)
    out["full_steps"] = len(run["full_ms"])
    return out


def child(args: argparse.Namespace, tree: Path) -> dict[str, float]:
    """One run in a fresh process importing ``worker`` from ``tree``."""
    argv = [sys.executable, str(HERE), "--one", "--tree", str(tree), "--requests", str(args.requests)]
    argv += ["--length-scale", str(args.length_scale), "--pool-share", str(args.pool_share)]
    argv += ["--full-share", str(args.full_share)]
    # NOTE: the OpenMP spin count a worker's scheduler process runs with (worker.engine.threads)
    env = {"GOMP_SPINCOUNT": "10000", **os.environ, "PYTHONHASHSEED": "0"}
    out = subprocess.run(argv, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"run against {tree} failed:\n{out.stderr[-3000:]}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def commit_of(tree: Path) -> str:
    out = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain"], capture_output=True, text=True)
    return (out.stdout.strip() or "?") + ("+dirty" if dirty.stdout.strip() else "")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=1024, help="requests, all running at once")
    parser.add_argument("--length-scale", type=float, default=1.0, help="scale prompt and output lengths")
    parser.add_argument("--pool-share", type=float, default=0.8, help="KV pool / the workload's tokens")
    parser.add_argument("--full-share", type=float, default=0.98, help="a 'full' step decodes this share")
    parser.add_argument("--runs", type=int, default=1, help="runs per tree (interleaved with --compare)")
    parser.add_argument("--compare", default=None, help="another checkout to run against, interleaved")
    parser.add_argument("--tree", default=str(REPO), help="the checkout whose worker package runs")
    parser.add_argument("--one", action="store_true", help="one run in this process, JSON out (internal)")
    parser.add_argument("--out", default=None, help="write every run's summary as JSON here")
    args = parser.parse_args()
    if args.one:
        sys.path.insert(0, str(Path(args.tree).resolve()))
        print(json.dumps(summary(run_once(args))))
        return
    trees = [Path(args.compare).resolve()] if args.compare else []
    trees.append(Path(args.tree).resolve())
    labels = {t: f"{t} ({commit_of(t)})" for t in trees}
    runs: dict[Path, list[dict[str, float]]] = {t: [] for t in trees}
    load_before = os.getloadavg()
    for r in range(args.runs):
        for tree in trees:
            result = child(args, tree)
            runs[tree].append(result)
            print(
                f"run {r} {labels[tree]}: full p50 {result['full_p50']:.2f} ms "
                f"(launch {result['full_launch_p50']:.2f} + process {result['full_process_p50']:.2f}; "
                f"cpu {result['full_cpu_p50']:.2f}), "
                f"all p50 {result['all_p50']:.2f} ms, {result['decode_steps']} decode steps, "
                f"{result['retractions']} retractions, {result['wall_s']:.1f} s",
                flush=True,
            )
    load_after = os.getloadavg()
    if args.out:
        Path(args.out).write_text(json.dumps({str(t): v for t, v in runs.items()}, indent=1))
    print(
        f"\nhost ms per decode step, {args.requests} requests all running, length scale {args.length_scale}, "
        f"pool {args.pool_share:.0%} of the workload; median of {args.runs} run(s) each; load average "
        f"{load_before[0]:.2f} before, {load_after[0]:.2f} after"
    )
    print(
        f"{'tree':<44} {'full p50':>9} {'full p90':>9} {'launch':>7} {'process':>8} {'cpu p50':>8} "
        f"{'all p50':>8} {'all p90':>8} {'prefill p50':>11}"
    )
    for tree in trees:
        med = {k: statistics.median(run[k] for run in runs[tree]) for k in runs[tree][0]}
        print(
            f"{labels[tree][-44:]:<44} {med['full_p50']:>9.2f} {med['full_p90']:>9.2f} "
            f"{med['full_launch_p50']:>7.2f} {med['full_process_p50']:>8.2f} {med['full_cpu_p50']:>8.2f} "
            f"{med['all_p50']:>8.2f} {med['all_p90']:>8.2f} {med['prefill_p50']:>11.2f}"
        )


if __name__ == "__main__":
    main()
