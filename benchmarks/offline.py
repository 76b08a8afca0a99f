"""The standard offline throughput benchmark (as nano-vllm and Mini-SGLang run it).

256 requests; ``random.seed(0)``; each prompt is ``randint(100, 1024)`` random token ids in
[0, 10000], all prompts drawn first, then ``max_tokens = randint(100, 1024)`` for every
request; EOS ignored. That is 142,827 prompt and 133,966 output tokens. The figure is output
tokens / wall seconds of the timed run, after a warm-up run (``--repeat N``: the median of N
timed runs, each with the prompt ids shifted so that no run hits another's cached prefixes).

    python benchmarks/offline.py --model configs/qwen3-0.6b.json              # radixq, dummy weights
    python benchmarks/offline.py --model configs/qwen3-0.6b.json --peer hf    # transformers CB

Engine switches (``--no-overlap``, ``--no-cuda-graph``, ``--cache naive``, ``--attention``,
``--page-size``) are engine and scheduler options passed to ``worker.LLM``; the ``no-triton`` variant
turns the fused kernels off. ``--variants default,no-overlap,no-cuda-graph,naive`` runs several
configurations one after another in this process (a table at the end); ``--profile-steps``
records host time per step phase and CUDA-event time per pass (worker.scheduler.profile) and
prints percentiles. ``--json-schema FILE`` puts that JSON schema on every request (structured
output; the model needs a tokenizer, e.g. ``--model smollm2-135m --load-format auto``): a
request then ends when its JSON is complete (EOS ignored only before that), so the figure is
the tokens actually generated per second and the finish reasons are counted. ``--max-tokens N``
caps every request's max_tokens (small CPU runs). ``--peer hf`` runs transformers' continuous batching on the same requests
after radixq, in the same process, for a side-by-side ratio.

The cost of logprobs and penalties: ``--logprobs K`` (logprobs with K top_logprobs),
``--frequency-penalty``, ``--presence-penalty``, ``--repetition-penalty``, ``--logit-bias N``
and ``--min-tokens`` give every request those fields (EOS stays ignored); compare with a run
without them:

    python benchmarks/offline.py --model configs/qwen3-0.6b.json --logprobs 5
    python benchmarks/offline.py --model configs/qwen3-0.6b.json --repetition-penalty 1.1 --frequency-penalty 0.5
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# NOTE: run as a script from anywhere; the repository root must precede any installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPT_TOKENS = 142_827
OUTPUT_TOKENS = 133_966


@dataclass(frozen=True)
class Workload:
    prompts: list[list[int]]
    max_tokens: list[int]

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)

    @property
    def num_output_tokens(self) -> int:
        return sum(self.max_tokens)


def standard_workload(num_requests: int = 256, seed: int = 0) -> Workload:
    """The benchmark's requests; with the defaults the token totals are asserted."""
    rng = random.Random(seed)  # same stream as random.seed(seed) + random.randint
    prompts = [[rng.randint(0, 10000) for _ in range(rng.randint(100, 1024))] for _ in range(num_requests)]
    max_tokens = [rng.randint(100, 1024) for _ in range(num_requests)]
    workload = Workload(prompts, max_tokens)
    if (num_requests, seed) == (256, 0):
        assert workload.num_prompt_tokens == PROMPT_TOKENS, workload.num_prompt_tokens
        assert workload.num_output_tokens == OUTPUT_TOKENS, workload.num_output_tokens
    return workload


def fresh_copy(workload: Workload, run: int) -> Workload:
    """The workload with every prompt token id shifted by run * 10000: the same shapes and
    work, but no prefix in common with an earlier run (a repeat must not hit the radix cache)."""
    return Workload([[t + run * 10000 for t in p] for p in workload.prompts], workload.max_tokens)


def warmup_workload() -> Workload:
    """A few short requests that touch prefill, decode and sampling before timing."""
    return Workload([[i + 1] * (64 + 32 * i) for i in range(8)], [32] * 8)


