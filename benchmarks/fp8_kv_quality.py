"""FP8 KV cache quality on a real model: greedy tokens with an FP8 (e4m3) KV cache against
the same engine with the model-dtype cache, over benchmarks/prompt_set.py's 200 prompts.

Per prompt, the position of the first generated token that differs (a prompt whose two runs
agree to the end counts its full length, flagged as agreeing). Prints the mean, median and
distribution for each scale source (`--scales calibrated unit`).

    python benchmarks/fp8_kv_quality.py                       # SmolLM2 on CPU, fp32 reference
    python benchmarks/fp8_kv_quality.py --prompts 40 --max-tokens 48
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

from prompt_set import chat_prompts  # noqa: E402

from producer.schema import SamplingParams  # noqa: E402
from worker.llm import LLM  # noqa: E402

BINS = [(0, 8), (8, 16), (16, 32), (32, 64), (64, 1 << 30)]


def first_divergence(reference: list[int], other: list[int]) -> tuple[int, bool]:
    """(index of the first token where the two differ, whether they agree entirely); a
    run that stops while the other goes on differs at the shorter one's end."""
    for i, (a, b) in enumerate(zip(reference, other, strict=False)):
        if a != b:
            return i, False
    return min(len(reference), len(other)), len(reference) == len(other)


def greedy_tokens(prompts: list, max_tokens: int, **engine_options: object) -> tuple[list[list[int]], float]:
    llm = LLM(device="cpu", max_running_reqs=64, **engine_options)
    start = time.perf_counter()
    results = llm.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0))
    seconds = time.perf_counter() - start
    return [list(r.choices[0].token_ids) for r in results], seconds


def summary(positions: list[tuple[int, bool]]) -> dict[str, object]:
    values = [p for p, _ in positions]
    hist = {f"{lo}-{hi - 1 if hi < 1 << 30 else ''}": 0 for lo, hi in BINS}
    for p, agreed in positions:
        if agreed:
            continue
        for (lo, hi), key in zip(BINS, hist, strict=True):
            if lo <= p < hi:
                hist[key] += 1
    return {
        "mean": statistics.fmean(values),
        "median": statistics.median(values),
        "agree_to_end": sum(agreed for _, agreed in positions),
        "first_diff_histogram": hist,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--scales", nargs="+", default=["calibrated", "unit"])
    args = ap.parse_args()
    prompts = chat_prompts()[: args.prompts]
    reference, ref_s = greedy_tokens(prompts, args.max_tokens)
    print(f"reference (model-dtype KV): {sum(map(len, reference))} tokens in {ref_s:.1f} s", flush=True)
    for scales in args.scales:
        tokens, s = greedy_tokens(prompts, args.max_tokens, kv_cache_dtype="fp8_e4m3", kv_scales=scales)
        positions = [first_divergence(r, t) for r, t in zip(reference, tokens, strict=True)]
        print(f"fp8_e4m3, scales {scales} ({s:.1f} s): {summary(positions)}", flush=True)


if __name__ == "__main__":
    main()
