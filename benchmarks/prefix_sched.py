"""Prefix-aware scheduling: G groups x K jobs sharing a P-token prefix per group, under tight KV pools.

From ``--seed``: a random P-token prefix per group and a unique random tail per job, arriving
grouped (a group's jobs together) or shuffled; greedy, EOS ignored. Each (arrival, policy)
runs on a pool of ``--num-pages`` (default: pages for ``--pool-prefixes`` of the G prefixes)
and is compared with an ample-pool run of the same jobs. Reports cached prompt tokens, the
ideal (one miss per group), wall time, crashes, and whether every token equals the ample run.

    python benchmarks/prefix_sched.py                                  # CPU, tiny dummy Llama
    python benchmarks/prefix_sched.py --device cuda --model configs/qwen3-0.6b.json \\
        --groups 16 --jobs-per-group 32 --prefix-tokens 3000 --num-pages 4000

``--host-time``: instead, the scheduler's host time per step (choosing the batch and preparing
its input, the forward excluded) with ``--waiting`` requests queued, e.g. 10 against 10000.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from wire.schema import SamplingParams  # noqa: E402
from worker.llm import LLM  # noqa: E402
from worker.scheduler.hooks import StepHooks  # noqa: E402

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 16384,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
}


def tiny_model_path() -> str:
    """A config.json of a tiny Llama (dummy weights) in a temporary directory."""
    folder = Path(tempfile.mkdtemp(prefix="radixq-tiny-"))
    (folder / "config.json").write_text(json.dumps(TINY_LLAMA))
    return str(folder / "config.json")


def vocab_size(model: str) -> int:
    path = Path(model)
    return int(json.loads((path / "config.json" if path.is_dir() else path).read_text())["vocab_size"])


def build_jobs(args: argparse.Namespace, vocab_size: int, shuffled: bool) -> list[list[int]]:
    rng = random.Random(args.seed)
    top = min(vocab_size, 32000) - 1
    prefixes = [[rng.randint(1, top) for _ in range(args.prefix_tokens)] for _ in range(args.groups)]
    jobs = [
        prefixes[g] + [rng.randint(1, top) for _ in range(args.tail_tokens)]
        for g in range(args.groups)
        for _ in range(args.jobs_per_group)
    ]
    if shuffled:
        random.Random(args.seed + 1).shuffle(jobs)
    return jobs


def engine_options(args: argparse.Namespace, **overrides: object) -> dict:
    options: dict = {
        "device": args.device,
        "page_size": args.page_size,
        "max_prefill_tokens": args.max_prefill_tokens,
        "max_running_reqs": args.max_running_reqs,
        "load_format": "dummy",
    }
    if args.device == "cpu":
        options["attention"] = "torch"
    options.update(overrides)
    return options


def run(args: argparse.Namespace, model: str, jobs: list[list[int]], **options: object) -> dict:
    llm = LLM(model, **engine_options(args, **options))
    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    try:
        results = llm.generate(jobs, sampling)
    except Exception as exc:  # a crash is a result of this benchmark
        return {"crashed": f"{type(exc).__name__}: {exc}", "wall_s": round(time.perf_counter() - start, 2)}
    wall_s = time.perf_counter() - start
    stats = llm.scheduler.stats
    return {
        "crashed": None,
        "errors": sum(r.error is not None for r in results),
        "wall_s": round(wall_s, 2),
        "cached_tokens": sum(r.usage.cached_tokens for r in results),
        "prefill_tokens": stats.prefill_tokens,
        "retractions": stats.retractions,
        "outputs": [r.choices[0].token_ids if r.choices else None for r in results],
    }


def sched_main(args: argparse.Namespace, model: str) -> None:
    num_pages = args.num_pages or round(
        args.pool_prefixes * args.groups * args.prefix_tokens / args.page_size
    )
    ideal = (args.jobs_per_group - 1) * args.groups * (args.prefix_tokens // args.page_size * args.page_size)
    rows = []
    for arrival in args.arrivals:
        jobs = build_jobs(args, vocab_size(model), arrival == "shuffled")
        ample = run(args, model, jobs, num_pages=args.ample_pages, schedule_policy="fcfs")
        for policy in args.policies:
            tight = run(args, model, jobs, num_pages=num_pages, schedule_policy=policy)
            outputs = tight.pop("outputs", None)
            tight.update(
                arrival=arrival,
                policy=policy,
                num_pages=num_pages,
                cached_of_ideal=round(tight.get("cached_tokens", 0) / ideal, 3) if ideal else None,
                tokens_equal_ample=outputs == ample["outputs"],
            )
            rows.append(tight)
            print(json.dumps(tight), flush=True)
    summary: dict = {"ideal_cached_tokens": ideal, "runs": rows}
    for policy in args.policies:
        by = {r["arrival"]: r for r in rows if r["policy"] == policy}
        if {"grouped", "shuffled"} <= by.keys() and by["grouped"].get("cached_tokens"):
            ratio = by["shuffled"].get("cached_tokens", 0) / by["grouped"]["cached_tokens"]
            summary[f"{policy}_shuffled_over_grouped_cached"] = round(ratio, 3)
    print(json.dumps(summary, indent=2))


class HostTimer(StepHooks):
    """Host seconds from a step's launch to its forward (batch choice and preparation)."""

    def __init__(self) -> None:
        self.launch_s: list[float] = []
        self._start = 0.0

    def launch_started(self) -> None:
        self._start = time.perf_counter()

    def forward_started(self, fi: object) -> None:
        self.launch_s.append(time.perf_counter() - self._start)