VARIANTS = {
    "default": {},
    "no-overlap": {"overlap": False},
    "no-cuda-graph": {"cuda_graph": False},
    "naive": {"cache": "naive"},
    "page1": {"page_size": 1},
    "no-triton": {"triton": False},
    "fp8-kv": {"kv_cache_dtype": "fp8_e4m3"},
    "fp8-kv-fa2": {"kv_cache_dtype": "fp8_e4m3", "decode_kernel": "fa2"},
    "fp8-w": {"quantization": "fp8"},
    "fp8-all": {"quantization": "fp8", "kv_cache_dtype": "fp8_e4m3"},
}


def radixq_options(args: argparse.Namespace, variant: str) -> dict:
    """The engine and scheduler options of one variant run (flags, then the variant's own)."""
    return {
        "load_format": args.load_format,
        "page_size": args.page_size,
        "cache": args.cache,
        "overlap": args.overlap,
        "cuda_graph": args.cuda_graph,
        "attention": args.attention,
        "max_running_reqs": args.max_running_reqs,
        **({"mem_fraction": args.mem_fraction} if args.mem_fraction else {}),
        **({"num_pages": args.num_pages} if args.num_pages else {}),
        **VARIANTS[variant],
    }


def timed_generate(
    args: argparse.Namespace, llm, w: Workload, finish_reasons: collections.Counter
) -> tuple[float, int]:
    """One synchronised, timed ``llm.generate`` of the workload: (seconds, output tokens)."""
    from wire.schema import SamplingParams

    extras = sampling_extras(args)
    params = [
        SamplingParams(
            max_tokens=n,
            temperature=args.temperature,
            ignore_eos=True,
            json_schema=args.schema,
            **{**extras, "min_tokens": min(n, args.min_tokens)},
        )
        for n in w.max_tokens
    ]
    _sync()
    start = time.perf_counter()
    results = llm.generate(w.prompts, params)
    _sync()
    elapsed = time.perf_counter() - start
    errors = [r.error for r in results if r.error is not None]
    if errors:
        raise RuntimeError(f"{len(errors)} requests failed, first: {errors[0]}")
    finish_reasons.update(r.choices[0].finish_reason for r in results)
    return elapsed, sum(len(r.choices[0].token_ids) for r in results)


def run_radixq(args: argparse.Namespace, workload: Workload, variant: str = "default") -> dict:
    from worker import LLM

    options = radixq_options(args, variant)
    start = time.perf_counter()
    llm = LLM(args.model, **options)
    startup_s = time.perf_counter() - start

    finish_reasons: collections.Counter[str] = collections.Counter()

    def generate(w: Workload) -> tuple[float, int]:
        return timed_generate(args, llm, w, finish_reasons)

    generate(warmup_workload())
    profiler = None
    if args.profile_steps:
        from worker.scheduler.profile import StepProfiler

        profiler = StepProfiler.install(llm.scheduler)
    runs_s = []
    finish_reasons.clear()
    for run in range(args.repeat):
        elapsed, generated = generate(fresh_copy(workload, run))
        runs_s.append(elapsed)
    result = {
        "engine": f"radixq[{variant}]",
        "options": options,
        "sampling": sampling_extras(args),
        "seconds": statistics.median(runs_s),
        "runs_s": runs_s,
        "output_tokens": generated,
        "startup_s": startup_s,
        "steps": llm.scheduler.stats.steps,
        "retractions": llm.scheduler.stats.retractions,
        "kv_pages": llm.engine.num_pages,
        "finish_reasons": dict(finish_reasons),
        **graph_use(llm),
    }
    if profiler is not None:
        result["step_profile"] = profiler.summary()
    if args.kernel_profile:
        result["kernel_profile"] = kernel_profile(generate, workload, args.kernel_profile)
    llm = generate = profiler = None  # type: ignore[assignment]  # NOTE: drop every reference first
    free_gpu_memory()
    return result


