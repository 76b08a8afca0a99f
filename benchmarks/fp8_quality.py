"""FP8 quality on a real model: FP8 weights (``quantization = "fp8"``, emulated in float32 on
CPU), an FP8 (e4m3) KV cache, and both, against the same engine in the model dtype (fp32 on
CPU), over benchmarks/prompt_set.py's 200 prompts.

Two measures, per variant (`--variants`: weights-fp8; kv-fp8 with calibrated or unit scales;
both; bf16 KV pages for scale):
- free-running: per prompt, the position of the first greedy token that differs from the
  reference run (a prompt whose two runs agree to the end counts its full length); mean,
  median and distribution. Greedy decoding is chaotic: one flipped near-tie changes the rest.
- teacher-forced: the reference completion is fed to both caches in one prefill pass (a
  prefill reads the KV it stores, as decode does); the share of positions whose argmax agrees
  and the mean KL(reference || variant) of the next-token distributions. Stabler.

    python benchmarks/fp8_quality.py                       # SmolLM2 on CPU, 200 x 128 tokens
    python benchmarks/fp8_quality.py --prompts 40 --max-tokens 48 --variants weights-fp8
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

import torch  # noqa: E402
from prompt_set import chat_prompts  # noqa: E402

from wire.schema import SamplingParams  # noqa: E402
from worker.attention.torch_ref import TorchRefBackend  # noqa: E402
from worker.forward import BatchLayout, ForwardBatch  # noqa: E402
from worker.kvcache.pool import KVPool  # noqa: E402
from worker.llm import LLM  # noqa: E402

BINS = [(0, 8), (8, 16), (16, 32), (32, 64), (64, 1 << 30)]
# name -> (engine options, the pages' dtype (None: the model's), scales: "calibrated" | "unit")
VARIANTS: dict[str, tuple[dict[str, str], torch.dtype | None, str]] = {
    "weights-fp8": ({"quantization": "fp8"}, None, "unit"),
    "kv-fp8": ({"kv_cache_dtype": "fp8_e4m3", "kv_scales": "calibrated"}, torch.float8_e4m3fn, "calibrated"),
    "both-fp8": ({"quantization": "fp8", "kv_cache_dtype": "fp8_e4m3"}, torch.float8_e4m3fn, "calibrated"),
    "kv-fp8-unit": ({"kv_cache_dtype": "fp8_e4m3", "kv_scales": "unit"}, torch.float8_e4m3fn, "unit"),
    "bf16-pages": ({}, torch.bfloat16, "unit"),
}  # fmt: skip


def first_divergence(reference: list[int], other: list[int]) -> tuple[int, bool]:
    """(index of the first token where the two differ, whether they agree entirely); a
    run that stops while the other goes on differs at the shorter one's end."""
    for i, (a, b) in enumerate(zip(reference, other, strict=False)):
        if a != b:
            return i, False
    return min(len(reference), len(other)), len(reference) == len(other)


def free_running_summary(positions: list[tuple[int, bool]]) -> dict[str, Any]:
    values = [p for p, _ in positions]
    hist = {f"{lo}-{hi - 1 if hi < 1 << 30 else ''}": 0 for lo, hi in BINS}
    for p, agreed in positions:
        for (lo, hi), key in zip(BINS, hist, strict=True):
            if not agreed and lo <= p < hi:
                hist[key] += 1
    return {
        "mean": round(statistics.fmean(values), 2),
        "median": statistics.median(values),
        "agree_to_end": sum(agreed for _, agreed in positions),
        "first_diff_histogram": hist,
    }


