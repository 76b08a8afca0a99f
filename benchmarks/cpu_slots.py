"""How many requests a CPU worker should run at once: output tokens/s and time to the first
finished job for each ``max_running_reqs``, same prompts, greedy, ``--max-tokens`` each.

A CPU worker holds as many jobs as it runs at once (read_window 0); a bigger number only
pays if throughput still grows, since the jobs it holds wait on it while siblings idle.

    python benchmarks/cpu_slots.py --prompts 32 --max-tokens 32 --slots 1 4 8 16 32
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

from wire.schema import SamplingParams  # noqa: E402
from worker.llm import LLM  # noqa: E402
from worker.models.aliases import DEFAULT_MODEL  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--slots", type=int, nargs="+", default=[1, 4, 8, 16, 32])
    parser.add_argument("--max-seq-len", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    prompts = [f"Write a short story about the number {i} and a cat." for i in range(args.prompts)]
    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    rows = []
    for slots in args.slots:
        llm = LLM(
            args.model,
            device="cpu",
            max_running_reqs=slots,
            max_prefill_tokens=2048,
            max_seq_len=args.max_seq_len,
        )
        llm.generate(prompts[:2], SamplingParams(max_tokens=2, temperature=0.0))  # warm-up
        start = time.perf_counter()
        results = llm.generate(prompts, sampling)
        elapsed = time.perf_counter() - start
        tokens = sum(len(r.choices[0].token_ids) for r in results)
        row = {
            "max_running_reqs": slots,
            "seconds": round(elapsed, 2),
            "output_tok_s": round(tokens / elapsed, 1),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
        del llm
    print(
        json.dumps(
            {"threads": torch.get_num_threads(), "prompts": args.prompts, "max_tokens": args.max_tokens}
        )
    )


if __name__ == "__main__":
    main()