def host_time_main(args: argparse.Namespace, model: str) -> None:
    from worker.scheduler.messages import GenerateRequest

    rng = random.Random(args.seed)
    report = {}
    for waiting in args.waiting:
        llm = LLM(model, **engine_options(args, num_pages=args.ample_pages, schedule_policy=args.policies[0]))
        sampling = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
        for i in range(waiting):
            top = min(vocab_size(model), 32000) - 1
            prompt = [rng.randint(1, top) for _ in range(args.prefix_tokens + args.tail_tokens)]
            llm.io.put(GenerateRequest(uid=f"h{i}", input_ids=prompt, sampling=sampling))
        timer = HostTimer()
        scheduler, last = llm.scheduler, None
        last = scheduler.step(last, block=False)  # takes every request in
        scheduler.hooks = timer
        while len(timer.launch_s) < args.steps and not (last is None and scheduler.idle):
            last = scheduler.step(last, block=False)
        report[waiting] = {
            "median_ms": round(statistics.median(timer.launch_s) * 1e3, 3),
            "p90_ms": round(sorted(timer.launch_s)[int(0.9 * len(timer.launch_s))] * 1e3, 3),
            "still_waiting": len(scheduler.prefill.waiting),
        }
    print(json.dumps({"policy": args.policies[0], "steps": args.steps, "host_ms_per_step": report}, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--model", default=None, help="config.json for dummy weights (default: tiny Llama)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--jobs-per-group", type=int, default=4)
    parser.add_argument("--prefix-tokens", type=int, default=256)
    parser.add_argument("--tail-tokens", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--max-prefill-tokens", type=int, default=1024)
    parser.add_argument("--max-running-reqs", type=int, default=32)
    parser.add_argument(
        "--num-pages", type=int, default=0, help="0: pages for --pool-prefixes of the prefixes"
    )
    parser.add_argument(
        "--pool-prefixes", type=float, default=1 / 3, help="share of the G prefixes the pool holds"
    )
    parser.add_argument("--ample-pages", type=int, default=8192)
    parser.add_argument("--arrivals", nargs="+", default=["grouped", "shuffled"])
    parser.add_argument("--policies", nargs="+", default=["lpm", "fcfs"])
    parser.add_argument("--host-time", action="store_true", help="measure host time per step instead")
    parser.add_argument("--waiting", type=int, nargs="+", default=[10, 10000])
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    model = args.model or tiny_model_path()
    if args.host_time:
        host_time_main(args, model)
    else:
        sched_main(args, model)


if __name__ == "__main__":
    main()