@torch.inference_mode()
def teacher_forced_logits(
    llm: LLM, ids: list[int], cache_dtype: torch.dtype | None, scales: Any
) -> torch.Tensor:
    """Logits at every position of ``ids`` from one prefill pass over a private KV pool whose
    pages hold ``cache_dtype`` (None: the model's dtype), with ``scales`` (k, v) if given."""
    engine, n, page = llm.engine, len(ids), 16
    mc = engine.model_config
    pages = -(-n // page)
    pool = KVPool(mc.num_layers, pages, page, mc.num_kv_heads, mc.head_dim, engine.dtype, "cpu", cache_dtype)
    if scales is not None:
        pool.set_scales(*scales)
    table = torch.arange(pages * page, dtype=torch.int32).unsqueeze(0)
    backend = TorchRefBackend(pool, table, mc.num_q_heads, mc.head_dim, page)
    one = torch.ones(1, dtype=torch.int32)
    layout = BatchLayout(slots_cpu=one - 1, cached_lens_cpu=one - 1, extend_lens_cpu=one * n)
    loc = torch.arange(n)
    batch = ForwardBatch(torch.tensor(ids), loc, loc, loc, layout, backend, backend.plan(layout), pool)
    return engine.model(batch).float()


def teacher_forced_argmax(
    llm: LLM, prompt: list[int], completion: list[int], cache_dtype: torch.dtype | None, scales: Any
) -> list[int]:
    """The model's argmax at each completion position when fed prompt + completion (the
    token it would pick where the completion's next token stands)."""
    logits = teacher_forced_logits(llm, prompt + completion, cache_dtype, scales)
    return logits[len(prompt) - 1 : len(prompt) + len(completion) - 1].argmax(-1).tolist()


def teacher_forced(
    llm: LLM,
    sequences: list[tuple[list[int], list[int]]],
    cache_dtype: torch.dtype | None,
    scales: Any,
    variant: LLM | None = None,
) -> dict[str, float]:
    """Argmax agreement and mean KL against ``llm`` with its model-dtype cache over (prompt,
    completion)s; the other side is ``variant``'s model (default ``llm``'s) with this cache."""
    agree = total = 0
    kls: list[float] = []
    for prompt, completion in sequences:
        ids, span = prompt + completion, slice(len(prompt) - 1, len(prompt) + len(completion) - 1)
        ref = torch.log_softmax(teacher_forced_logits(llm, ids, None, None)[span], -1)
        got = torch.log_softmax(teacher_forced_logits(variant or llm, ids, cache_dtype, scales)[span], -1)
        agree += int((ref.argmax(-1) == got.argmax(-1)).sum())
        total += len(completion)
        kls.append(float((ref.exp() * (ref - got)).sum(-1).mean()))
    return {"argmax_agreement": round(agree / total, 4), "mean_kl": round(statistics.fmean(kls), 5)}


def greedy(llm: LLM, prompts: list, max_tokens: int) -> list[list[int]]:
    results = llm.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0))
    return [list(r.choices[0].token_ids) for r in results]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--no-free-running", action="store_true", help="teacher-forced measure only")
    args = ap.parse_args()
    prompts = chat_prompts()[: args.prompts]
    options = {"device": "cpu", "max_running_reqs": 64, "cache": "naive"}
    start = time.perf_counter()
    reference_llm = LLM(**options)
    reference = greedy(reference_llm, prompts, args.max_tokens)
    print(f"reference: {sum(map(len, reference))} tokens in {time.perf_counter() - start:.1f} s", flush=True)
    sequences = [(reference_llm.encode(p), r) for p, r in zip(prompts, reference, strict=True)]
    for name in args.variants:
        engine_options, cache_dtype, scale_source = VARIANTS[name]
        llm = LLM(**options, **engine_options)
        row: dict[str, Any] = {}
        if not args.no_free_running and engine_options:
            tokens = greedy(llm, prompts, args.max_tokens)
            row["free_running"] = free_running_summary(
                [first_divergence(r, t) for r, t in zip(reference, tokens, strict=True)]
            )
        kv = llm.engine.kv
        scales = (kv.k_scale, kv.v_scale) if scale_source == "calibrated" else None
        row["teacher_forced"] = teacher_forced(reference_llm, sequences, cache_dtype, scales, llm)
        print(f"{name}: {row}", flush=True)
        llm = None  # type: ignore[assignment]  # NOTE: one variant's engine at a time


if __name__ == "__main__":
    main()
