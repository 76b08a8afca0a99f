"""Radix vs naive prefix cache: N jobs sharing a long system prompt, prefill work and wall time.

Every job is the same ``--system-tokens``-token system prompt followed by a short unique
question; each generates ``--max-tokens`` tokens greedily. Reports the prefill tokens the
engine actually computed, the prompt tokens served from the cache, and the wall time.

    python benchmarks/prefix_cache.py --jobs 64 --system-tokens 512
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from wire.schema import SamplingParams  # noqa: E402
from worker.llm import LLM  # noqa: E402
from worker.models.aliases import DEFAULT_MODEL  # noqa: E402

SYSTEM_TEXT = (
    "You are a careful assistant for a shipping company. Follow the policy below exactly. "
    "Refunds are issued within fourteen days; damaged goods need photographs; international "
    "orders pay customs on delivery; weekend deliveries cost extra; every answer is polite. "
)


def build_jobs(llm: LLM, jobs: int, system_tokens: int) -> list[list[int]]:
    system_ids = llm.encode(SYSTEM_TEXT * 40)[:system_tokens]
    assert len(system_ids) == system_tokens, "system text too short for --system-tokens"
    return [system_ids + llm.encode(f" Question {i}: how long does order {i * 7} take?") for i in range(jobs)]


def run(cache: str, args: argparse.Namespace) -> dict:
    llm = LLM(args.model, device="cpu", cache=cache, page_size=args.page_size, max_seq_len=2048)
    prompts = build_jobs(llm, args.jobs, args.system_tokens)
    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    results = llm.generate(prompts, sampling)
    elapsed = time.perf_counter() - start
    stats = llm.scheduler.stats
    return {
        "cache": cache,
        "wall_s": round(elapsed, 2),
        "prompt_tokens": sum(r.usage.prompt_tokens for r in results),
        "prefill_tokens_computed": stats.prefill_tokens,
        "cached_tokens": sum(r.usage.cached_tokens for r in results),
        "steps": stats.steps,
        "outputs": [r.choices[0].token_ids for r in results],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--jobs", type=int, default=64)
    parser.add_argument("--system-tokens", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--page-size", type=int, default=16)
    args = parser.parse_args()
    radix, naive = run("radix", args), run("naive", args)
    same = radix.pop("outputs") == naive.pop("outputs")
    report = {
        "jobs": args.jobs,
        "system_tokens": args.system_tokens,
        "radix": radix,
        "naive": naive,
        "prefill_reduction": round(
            naive["prefill_tokens_computed"] / max(1, radix["prefill_tokens_computed"]), 2
        ),
        "speedup": round(naive["wall_s"] / radix["wall_s"], 2),
        "outputs_identical": same,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
