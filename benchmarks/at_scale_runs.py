"""One timed run of the at-scale benchmark (benchmarks/at_scale.py): the engine alone in this
process (``worker.LLM``), or through the queue (redis-server -> ``radixq worker`` -> collector).

Both build their engine from the same options, warm it up outside the timed region and give
the device memory back before returning, so the next run (another variant, interleaved) sizes
its KV pool from the same free memory.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from offline import Workload, free_gpu_memory  # noqa: E402
from queue_e2e_gpu import check_results, make_jobs, run_jobs  # noqa: E402

from worker.scheduler.hooks import HookGroup, StepHooks  # noqa: E402


@dataclass
class RunRecord:
    variant: str
    round: int
    seconds: float  # timed region: generate() alone, or first XADD to last result collected
    output_tokens: int
    startup_s: float  # engine build (or worker start) + warm-up
    kv_pages: int | None = None  # the engine's KV pool (None: not known, a queue run)
    page_size: int | None = None
    max_decode_batch: int | None = None  # most requests in one decode step
    decode_steps: int | None = None
    prefill_steps: int | None = None  # steps computing prompt tokens (mixed with decode or not)
    retractions: int | None = None
    graph_batch_sizes: list[int] = field(default_factory=list)
    preset: str = ""  # the at_scale.py preset it ran (set by the driver)
    eager_decode_steps: int | None = None  # decode steps no captured graph held (run eagerly)
    eager_batch_max: int | None = None  # the largest of their batches
    step_profile: dict[str, Any] | None = None  # with --profile-steps: step_breakdown() of the run
    split_passes: int | None = None  # decode passes cut in halves (engine option decode_split_sms)

    @property
    def tok_per_s(self) -> float:
        return self.output_tokens / self.seconds

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "tok_per_s": self.tok_per_s}


class BatchWatch(StepHooks):
    """Counts decode and prefill steps, the largest decode batch and the decode steps that ran
    eagerly (no captured graph held their batch) (host side, cheap)."""

    def __init__(self) -> None:
        self.max_decode_batch = self.decode_steps = self.prefill_steps = 0
        self.eager_decode_steps = self.eager_batch_max = 0

    def forward_started(self, fi: Any) -> None:
        batch_size = fi.batch_size
        if fi.layout.num_tokens == batch_size:
            self.decode_steps += 1
            self.max_decode_batch = max(self.max_decode_batch, batch_size)
            if fi.graph_bs is None:
                self.eager_decode_steps += 1
                self.eager_batch_max = max(self.eager_batch_max, batch_size)
        else:
            self.prefill_steps += 1


def step_breakdown(summary: dict[str, Any]) -> dict[str, Any]:
    """What a run's step profile (worker.scheduler.profile.StepProfiler.summary) says of its
    steps: GPU ms of a decode step at the largest batch and of prefill per 8,192 tokens (mixed
    steps: the decode rows riding along included), host ms per full decode step, GPU busy
    share. Values are None where the profile has no such step or no GPU times (CPU)."""
    full, prefill = summary.get("decode_full", {}), summary.get("prefill", {})
    return {
        "decode_batch": full.get("batch_size"),
        "decode_steps_at_batch": full.get("steps"),
        "decode_gpu_ms_p50": full.get("gpu_ms", {}).get("p50"),
        "decode_host_ms_p50": full.get("host_ms", {}).get("p50"),
        "prefill_steps": prefill.get("steps"),
        "prefill_gpu_ms_per_8192_tokens": prefill.get("gpu_ms_per_8192_tokens"),
        "gpu_busy_share": summary.get("gpu_busy_share"),
    }


def warmup_workload(prompt_len: int, output_len: int, num_requests: int = 8) -> Workload:
    """A few short requests (constant ids, so they share no page with random prompts)."""
    lengths = [min(prompt_len, 16 + 8 * i) for i in range(num_requests)]
    return Workload([[i + 1] * n for i, n in enumerate(lengths)], [min(output_len, 16)] * num_requests)


def run_engine(
    variant: str,
    round_: int,
    model: str,
    options: dict[str, Any],
    workload: Workload,
    warmup: Workload,
    temperature: float,
    profile_steps: bool = False,
) -> RunRecord:
    """Build ``worker.LLM(model, **options)``, warm it up, time ``generate`` on ``workload``;
    with ``profile_steps`` the scheduler's StepProfiler watches the timed run too."""
    import torch

    from wire.schema import SamplingParams
    from worker import LLM

    def params(w: Workload) -> list[SamplingParams]:
        return [SamplingParams(max_tokens=n, temperature=temperature, ignore_eos=True) for n in w.max_tokens]

    start = time.perf_counter()
    llm = LLM(model, **options)
    llm.generate(warmup.prompts, params(warmup))
    startup_s = time.perf_counter() - start
    watch = BatchWatch()
    profiler = None
    if profile_steps:
        from worker.scheduler.profile import StepProfiler

        profiler = StepProfiler(llm.engine)
    llm.scheduler.hooks = watch if profiler is None else HookGroup(watch, profiler)
    retractions = llm.scheduler.stats.retractions
    split_before = llm.engine.split.passes if llm.engine.split is not None else None
    timed = params(workload)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    results = llm.generate(workload.prompts, timed)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    for result, n in zip(results, workload.max_tokens, strict=True):
        if result.error is not None:
            raise RuntimeError(f"{variant}: request {result.id} failed: {result.error}")
        got = len(result.choices[0].token_ids)
        if got != n or result.usage.cached_tokens:
            raise RuntimeError(
                f"{variant}: request {result.id}: {got} tokens (expected {n}), "
                f"{result.usage.cached_tokens} prompt tokens cached (expected 0)"
            )
    engine = llm.engine
    record = RunRecord(
        variant=variant,
        round=round_,
        seconds=seconds,
        output_tokens=sum(len(r.choices[0].token_ids) for r in results),
        startup_s=startup_s,
        kv_pages=engine.num_pages,
        page_size=engine.page_size,
        max_decode_batch=watch.max_decode_batch,
        decode_steps=watch.decode_steps,
        prefill_steps=watch.prefill_steps,
        retractions=llm.scheduler.stats.retractions - retractions,
        graph_batch_sizes=list(engine.graph_runner.batch_sizes) if engine.graph_runner else [],
        eager_decode_steps=watch.eager_decode_steps,
        eager_batch_max=watch.eager_batch_max or None,
        step_profile=step_breakdown(profiler.summary()) if profiler is not None else None,
        split_passes=None if split_before is None else engine.split.passes - split_before,
    )
    llm = engine = results = profiler = None  # type: ignore[assignment]  # NOTE: drop every reference first
    free_gpu_memory()
    return record


