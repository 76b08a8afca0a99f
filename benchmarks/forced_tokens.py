"""How much jump-forward decoding could save: the share of structured-output tokens that were forced.

Generates JSON for a few chat prompts under one JSON schema (SmolLM2-135M-Instruct on CPU by
default, greedy), then replays every completion through a fresh grammar matcher and counts the
tokens whose bitmask allowed exactly one token: those needed no sampling, so at most that
share of decode steps could be skipped by jump-forward decoding (fewer in practice: forced text
is retokenized, and a jump costs an extend step).

    python benchmarks/forced_tokens.py --json-schema benchmarks/record_schema.json --prompts 8
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TOPICS = ["a novel", "a physics book", "a cookbook", "a poem collection", "a history of Rome", "a diary"]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json-schema", default="benchmarks/record_schema.json")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()

    import torch

    from wire.schema import SamplingParams
    from worker import LLM

    schema = json.loads(Path(args.json_schema).read_text())
    llm = LLM(args.model, device=args.device, attention="torch" if args.device == "cpu" else "auto")
    prompts = [
        [
            {
                "role": "user",
                "content": f"Describe {TOPICS[i % len(TOPICS)]} (number {i}) as JSON: {json.dumps(schema)}",
            }
        ]
        for i in range(args.prompts)
    ]
    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, json_schema=schema)
    start = time.perf_counter()
    results = llm.generate(prompts, sampling)
    elapsed = time.perf_counter() - start
    grammars = llm.scheduler.grammar_waits.grammars
    assert grammars is not None
    compiled = grammars.compile(sampling)
    total = forced = 0
    reasons: dict[str, int] = {}
    for result in results:
        choice = result.choices[0]
        reasons[choice.finish_reason] = reasons.get(choice.finish_reason, 0) + 1
        matcher = grammars.matcher(compiled)
        for token in choice.token_ids:
            bitmask = grammars.token_bitmask([matcher])
            assert bitmask is not None
            bits = (bitmask[0].unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
            allowed = int(bits.reshape(-1)[: grammars.vocab_size].sum())
            total += 1
            forced += allowed == 1
            matcher.accept(token)
    print(
        json.dumps(
            {
                "model": args.model,
                "prompts": args.prompts,
                "finish_reasons": reasons,
                "output_tokens": total,
                "forced_tokens": forced,
                "forced_share": round(forced / max(total, 1), 3),
                "seconds": round(elapsed, 2),
                "tok_per_s": round(total / elapsed, 1),
                "torch_threads": torch.get_num_threads(),
            }
        )
    )


if __name__ == "__main__":
    main()
