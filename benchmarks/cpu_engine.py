"""radixq vs transformers ``generate`` on CPU: output tokens/s for the same prompts and lengths.

Both sides run the same weights (SmolLM2-135M-Instruct by default), greedy, exactly
``--max-tokens`` new tokens per prompt (EOS ignored), all prompts in one batch (HF: left
padding), in this one process. ``--repeat`` rounds alternate the two sides (radixq first in
even rounds, HF first in odd ones); each round has prompts of its own, so radixq's prefix
cache holds only what real traffic would share (the chat template's system prompt), and
``--cache naive`` turns even that off. Reports every run (wall time, this process's CPU
time, which a loaded machine inflates less, and the median decode step of each side: radixq's
StepProfiler, gaps between generate's calls to its logits processors), the medians, the load average before and after,
and whether both sides produced the same tokens for every prompt. ``--threads`` sets the torch
threads of both sides (default: radixq's ``cpu_threads`` default, every available core). Both
sides run with ``GOMP_SPINCOUNT=10000``, as a worker's engine process does
(worker.engine.threads), unless the environment sets ``GOMP_SPINCOUNT`` or ``OMP_WAIT_POLICY``
(``GOMP_SPINCOUNT=300000`` is libgomp's default, which a loaded machine punishes:
docs/performance.md).

    python benchmarks/cpu_engine.py --prompts 16 --max-tokens 32 --repeat 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from worker.engine.threads import openmp_env  # noqa: E402

os.environ.update(openmp_env(dict(os.environ)))  # NOTE: before torch loads its OpenMP runtime

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, LogitsProcessor, LogitsProcessorList  # noqa: E402

from wire.schema import SamplingParams  # noqa: E402
from worker.llm import LLM  # noqa: E402
from worker.models.aliases import DEFAULT_MODEL  # noqa: E402
from worker.scheduler.profile import StepProfiler  # noqa: E402

TOPICS = ["the ocean", "a robot", "bread", "the moon", "trains", "music", "winter", "a library"]


def make_prompts(count: int, round_index: int = 0) -> list[str]:
    """``count`` prompts, different in every round (the number differs)."""
    return [
        f"Write a short story about {TOPICS[i % len(TOPICS)]} and the number {round_index * 1000 + i}."
        for i in range(count)
    ]


class Timer:
    """Wall and process CPU seconds of a ``with`` block, and its median decode step."""

    decode_step_ms = 0.0

    def __enter__(self) -> Timer:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *_: object) -> None:
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu


def run_radixq(llm: LLM, prompt_ids: list[list[int]], max_tokens: int) -> tuple[Timer, list[list[int]], int]:
    """(timer, tokens per prompt, prompt tokens served from the prefix cache)."""
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    steps = StepProfiler.install(llm.scheduler)  # on CPU a step's launch is its whole forward pass
    with Timer() as timer:
        results = llm.generate(prompt_ids, sampling)
    llm.scheduler.hooks = None
    timer.decode_step_ms = 1e3 * statistics.median(r.launch_s for r in steps.records if not r.is_prefill)
    return timer, [r.choices[0].token_ids for r in results], sum(r.usage.cached_tokens for r in results)


def run_hf(
    hf: torch.nn.Module, prompt_ids: list[list[int]], max_tokens: int
) -> tuple[Timer, list[list[int]]]:
    width = max(len(p) for p in prompt_ids)
    ids = torch.zeros(len(prompt_ids), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompt_ids):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    kwargs = dict(do_sample=False, max_new_tokens=max_tokens, min_new_tokens=max_tokens, pad_token_id=0)
    stamps = StepStamps()
    with torch.no_grad(), Timer() as timer:
        out = hf.generate(ids, attention_mask=mask, logits_processor=LogitsProcessorList([stamps]), **kwargs)
    gaps = [b - a for a, b in zip(stamps.at_s, stamps.at_s[1:], strict=False)]  # one decode step each
    timer.decode_step_ms = 1e3 * statistics.median(gaps) if gaps else 0.0
    return timer, out[:, width:].tolist()


class StepStamps(LogitsProcessor):
    """Records when each of generate's steps reaches its logits processors (changes nothing)."""

    def __init__(self) -> None:
        self.at_s: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.at_s.append(time.perf_counter())
        return scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=5, help="interleaved rounds (median reported)")
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--cache", default="radix", choices=["radix", "naive"])
    parser.add_argument("--attention", default="auto", help="radixq's attention backend")
    parser.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--threads", type=int, default=0, help="torch threads of both sides (0: every core)")
    parser.add_argument(
        "--onednn", action=argparse.BooleanOptionalAction, default=True, help="radixq's oneDNN linears"
    )
    args = parser.parse_args()

    load_before = os.getloadavg()
    llm = LLM(
        args.model, device="cpu", page_size=args.page_size, overlap=args.overlap, max_seq_len=1024,
        cache=args.cache, attention=args.attention, cpu_threads=args.threads, onednn=args.onednn,
    )  # fmt: skip
    hf = AutoModelForCausalLM.from_pretrained(str(llm.engine.loaded.path), dtype=torch.float32).eval()
    warm = [llm.encode([{"role": "user", "content": p}]) for p in make_prompts(2, round_index=999)]
    run_radixq(llm, warm, 2)
    run_hf(hf, warm, 2)
    total = args.prompts * args.max_tokens
    runs = []
    for r in range(args.repeat):
        prompt_ids = [llm.encode([{"role": "user", "content": p}]) for p in make_prompts(args.prompts, r)]
        if r % 2 == 0:
            radixq_t, radixq_tokens, cached = run_radixq(llm, prompt_ids, args.max_tokens)
            hf_t, hf_tokens = run_hf(hf, prompt_ids, args.max_tokens)
        else:
            hf_t, hf_tokens = run_hf(hf, prompt_ids, args.max_tokens)
            radixq_t, radixq_tokens, cached = run_radixq(llm, prompt_ids, args.max_tokens)
        runs.append(
            {
                "radixq_s": round(radixq_t.wall, 3),
                "radixq_output_tok_s": round(total / radixq_t.wall, 1),
                "hf_generate_s": round(hf_t.wall, 3),
                "hf_output_tok_s": round(total / hf_t.wall, 1),
                "speedup": round(hf_t.wall / radixq_t.wall, 2),
                "radixq_cpu_s": round(radixq_t.cpu, 3),
                "hf_cpu_s": round(hf_t.cpu, 3),
                "radixq_decode_step_ms": round(radixq_t.decode_step_ms, 1),
                "hf_decode_step_ms": round(hf_t.decode_step_ms, 1),
                "load_avg_1m": round(os.getloadavg()[0], 2),
                "prompt_tokens": sum(len(p) for p in prompt_ids),
                "cached_tokens": cached,
                "prompts_with_equal_tokens": sum(
                    a == b for a, b in zip(radixq_tokens, hf_tokens, strict=True)
                ),
            }
        )
        print(json.dumps({"round": r, **runs[-1]}), file=sys.stderr)
    median_radixq = statistics.median(run["radixq_s"] for run in runs)
    median_hf = statistics.median(run["hf_generate_s"] for run in runs)
    median_cpu = [statistics.median(run[key] for run in runs) for key in ("radixq_cpu_s", "hf_cpu_s")]
    report = {
        "model": llm.engine.loaded.name,
        "threads": torch.get_num_threads(),
        "attention": type(llm.engine.backend).__name__,
        "cache": args.cache,
        "onednn": args.onednn,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "unset"),
        "gomp_spincount": os.environ.get("GOMP_SPINCOUNT", "unset"),
        "prompts": args.prompts,
        "max_tokens": args.max_tokens,
        "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
        "runs": runs,
        "median_radixq_output_tok_s": round(total / median_radixq, 1),
        "median_hf_output_tok_s": round(total / median_hf, 1),
        "median_speedup": round(median_hf / median_radixq, 2),  # of the median times
        "median_round_speedup": statistics.median(run["speedup"] for run in runs),
        "median_cpu_s": {"radixq": median_cpu[0], "hf": median_cpu[1]},
        "median_cpu_speedup": round(median_cpu[1] / median_cpu[0], 2),
        "all_tokens_equal": all(run["prompts_with_equal_tokens"] == args.prompts for run in runs),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