def engine_toml(model: str, options: dict[str, Any]) -> str:
    """The worker's ``[engine]`` table holding the same options as the engine-alone run."""
    lines = ["[engine]", f"model = {json.dumps(str(Path(model).resolve()))}"]
    for key, value in options.items():
        if isinstance(value, bool):
            lines.append(f"{key} = {'true' if value else 'false'}")
        elif isinstance(value, (int, float)):
            lines.append(f"{key} = {value!r}")
        else:
            lines.append(f"{key} = {json.dumps(str(value))}")
    return "\n".join(lines) + "\n"


def run_queue(
    variant: str,
    rounds: list[tuple[int, Workload]],
    model: str,
    options: dict[str, Any],
    warmup: Workload,
    temperature: float,
    redis_url: str,
    work: Path,
    timeout_s: float,
    workers: int = 1,
    label: str | None = None,
) -> list[RunRecord]:
    """Start ``workers`` ``radixq worker`` processes on a fresh queue named after ``label``
    (default: ``variant``; the driver adds the preset when several run), each on GPUs of its
    own when there are several (worker_gpus), wait until every one serves, warm them up through
    the queue, then time each round's workload from the first XADD to the last result the
    collector writes; every result is checked. The workers are stopped after."""
    from producer.client import Client
    from producer.collector import Collector
    from producer.runner import worker_command, worker_env
    from radixq.cli import WORKER_COMMAND
    from wire.keys import QueueKeys
    from wire.status import serving

    queue = f"atscale-{rounds[0][0]}-{(label or variant).replace(' ', '-').replace('=', '-')}"
    config = work / f"{queue}.toml"
    config.write_text(engine_toml(model, options))
    log_path = work / f"{queue}.log"
    baseline_free = _free_device_bytes()
    gpus = worker_gpus(workers, int(options.get("tensor_parallel_size", 1)))
    start = time.perf_counter()
    procs = []
    with open(log_path, "wb") as log:
        for w in range(workers):
            env = worker_env(redis_url)
            if gpus is not None:
                env["CUDA_VISIBLE_DEVICES"] = gpus[w]
            command = worker_command(WORKER_COMMAND, queue, f"{queue}-{w}", ["--config", str(config)])
            procs.append(
                subprocess.Popen(
                    command, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
                )
            )
    client = Client.from_url(redis_url, queue)
    records = []
    try:
        while len(serving(client.redis, QueueKeys(queue))) < workers:  # NOTE: loaded: beats past LOADING
            if time.perf_counter() - start > timeout_s or any(p.poll() is not None for p in procs):
                raise RuntimeError(f"{variant}: {workers} workers did not come up")
            time.sleep(0.2)
        collector = Collector(client.redis, queue)
        warm = Workload(warmup.prompts * workers, warmup.max_tokens * workers)
        warm_jobs = make_jobs("w", warm, temperature)
        run_jobs(client, collector, warm_jobs, work / f"{queue}-warm.jsonl", timeout_s)
        startup_s = time.perf_counter() - start
        for round_, workload in rounds:
            jobs = make_jobs(f"j{round_}-", workload, temperature)
            out = work / f"{queue}-{round_}.jsonl"
            seconds = run_jobs(client, collector, jobs, out, timeout_s)
            tokens = check_results(out, jobs)
            records.append(RunRecord(variant, round_, seconds, tokens, startup_s))
    except BaseException:
        tail = log_path.read_text(errors="replace")[-3000:] if log_path.exists() else ""
        print(f"{variant}: the workers' log ends with:\n{tail}", file=sys.stderr)
        raise
    finally:
        client.close()
        for proc in procs:
            _stop(proc)
        _wait_for_device_memory(baseline_free)
    return records


