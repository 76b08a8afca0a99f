"""Latency of short jobs queued behind one long prompt, and of a job already decoding.

A job is decoding (``--decode-tokens`` new tokens); a ``--long-tokens`` prompt arrives, then,
one step later, ``--short-jobs`` jobs of a short prompt and one new token each. Reports when
each short job finished and the longest wait between two tokens of the decoding job, on the
tiny dummy Llama of benchmarks/prefix_sched.py (CPU) or a ``--model`` config.json.

    python benchmarks/short_behind_long.py --long-tokens 8180 --max-prefill-tokens 1024
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from benchmarks.prefix_sched import tiny_model_path  # noqa: E402
from wire.schema import SamplingParams  # noqa: E402
from worker.llm import LLM  # noqa: E402
from worker.scheduler.messages import GenerateRequest, RequestFinished  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--model", default=None, help="config.json for dummy weights (default: tiny Llama)")
    parser.add_argument("--long-tokens", type=int, default=8180)
    parser.add_argument("--short-jobs", type=int, default=4)
    parser.add_argument("--decode-tokens", type=int, default=48)
    parser.add_argument("--max-prefill-tokens", type=int, default=1024)
    args = parser.parse_args()
    options: dict = {
        "device": args.device,
        "load_format": "dummy",
        "max_prefill_tokens": args.max_prefill_tokens,
    }
    if args.device == "cpu":
        options["attention"] = "torch"
    llm = LLM(args.model or tiny_model_path(), **options)
    rng = random.Random(0)
    scheduler, io = llm.scheduler, llm.io

    def put(uid: str, length: int, max_tokens: int) -> None:
        prompt = [rng.randint(1, 400) for _ in range(length)]
        sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        io.put(GenerateRequest(uid=uid, input_ids=prompt, sampling=sampling))

    put("decoding", 16, args.decode_tokens)
    last = None
    for _ in range(3):
        last = scheduler.step(last, block=False)
    start = time.perf_counter()
    put("long", args.long_tokens, 1)
    last = scheduler.step(last, block=False)  # the long prompt's first chunk
    for i in range(args.short_jobs):
        put(f"short-{i}", 16, 1)
    done: dict[str, float] = {}
    done_step: dict[str, int] = {}
    token_times: list[float] = []
    decoding_len = 0
    step = 0
    while not (last is None and scheduler.idle):
        last = scheduler.step(last, block=False)
        step += 1
        now = time.perf_counter() - start
        running = [r for r in scheduler.decode.running if r.pending.group.uid == "decoding"]
        if running and len(running[0].output_ids) > decoding_len:
            decoding_len = len(running[0].output_ids)
            token_times.append(now)
        for message in io.take_all():
            if isinstance(message, RequestFinished):
                done[message.uid] = round(now, 2)
                done_step[message.uid] = step
    gaps = [b - a for a, b in zip(token_times, token_times[1:], strict=False)]
    report = {
        "long_tokens": args.long_tokens,
        "max_prefill_tokens": args.max_prefill_tokens,
        "finished_s": done,
        "finished_step": done_step,  # steps after the long prompt's arrival
        "short_job_latency_s_max": max(v for k, v in done.items() if k.startswith("short")),
        "decoding_job_longest_gap_s": round(max(gaps), 2) if gaps else None,
        "steps": scheduler.stats.steps,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
