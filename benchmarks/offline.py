"""The standard offline throughput benchmark (as nano-vllm and Mini-SGLang run it).

256 requests; ``random.seed(0)``; each prompt is ``randint(100, 1024)`` random token ids in
[0, 10000], all prompts drawn first, then ``max_tokens = randint(100, 1024)`` for every
request; EOS ignored. That is 142,827 prompt and 133,966 output tokens. The figure is output
tokens / wall seconds of the timed run, after a warm-up run.

    python benchmarks/offline.py --model configs/qwen3-0.6b.json              # radixq, dummy weights
    python benchmarks/offline.py --model configs/qwen3-0.6b.json --peer hf    # transformers CB

Engine switches (``--no-overlap``, ``--no-cuda-graph``, ``--cache naive``, ``--attention``,
``--page-size``) are EngineConfig options passed to ``worker.LLM``. PLACEHOLDER: the engine
honours them only as far as it has landed; as of stage 1, ``Engine.graph_runner`` is None (CUDA
graphs not wired yet) and overlap scheduling depends on the scheduler engineer's loop. The
report prints the options passed, so each figure names the path it measured.
"""

from __future__ import annotations

import argparse
import json
import random
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


def warmup_workload() -> Workload:
    """A few short requests that touch prefill, decode and sampling before timing."""
    return Workload([[i + 1] * (64 + 32 * i) for i in range(8)], [32] * 8)


def run_radixq(args: argparse.Namespace, workload: Workload) -> dict:
    from producer.schema import SamplingParams
    from worker import LLM

    options = {
        "load_format": args.load_format,
        "page_size": args.page_size,
        "cache": args.cache,
        "overlap": args.overlap,
        "cuda_graph": args.cuda_graph,
        "attention": args.attention,
        "max_running_reqs": args.max_running_reqs,
    }
    llm = LLM(args.model, **options)

    def generate(w: Workload) -> tuple[float, int]:
        params = [
            SamplingParams(max_tokens=n, temperature=args.temperature, ignore_eos=True) for n in w.max_tokens
        ]
        _sync()
        start = time.perf_counter()
        results = llm.generate(w.prompts, params)
        _sync()
        elapsed = time.perf_counter() - start
        errors = [r.error for r in results if r.error is not None]
        if errors:
            raise RuntimeError(f"{len(errors)} requests failed, first: {errors[0]}")
        return elapsed, sum(len(r.choices[0].token_ids) for r in results)

    generate(warmup_workload())
    elapsed, generated = generate(workload)
    return {"engine": "radixq", "options": options, "seconds": elapsed, "output_tokens": generated}


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


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="configs/qwen3-0.6b.json", help="config.json (dummy) or model dir")
    parser.add_argument("--peer", choices=["radixq", "hf"], default="radixq")
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--load-format", default="dummy")
    parser.add_argument("--page-size", type=int, default=1)
    parser.add_argument(
        "--cache", choices=["radix", "naive"], default="radix", help="naive: no prefix sharing"
    )
    parser.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--cuda-graph", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--attention", default="auto", help="auto | flashinfer | torch")
    parser.add_argument("--max-running-reqs", type=int, default=256)
    parser.add_argument("--hf-attention", default="sdpa", help="transformers attn_implementation")
    parser.add_argument("--out", default=None, help="write the result as JSON here")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    workload = standard_workload(args.num_requests)
    result = run_hf(args, workload) if args.peer == "hf" else run_radixq(args, workload)
    if result["output_tokens"] != workload.num_output_tokens:
        raise RuntimeError(
            f"generated {result['output_tokens']} tokens, expected {workload.num_output_tokens}"
        )
    result["prompt_tokens"] = workload.num_prompt_tokens
    result["tok_per_s"] = result["output_tokens"] / result["seconds"]
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    print(
        f"{result['engine']}: {result['output_tokens']} tokens in {result['seconds']:.2f} s = "
        f"{result['tok_per_s']:.0f} tok/s"
    )


if __name__ == "__main__":
    main()
