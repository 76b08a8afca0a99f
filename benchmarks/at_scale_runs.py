"""One timed run of the at-scale benchmark (benchmarks/at_scale.py): the engine alone in this
process (``worker.LLM``), or through the queue (redis-server -> ``radixq worker`` -> collector).

Both build their engine from the same options, warm it up outside the timed region and give
the device memory back before returning, so the next run (another variant, interleaved) sizes
its KV pool from the same free memory.
"""

from __future__ import annotations

import json
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

from worker.scheduler.hooks import StepHooks  # noqa: E402


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
    eager_decode_steps: int | None = None  # decode steps no captured graph held (run eagerly)
    eager_batch_max: int | None = None  # the largest of their batches

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
) -> RunRecord:
    """Build ``worker.LLM(model, **options)``, warm it up, time ``generate`` on ``workload``."""
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
    llm.scheduler.hooks = watch
    retractions = llm.scheduler.stats.retractions
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
    )
    llm = engine = results = None  # type: ignore[assignment]  # NOTE: drop every reference first
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
    round_: int,
    model: str,
    options: dict[str, Any],
    workload: Workload,
    warmup: Workload,
    temperature: float,
    redis_url: str,
    work: Path,
    timeout_s: float,
) -> RunRecord:
    """Start ``radixq worker`` on a fresh queue, warm it up through the queue (this waits out
    model load and graph capture), then time the workload from the first XADD to the last
    result the collector writes; every result is checked. The worker is stopped after."""
    from producer.client import Client
    from producer.collector import Collector
    from producer.runner import worker_command, worker_env
    from radixq.cli import WORKER_COMMAND

    queue = f"atscale-{round_}-{variant.replace(' ', '-').replace('=', '-')}"
    config = work / f"{queue}.toml"
    config.write_text(engine_toml(model, options))
    log_path = work / f"{queue}.log"
    baseline_free = _free_device_bytes()
    start = time.perf_counter()
    with open(log_path, "wb") as log:
        worker = subprocess.Popen(
            worker_command(WORKER_COMMAND, queue, f"{queue}-0", ["--config", str(config)]),
            env=worker_env(redis_url),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    client = Client.from_url(redis_url, queue)
    try:
        collector = Collector(client.redis, queue)
        run_jobs(
            client, collector, make_jobs("w", warmup, temperature), work / f"{queue}-warm.jsonl", timeout_s
        )
        startup_s = time.perf_counter() - start
        jobs = make_jobs("j", workload, temperature)
        out = work / f"{queue}.jsonl"
        seconds = run_jobs(client, collector, jobs, out, timeout_s)
        tokens = check_results(out, jobs)
    except BaseException:
        tail = log_path.read_text(errors="replace")[-3000:] if log_path.exists() else ""
        print(f"{variant}: the worker's log ends with:\n{tail}", file=sys.stderr)
        raise
    finally:
        client.close()
        _stop(worker)
        _wait_for_device_memory(baseline_free)
    return RunRecord(
        variant=variant, round=round_, seconds=seconds, output_tokens=tokens, startup_s=startup_s
    )


def _stop(worker: subprocess.Popen[bytes]) -> None:
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
    try:
        worker.wait(timeout=120)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()


def _free_device_bytes() -> int | None:
    import torch

    return int(torch.cuda.mem_get_info()[0]) if torch.cuda.is_available() else None


def _wait_for_device_memory(baseline_free: int | None, timeout_s: float = 60.0) -> None:
    """Wait until the worker's processes have handed the device memory back (within 1 GiB)."""
    if baseline_free is None:
        return
    deadline = time.monotonic() + timeout_s
    while (free := _free_device_bytes()) is not None and free < baseline_free - 2**30:
        if time.monotonic() > deadline:
            print(f"warning: {(baseline_free - free) / 2**30:.1f} GiB still held after the worker exited")
            return
        time.sleep(0.5)