def run_interleaved(args: argparse.Namespace, workload: Workload, variants: list[str]) -> list[dict]:
    """Every variant's engine built once and kept (each with ``--num-pages`` pages), warmed up,
    then ``--rounds`` rounds of one timed run per variant in turn: round r runs the workload
    shifted by r (fresh prompt ids, no cached prefix from an earlier round). Medians count."""
    from worker import LLM

    llms, startup = {}, {}
    for v in variants:
        start = time.perf_counter()
        llms[v] = LLM(args.model, **radixq_options(args, v))
        timed_generate(args, llms[v], warmup_workload(), collections.Counter())
        startup[v] = time.perf_counter() - start
        print(f"built {v} in {startup[v]:.1f} s ({llms[v].engine.num_pages} KV pages)", flush=True)
    runs: dict[str, list[float]] = {v: [] for v in variants}
    generated: dict[str, int] = {}
    reasons: dict[str, collections.Counter] = {v: collections.Counter() for v in variants}
    for r in range(args.rounds):
        for v in variants:
            elapsed, generated[v] = timed_generate(args, llms[v], fresh_copy(workload, r), reasons[v])
            runs[v].append(elapsed)
            print(f"round {r} {v}: {elapsed:.3f} s, {generated[v] / elapsed:,.0f} tok/s", flush=True)
    results = [
        {
            "engine": f"radixq[{v}]",
            "options": radixq_options(args, v),
            "seconds": statistics.median(runs[v]),
            "runs_s": runs[v],
            "output_tokens": generated[v],
            "startup_s": startup[v],
            "steps": llms[v].scheduler.stats.steps,
            "retractions": llms[v].scheduler.stats.retractions,
            "kv_pages": llms[v].engine.num_pages,
            "finish_reasons": dict(reasons[v]),
            **graph_use(llms[v]),
        }
        for v in variants
    ]
    llms.clear()
    free_gpu_memory()
    return results


def graph_use(llm) -> dict:
    """The largest captured decode graph and the decode steps that ran eagerly (warm-up
    included): a batch larger than every graph runs eagerly, host-bound."""
    runner = llm.engine.graph_runner
    return {
        "graph_max_bs": runner.batch_sizes[-1] if runner is not None else None,
        "eager": llm.scheduler.stats.eager_summary(),
    }


def sampling_extras(args: argparse.Namespace) -> dict:
    """The logprobs/penalty fields every request gets (``--logprobs`` etc.; none by default)."""
    extras: dict = {}
    if args.logprobs is not None:
        extras.update(logprobs=True, top_logprobs=args.logprobs)
    for name in ("frequency_penalty", "presence_penalty", "repetition_penalty"):
        value = getattr(args, name)
        if value is not None:
            extras[name] = value
    if args.logit_bias:
        extras["logit_bias"] = {str(7 * i): 0.5 for i in range(args.logit_bias)}
    if args.min_tokens:
        extras["min_tokens"] = args.min_tokens  # cut to each request's max_tokens
    return extras


