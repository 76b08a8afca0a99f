"""Cascade (shared-prefix) attention on and off, interleaved, on the shared-prefix workload.

From ``--seed``: G groups of K jobs, a random P-token prefix per group and a unique random tail
of ``--tail-min``..``--tail-max`` tokens per job (input_ids: dummy weights), greedy, EOS ignored.
Each mode gets a fresh engine (built outside the timing) that first runs a few warm-up jobs
on prefixes of their own (JIT, CUDA graphs), then the timed jobs from an empty cache. Modes
run in turn, ``--repeat`` rounds (off, on, off, on, ...); the summary gives each mode's median
wall time and output tok/s, the on/off ratio, how many eager passes had prefix groups, and
whether each job's tokens equal those of the first mode.

Modes: ``off`` (radix cache, cascade off), ``on`` (radix cache, cascade_attention on),
``naive`` (no prefix sharing: the baseline of the issue's "x times the naive cache").

    python benchmarks/cascade.py                      # CPU, tiny dummy Llama: proves it runs
    python benchmarks/cascade.py --preset h200        # the issue's workload, Qwen3-0.6B dummy
    python benchmarks/cascade.py --preset h200 --modes off on naive --repeat 5 --out cascade.json
    python benchmarks/cascade.py --preset h200-long --modes off on --repeat 3
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

from offline import free_gpu_memory  # noqa: E402
from prefix_sched import tiny_model_path, vocab_size  # noqa: E402

from wire.schema import SamplingParams  # noqa: E402
from worker.llm import LLM  # noqa: E402

PRESETS: dict[str, dict] = {
    # CPU: a tiny random Llama; the threshold 0 makes every step with a group cascade
    "tiny": dict(
        device="cpu", model=None, groups=4, jobs_per_group=4, prefix_tokens=96, tail_min=4, tail_max=12,
        max_tokens=4, num_pages=2048, max_running_reqs=16, min_saved_mib=0.0,
    ),
    # the shared-prefix workload: 512 jobs, 16 groups, 3,000-token prefixes, 64-192-token
    # tails, 128 output tokens (radix 4.29 s against naive 10.91 s on the H200 before cascade)
    "h200": dict(
        device="cuda", model="configs/qwen3-0.6b.json", groups=16, jobs_per_group=32, prefix_tokens=3000,
        tail_min=64, tail_max=192, max_tokens=128, num_pages=None, max_running_reqs=256, min_saved_mib=32.0,
    ),
    # the workload cascade exists for (issue 16): 256 jobs on one 8,000-token prefix, short tails,
    # 256 output tokens: every decode step reads the prefix 256 times without it
    "h200-long": dict(
        device="cuda", model="configs/qwen3-0.6b.json", groups=1, jobs_per_group=256, prefix_tokens=8000,
        tail_min=16, tail_max=64, max_tokens=256, num_pages=None, max_running_reqs=256, min_saved_mib=32.0,
    ),
}  # fmt: skip
MODES = {
    "off": dict(cache="radix", cascade_attention=False),
    "on": dict(cache="radix", cascade_attention=True),
    "naive": dict(cache="naive", cascade_attention=False),
}


def build_jobs(args: argparse.Namespace, vocab: int, seed: int, groups: int) -> list[list[int]]:
    rng = random.Random(seed)
    top = min(vocab, 32000) - 1
    prefixes = [[rng.randint(1, top) for _ in range(args.prefix_tokens)] for _ in range(groups)]
    return [
        prefixes[g] + [rng.randint(1, top) for _ in range(rng.randint(args.tail_min, args.tail_max))]
        for g in range(groups)
        for _ in range(args.jobs_per_group)
    ]


def run(
    args: argparse.Namespace, model: str, mode: str, jobs: list[list[int]], warmup: list[list[int]]
) -> dict:
    options = dict(
        device=args.device, load_format="dummy", page_size=args.page_size, max_running_reqs=args.max_running_reqs,
        max_prefill_tokens=args.max_prefill_tokens, cascade_min_saved_mib=args.min_saved_mib, **MODES[mode],
    )  # fmt: skip
    if args.num_pages:
        options["num_pages"] = args.num_pages
    if args.device == "cpu":
        options["attention"] = "torch"
    llm = LLM(model, **options)
    grouped_passes = [0]
    plan = llm.engine.backend.plan

    def spy(layout):  # eager passes only: replayed CUDA graphs do not plan
        grouped_passes[0] += layout.prefix_groups is not None
        return plan(layout)

    llm.engine.backend.plan = spy  # type: ignore[method-assign]
    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    llm.generate(warmup, sampling)
    steps_before, grouped_passes[0] = llm.scheduler.stats.steps, 0
    start = time.perf_counter()
    results = llm.generate(jobs, sampling)
    wall_s = time.perf_counter() - start
    outputs = [r.choices[0].token_ids if r.choices else None for r in results]
    row = {
        "mode": mode,
        "wall_s": round(wall_s, 3),
        "output_tok_s": round(sum(len(o or []) for o in outputs) / wall_s, 1),
        "errors": sum(r.error is not None for r in results),
        "steps": llm.scheduler.stats.steps - steps_before,
        "cascade_passes": grouped_passes[0],
        "cached_tokens": sum(r.usage.cached_tokens for r in results),
    }
    del llm, results
    free_gpu_memory()
    return {**row, "outputs": outputs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--modes", nargs="+", choices=sorted(MODES), default=["off", "on"])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--max-prefill-tokens", type=int, default=8192)
    parser.add_argument("--out", default="", help="also write the report (JSON) here")
    for key in PRESETS["tiny"]:  # each preset value can be overridden
        kind = {"device": str, "model": str, "min_saved_mib": float}.get(key, int)
        parser.add_argument(f"--{key.replace('_', '-')}", type=kind, default=None)
    args = parser.parse_args()
    for key, value in PRESETS[args.preset].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    model = args.model or tiny_model_path()
    vocab = vocab_size(model)
    jobs = build_jobs(args, vocab, args.seed, args.groups)
    warmup = build_jobs(args, vocab, args.seed + 1000, 1)[:4]
    rows, first_outputs = [], None
    for round_ in range(args.repeat):
        for mode in args.modes:
            row = run(args, model, mode, jobs, warmup)
            outputs = row.pop("outputs")
            first_outputs = first_outputs or outputs
            row.update(round=round_, jobs_identical_to_first_mode=sum(
                a == b for a, b in zip(outputs, first_outputs, strict=True)))  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
    medians = {m: statistics.median(r["wall_s"] for r in rows if r["mode"] == m) for m in args.modes}
    summary = {
        "preset": args.preset,
        "jobs": len(jobs),
        "workload": {k: getattr(args, k) for k in PRESETS["tiny"]},
        "median_wall_s": medians,
        "median_output_tok_s": {
            m: statistics.median(r["output_tok_s"] for r in rows if r["mode"] == m) for m in args.modes
        },
        "runs": rows,
    }
    if {"on", "off"} <= medians.keys():
        summary["off_over_on"] = round(medians["off"] / medians["on"], 3)
    if {"naive", "on"} <= medians.keys():
        summary["naive_over_on"] = round(medians["naive"] / medians["on"], 3)
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
