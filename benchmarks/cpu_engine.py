"""radixq vs transformers ``generate`` on CPU: output tokens/s for the same prompts and lengths.

Both sides run the same weights (SmolLM2-135M-Instruct by default), greedy, exactly
``--max-tokens`` new tokens per prompt (EOS ignored), all prompts in one batch (HF: left
padding). Checks that the two agree on the tokens of the first prompt.

    python benchmarks/cpu_engine.py --prompts 16 --max-tokens 32
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402

from producer.schema import SamplingParams  # noqa: E402
from worker.llm import LLM  # noqa: E402
from worker.models.registry import DEFAULT_MODEL  # noqa: E402

TOPICS = ["the ocean", "a robot", "bread", "the moon", "trains", "music", "winter", "a library"]


def make_prompts(count: int) -> list[str]:
    return [f"Write a short story about {TOPICS[i % len(TOPICS)]} and the number {i}." for i in range(count)]


def run_radixq(llm: LLM, prompt_ids: list[list[int]], max_tokens: int) -> tuple[float, list[list[int]]]:
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    llm.generate(prompt_ids[:2], SamplingParams(max_tokens=2, temperature=0.0))  # warm-up
    start = time.perf_counter()
    results = llm.generate(prompt_ids, sampling)
    elapsed = time.perf_counter() - start
    return elapsed, [r.choices[0].token_ids for r in results]


def run_hf(model_dir: str, prompt_ids: list[list[int]], max_tokens: int) -> tuple[float, list[list[int]]]:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    width = max(len(p) for p in prompt_ids)
    ids = torch.zeros(len(prompt_ids), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompt_ids):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    kwargs = dict(do_sample=False, max_new_tokens=max_tokens, min_new_tokens=max_tokens, pad_token_id=0)
    with torch.no_grad():
        hf.generate(ids[:2], attention_mask=mask[:2], **{**kwargs, "max_new_tokens": 2, "min_new_tokens": 2})
        start = time.perf_counter()
        out = hf.generate(ids, attention_mask=mask, **kwargs)
        elapsed = time.perf_counter() - start
    return elapsed, out[:, width:].tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()

    llm = LLM(args.model, device="cpu", page_size=args.page_size, overlap=args.overlap, max_seq_len=1024)
    prompt_ids = [llm.encode([{"role": "user", "content": p}]) for p in make_prompts(args.prompts)]
    radixq_s, radixq_tokens = run_radixq(llm, prompt_ids, args.max_tokens)
    hf_s, hf_tokens = run_hf(str(llm.engine.loaded.path), prompt_ids, args.max_tokens)
    total = args.prompts * args.max_tokens
    report = {
        "model": llm.engine.loaded.name,
        "threads": torch.get_num_threads(),
        "prompts": args.prompts,
        "max_tokens": args.max_tokens,
        "prompt_tokens": sum(len(p) for p in prompt_ids),
        "radixq_s": round(radixq_s, 3),
        "radixq_output_tok_s": round(total / radixq_s, 1),
        "hf_generate_s": round(hf_s, 3),
        "hf_output_tok_s": round(total / hf_s, 1),
        "speedup": round(hf_s / radixq_s, 2),
        "first_prompt_tokens_equal": radixq_tokens[0] == hf_tokens[0],
        "prompts_with_equal_tokens": sum(a == b for a, b in zip(radixq_tokens, hf_tokens, strict=True)),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