def kernel_profile(generate: object, workload: Workload, max_tokens: int) -> list[list]:
    """GPU kernel time by kernel (torch.profiler) over the workload cut to ``max_tokens`` outputs,
    each prompt reversed: no prefix in common with the timed runs, so its prefill is computed
    (``--kernel-profile 2`` profiles prefill, a large N decode)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cut = Workload([p[::-1] for p in workload.prompts], [min(n, max_tokens) for n in workload.max_tokens])
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        elapsed, _ = generate(cut)  # type: ignore[operator]
    rows = []
    for event in prof.key_averages():
        device_us = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0)
        if device_us > 0:
            rows.append([event.key[:90], event.count, device_us / 1e3])
    rows.sort(key=lambda r: -r[2])
    total_ms = sum(r[2] for r in rows)
    print(
        f"kernel profile: {cut.num_output_tokens} tokens in {elapsed:.2f} s, GPU kernel time {total_ms:.0f} ms"
    )
    for name, count, ms in rows[:25]:
        print(f"  {ms:9.1f} ms {100 * ms / total_ms:5.1f}% {count:7d}x  {name}")
    torch.cuda.synchronize()
    return rows[:60]


def free_gpu_memory() -> None:
    """Collect the dropped engine (its objects form cycles) and hand its memory back to the
    driver, so the next variant sizes its KV pool from the same free memory as the first."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def run_hf(args: argparse.Namespace, workload: Workload) -> dict:
    """transformers' continuous batching (ContinuousBatchingManager) on the same workload."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.generation import GenerationConfig

    config = AutoConfig.from_pretrained(args.model)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = AutoModelForCausalLM.from_config(
            config, dtype=torch.bfloat16, attn_implementation=args.hf_attention
        )
    model.eval()
    # NOTE: EOS is ignored by naming a token id the model can never sample.
    never = int(config.vocab_size) + 7
    gen_config = GenerationConfig(
        do_sample=args.temperature > 0,
        temperature=args.temperature or None,
        max_new_tokens=max(workload.max_tokens),
        eos_token_id=never,
        pad_token_id=0,
    )

    def generate(w: Workload) -> tuple[float, int]:
        manager = model.init_continuous_batching(generation_config=gen_config)
        manager.start()
        _sync()
        start = time.perf_counter()
        for i, (ids, n) in enumerate(zip(w.prompts, w.max_tokens, strict=True)):
            manager.add_request(ids, request_id=str(i), max_new_tokens=n, eos_token_id=never)
        generated, done = 0, 0
        while done < len(w.prompts):
            out = manager.get_result(timeout=600)
            if out is None:
                raise RuntimeError(f"transformers CB returned nothing after {done} results")
            if out.error:
                raise RuntimeError(f"request {out.request_id}: {out.error}")
            generated += len(out.generated_tokens)
            done += 1
        _sync()
        elapsed = time.perf_counter() - start
        manager.stop(block=True)
        return elapsed, generated

    generate(warmup_workload())
    elapsed, generated = generate(workload)
    return {
        "engine": f"transformers-cb ({args.hf_attention})",
        "seconds": elapsed,
        "output_tokens": generated,
    }


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def print_step_profile(engine: str, profile: dict) -> None:
    """One line per step kind: p50/p90 (ms) of host work, GPU pass time and host waits."""
    print(f"step profile of {engine} ({profile['steps']} steps; p50/p90 ms)")
    for kind in ("prefill", "decode", "decode_full"):
        row = profile.get(kind)
        if not row:
            continue
        cells = [
            f"{name} {row[name].get('p50', float('nan')):.3f}/{row[name].get('p90', float('nan')):.3f}"
            for name in ("launch_ms", "process_ms", "host_ms", "wait_ms", "gpu_ms")
        ]
        sums = f"host sum {row['host_ms'].get('sum', 0) / 1e3:.2f} s, gpu sum {row['gpu_ms'].get('sum', 0) / 1e3:.2f} s"
        label = f"decode@{row['batch_size']}" if kind == "decode_full" else kind  # the full-batch steps
        print(f"  {label:<11} n={row['steps']:<5} " + "  ".join(cells) + f"  ({sums})")
    if "gpu_gap_ms" in profile:
        gap = profile["gpu_gap_ms"]
        print(
            f"  GPU idle between passes p50/p90 {gap['p50']:.3f}/{gap['p90']:.3f} ms, sum {gap['sum'] / 1e3:.2f} s;"
            f" GPU busy {100 * profile['gpu_busy_share']:.1f}% of pass time + gaps"
        )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="configs/qwen3-0.6b.json", help="config.json (dummy) or model dir")
    parser.add_argument("--peer", choices=["radixq", "hf"], default="radixq")
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--load-format", default="dummy")
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument(
        "--cache", choices=["radix", "naive"], default="radix", help="naive: no prefix sharing"
    )
    parser.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--cuda-graph", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--attention", default="auto", help="auto | flashinfer | torch")
    parser.add_argument("--max-running-reqs", type=int, default=256)
    parser.add_argument("--hf-attention", default="sdpa", help="transformers attn_implementation")
    parser.add_argument("--variants", default="default", help=f"comma list of {sorted(VARIANTS)}")
    parser.add_argument("--mem-fraction", type=float, default=None, help="EngineConfig.mem_fraction")
    parser.add_argument("--num-pages", type=int, default=None, help="EngineConfig.num_pages (fixed KV pool)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=0,
        help="interleave: every variant's engine kept, N rounds of one run each in turn (median of N);"
        " needs --num-pages (the engines share the GPU)",
    )
    parser.add_argument("--profile-steps", action="store_true", help="per-step host/GPU breakdown")
    parser.add_argument(
        "--kernel-profile", type=int, default=0, help="also profile GPU kernels over outputs cut to N tokens"
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="timed runs per variant (fresh prompt ids each; the median counts)",
    )
    parser.add_argument(
        "--json-schema", default=None, help="a JSON schema file: structured output on every request"
    )
    parser.add_argument("--max-tokens", type=int, default=None, help="cap every request's max_tokens")
    parser.add_argument("--out", default=None, help="write the result as JSON here")
    extras = parser.add_argument_group("per-request sampling extras (radixq only; off by default)")
    extras.add_argument(
        "--logprobs", type=int, default=None, metavar="K", help="logprobs with K top_logprobs (0-20)"
    )
    extras.add_argument("--frequency-penalty", type=float, default=None)
    extras.add_argument("--presence-penalty", type=float, default=None)
    extras.add_argument("--repetition-penalty", type=float, default=None)
    extras.add_argument(
        "--logit-bias", type=int, default=0, metavar="N", help="bias N token ids (0, 7, 14, ...) by 0.5"
    )
    extras.add_argument("--min-tokens", type=int, default=0, help="min_tokens (EOS masked until then)")
    args = parser.parse_args()
    args.schema = json.loads(Path(args.json_schema).read_text()) if args.json_schema else None
    if args.schema is not None and args.peer == "hf":
        parser.error("--json-schema runs radixq only (--peer hf has no structured output here)")
    return args


def main() -> None:
    args = parse_args()
    workload = standard_workload(args.num_requests)
    if args.max_tokens is not None:
        workload = Workload(workload.prompts, [min(n, args.max_tokens) for n in workload.max_tokens])
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if args.rounds:
        if not args.num_pages:
            raise SystemExit(
                "--rounds keeps every variant's engine at once: give --num-pages (20000 holds the standard workload)"
            )
        results = run_interleaved(args, workload, variants)
    else:
        results = [run_radixq(args, workload, v) for v in variants]
    if args.peer == "hf":
        results.append(run_hf(args, workload))
    for result in results:
        if result["output_tokens"] != workload.num_output_tokens and args.schema is None:
            raise RuntimeError(
                f"{result['engine']}: generated {result['output_tokens']} tokens, expected {workload.num_output_tokens}"
            )
        result["prompt_tokens"] = workload.num_prompt_tokens
        result["tok_per_s"] = result["output_tokens"] / result["seconds"]
        print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    for result in results:
        if "step_profile" in result:
            print_step_profile(result["engine"], result["step_profile"])
    for result in results:
        if "eager" in result:
            print(f"{result['engine']}: graphs to {result['graph_max_bs']}; {result['eager']}")
    base = results[0]["tok_per_s"]
    schema = f", JSON schema {args.json_schema}" if args.json_schema else ""
    print(
        f"model {args.model}, {len(workload.prompts)} requests, temperature {args.temperature}{schema}"
        + (f", {sampling_extras(args)}" if sampling_extras(args) else "")
    )
    print(f"{'engine':<28} {'seconds':>8} {'tok/s':>9} {'vs first':>8}")
    for result in results:
        print(
            f"{result['engine']:<28} {result['seconds']:>8.2f} {result['tok_per_s']:>9.0f} "
            f"{result['tok_per_s'] / base:>8.3f}"
        )


if __name__ == "__main__":
    main()