def worker_gpus(workers: int, tp: int) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES of each worker: ``tp`` GPUs each, in order, from those this process
    sees; None for one worker (it sees what this process sees) or without CUDA."""
    import torch

    if workers == 1 or not torch.cuda.is_available():
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
    if len(ids) < workers * tp:
        raise RuntimeError(f"{workers} workers x {tp} GPUs each need {workers * tp} GPUs, {len(ids)} visible")
    return [",".join(ids[w * tp : (w + 1) * tp]) for w in range(workers)]


def _stop(worker: subprocess.Popen[bytes]) -> None:
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
    try:
        worker.wait(timeout=120)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()


def _free_device_bytes() -> list[int] | None:
    """Free bytes of every visible GPU (a worker may have run on any of them)."""
    import torch

    if not torch.cuda.is_available():
        return None
    return [int(torch.cuda.mem_get_info(i)[0]) for i in range(torch.cuda.device_count())]


def _wait_for_device_memory(baseline_free: list[int] | None, timeout_s: float = 60.0) -> None:
    """Wait until the workers' processes have handed every GPU's memory back (within 1 GiB)."""
    if baseline_free is None:
        return
    deadline = time.monotonic() + timeout_s
    while (free := _free_device_bytes()) is not None and any(
        now < before - 2**30 for now, before in zip(free, baseline_free, strict=True)
    ):
        if time.monotonic() > deadline:
            held = sum(max(0, before - now) for now, before in zip(free, baseline_free, strict=True))
            print(f"warning: {held / 2**30:.1f} GiB still held after the workers exited")
            return
        time.sleep(0.5)
